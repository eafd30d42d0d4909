"""`python -m train.mine` (flax_encoder.mining over flax_encoder.search) against
sentence-transformers' `mine_hard_negatives` on the same folder and lines: the same negatives
for the same anchors, and their scores."""

import json
import subprocess
import sys

import numpy as np
import pytest

from flax_encoder import mining
from tests import runs
from train.errors import RunError
from train.outputs import mine


def topic_pairs() -> tuple[list[tuple[str, str]], list[str]]:
  """Real text: 60 pairs (a pydoc topic's name, one of its paragraphs), every 10th paragraph,
  several a topic; and 60 more paragraphs, every 10th from the 5th on, more corpus."""
  from benchmarks.finetune_packed import paragraphs
  texts, topics = paragraphs()
  pairs = [(topic.replace("-", " "), text) for i, (text, topic) in enumerate(zip(texts, topics))
           if i % 10 == 0]
  return pairs[:60], texts[5::10][:60]


def _theirs(model: str, pairs, corpus, **options) -> dict:
  """(anchor, positive) -> (negatives, scores: the positive's, then the negatives') of
  sentence-transformers' labeled-list output."""
  pytest.importorskip("datasets", reason="sentence-transformers' mining takes a Dataset")
  from datasets import Dataset
  from sentence_transformers import SentenceTransformer
  from sentence_transformers.util import mine_hard_negatives
  dataset = Dataset.from_dict({"anchor": [a for a, _ in pairs],
                               "positive": [p for _, p in pairs]})
  cross = options.pop("cross_encoder", None)
  if cross is not None:
    from sentence_transformers import CrossEncoder
    cross = CrossEncoder(cross, device="cpu")
  mined = mine_hard_negatives(dataset, SentenceTransformer(model, device="cpu"), corpus=corpus,
                              output_format="labeled-list", output_scores=True, verbose=False,
                              cross_encoder=cross, **options)
  return {(row["anchor"], row["positive"][0]): (row["positive"][1:], row["scores"])
          for row in mined}


@pytest.fixture(scope="module")
def minilm():
  pytest.importorskip("sentence_transformers")
  from tests.published import all_minilm_l6_v2
  return all_minilm_l6_v2()


SLOW = pytest.mark.slow  # the published model, theirs and ours, again


@pytest.mark.parametrize("options", [
    {},
    pytest.param({"num_negatives": 5, "range_min": 2, "range_max": 30}, marks=SLOW),
    pytest.param({"absolute_margin": 0.05, "max_score": 0.6}, marks=SLOW),
    pytest.param({"relative_margin": 0.1, "num_negatives": 2}, marks=SLOW),
], ids=["defaults", "range", "margin-and-bound", "relative-margin"])
def test_the_negatives_are_sentence_transformers(minilm, options):
  pairs, corpus = topic_pairs()
  want = _theirs(minilm, pairs, corpus, **options)
  got = mine.mine(minilm, pairs, corpus, **options)
  written = {(line["anchor"], line["positive"]): line for line in got if line is not None}
  assert set(written) == set(want) and len(want) >= 20  # lines left with a negative
  for key, (negatives, scores) in want.items():
    assert written[key]["negative"] == negatives, key
    np.testing.assert_allclose(written[key]["scores"], scores, atol=2e-6)


@SLOW
def test_a_reranker_scores_the_candidates_as_cross_encoder_does(minilm, tmp_path):
  pytest.importorskip("torch")
  from tests import hf_models
  scorer = hf_models.write(tmp_path / "ce", "bert", head="sequence_classification", num_labels=1)
  pairs, corpus = topic_pairs()
  pairs = pairs[:30]
  options = {"num_negatives": 2, "min_score": 0.3}
  want = _theirs(minilm, pairs, corpus, cross_encoder=scorer, **options)
  got = mine.mine(minilm, pairs, corpus, scorer=scorer, **options)
  written = {(line["anchor"], line["positive"]): line for line in got if line is not None}
  assert set(written) == set(want) and want
  for key, (negatives, scores) in want.items():
    np.testing.assert_allclose(written[key]["scores"], scores, atol=1e-5)
    assert written[key]["negative"] == negatives, key


def test_random_sampling_draws_from_the_range_best_first_and_again_the_same():
  scores = np.array([[0.9, 0.8, 0.7, 0.6, 0.5, 0.4]], np.float32)
  ids = np.array([[0, 1, 2, 3, 4, 5]])
  kept, kept_scores = mining.hard_negatives(scores, ids, [[0]], [np.array([1.0])], np.array([-1]),
                                            range_max=5, num_negatives=2, sampling="random")
  again = mining.hard_negatives(scores, ids, [[0]], [np.array([1.0])], np.array([-1]),
                                range_max=5, num_negatives=2, sampling="random")
  np.testing.assert_array_equal(kept, again[0])
  # the positive (0) left out, the 5 best of the rest drawn from; ids 1 to 5
  assert set(kept[0]) <= {1, 2, 3, 4, 5} and kept_scores[0, 0] > kept_scores[0, 1]
  seen = {int(i) for seed in range(20) for i in mining.hard_negatives(
      scores, ids, [[0]], [np.array([1.0])], np.array([-1]), range_max=5, num_negatives=2,
      sampling="random", seed=seed)[0][0]}
  assert seen == {1, 2, 3, 4, 5}


@SLOW
def test_the_command_writes_the_lines_in_input_order_and_refuses_bad_options(minilm, tmp_path):
  pairs, _ = topic_pairs()
  pairs = pairs[:30]
  source = tmp_path / "pairs.jsonl"
  source.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in pairs))
  out = tmp_path / "mined.jsonl"
  done = subprocess.run([sys.executable, "-m", "train.mine", "--model", minilm, "--input",
                         str(source), "--out", str(out), "--num-negatives", "2"],
                        cwd=runs.ROOT, env=runs.environment(1), capture_output=True, text=True,
                        timeout=runs.limit(300), check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = [json.loads(line) for line in out.read_text().splitlines()]
  assert [(line["anchor"], line["positive"]) for line in lines] == pairs
  assert all(len(line["negative"]) == 2 and "scores" not in line for line in lines)
  assert all(n != line["positive"] for line in lines for n in line["negative"])
  assert done.stdout == f"{out}: 30 lines, 60 negatives\n"
  with pytest.raises(RunError, match=r"^--num-negatives 9, but only 5 candidates lie between "
                     r"--range-min 0 and --range-max 5"):
    mine.mine(minilm, pairs, num_negatives=9, range_max=5)
  (tmp_path / "bad.jsonl").write_text('{"anchor": "a", "positive": 3}\n')
  with pytest.raises(RunError, match=r"bad.jsonl:1: 'positive' \(--positive-field\): got 3, "
                     r"expected a non-empty string"):
    mine.read_pairs(str(tmp_path / "bad.jsonl"), "anchor", "positive")


def test_a_beir_folders_judged_pairs_are_mined_from_its_whole_corpus(tmp_path):
  import shutil

  from tests.test_evaluate import write_beir
  folder = write_beir(tmp_path / "set", ["d zero", "d one", "d two"], ["q zero", "q one"],
                      {"q0": {"d1": 1, "d2": 0}, "q1": {"d0": 2, "d2": 1}})
  shutil.copy(tmp_path / "set" / "qrels" / "test.tsv", tmp_path / "set" / "qrels" / "train.tsv")
  pairs, corpus = mine.beir_pairs(folder, "train")
  assert pairs == [("q zero", "d one"), ("q one", "d zero"), ("q one", "d two")]
  assert corpus == ["d zero", "d one", "d two"]
  (tmp_path / "set" / "qrels" / "dev.tsv").write_text("q0\td2\t0\n")
  with pytest.raises(RunError, match=r"no relevant \(query, document\) pair in qrels/dev.tsv"):
    mine.beir_pairs(folder, "dev")
