"""Distillation in the contrastive task (config.task.loss = margin_mse, kl): each loss equal to
sentence-transformers' on the same embeddings and teacher scores, and a run that reads a
teacher's scores from its lines, trains and resumes exactly."""

import json
import os

import numpy as np
import pytest

from tests import runs
from tests.test_contrastive import TOPICS, _config, _text, hf_dir  # noqa: F401 (a fixture)
from train.errors import RunError
from train.tasks.contrastive import DistillationLoss

B, D = 6, 8


def _embeddings(seed: int = 0):
  rng = np.random.default_rng(seed)
  return [rng.normal(size=(B, D)).astype(np.float32) for _ in range(3)]


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.mark.parametrize("normalize", [False, True])
def test_margin_mse_is_sentence_transformers_on_the_same_embeddings_and_scores(normalize):
  torch = pytest.importorskip("torch")
  pytest.importorskip("sentence_transformers")
  from sentence_transformers.sentence_transformer.losses import MarginMSELoss
  a, p, n = _embeddings()
  teacher = np.random.default_rng(1).normal(size=(B, 2)).astype(np.float32)
  theirs = MarginMSELoss(model=None)
  columns = [torch.from_numpy(_unit(x) if normalize else x) for x in (a, p, n)]
  ours = float(DistillationLoss("margin_mse", normalize)(a, p, n, teacher)) / B  # a sum
  # the teacher's two scores, or their margin alone: the same loss
  for labels in (teacher, teacher[:, 0] - teacher[:, 1]):
    want = float(theirs.compute_loss_from_embeddings(columns, torch.from_numpy(labels)))
    assert ours == pytest.approx(want, rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("temperature", [1.0, 0.5, 3.0])
def test_kl_is_sentence_transformers_at_each_temperature(temperature):
  torch = pytest.importorskip("torch")
  pytest.importorskip("sentence_transformers")
  from sentence_transformers.sentence_transformer.losses import DistillKLDivLoss
  a, p, n = _embeddings(2)
  teacher = (4 * np.random.default_rng(3).normal(size=(B, 2))).astype(np.float32)
  theirs = DistillKLDivLoss(model=None, temperature=temperature)
  want = float(theirs.compute_loss_from_embeddings(
      [torch.from_numpy(_unit(x)) for x in (a, p, n)], torch.from_numpy(teacher)))
  ours = float(DistillationLoss("kl", True, temperature)(a, p, n, teacher)) / B
  assert ours == pytest.approx(want, rel=1e-6, abs=1e-7)


def _scored_pairs(path, rng, lines: int, broken: int | None = None) -> str:
  """Lines of a topic's anchor and positive, the next topic's text as negative, and a teacher's
  scores: higher for the positive, by a margin that varies."""
  with open(path, "w") as f:
    for i, topic in enumerate(rng.choice(TOPICS, lines)):
      negative = _text(rng, TOPICS[(TOPICS.index(topic) + 1) % len(TOPICS)])
      line = {"anchor": _text(rng, topic), "positive": _text(rng, topic),
              # as python -m train.mine writes them, every other line
              "negative": [negative] if i % 2 else negative,
              "scores": [float(rng.uniform(0.6, 1.0)), float(rng.uniform(0.0, 0.4))]}
      if i == broken:
        del line["scores"]
      f.write(json.dumps(line) + "\n")
  return str(path)


@pytest.fixture(scope="module")
def scored_pairs(tmp_path_factory):
  from tests.test_contrastive import _write_pairs
  directory, rng = tmp_path_factory.mktemp("scored"), np.random.default_rng(0)
  return (_scored_pairs(directory / "train.jsonl", rng, 160),
          _write_pairs(directory / "eval.jsonl", rng.choice(TOPICS, 24, replace=False), rng))


@pytest.mark.parametrize("loss", ["margin_mse", "kl"])
def test_a_distillation_run_reads_the_scores_trains_and_resumes_exactly(scored_pairs, hf_dir,
                                                                        tmp_path, capfd, loss):
  from train.tasks.contrastive import load_pairs
  config = _config(scored_pairs, hf_dir, **{
      "task.loss": loss, "task.temperature": 0.5, "train.num_steps": 8,
      "train.checkpoint_every": 4, "train.eval_every": 4, "train.log_every": 1,
      "train.keep_checkpoints": 2})
  straight, resumed = runs.straight_and_resumed(config, tmp_path, capfd)
  assert runs.losses(resumed) == runs.losses(straight)
  teacher = load_pairs(os.path.join(straight, "data"))["train"]["teacher"]
  with open(scored_pairs[0]) as f:
    want = [json.loads(line)["scores"] for line in f]
  np.testing.assert_array_equal(teacher, np.asarray(want, np.float32))
  losses = [loss for _, loss in sorted(runs.losses(straight).items())]
  assert all(np.isfinite(losses)) and np.mean(losses[-3:]) < np.mean(losses[:3])


def test_a_line_without_scores_and_a_ranking_option_are_one_line(scored_pairs, hf_dir, tmp_path):
  from train import loop
  from train.tasks import contrastive
  broken = _scored_pairs(tmp_path / "broken.jsonl", np.random.default_rng(1), 20, broken=7)
  config = _config((broken, scored_pairs[1]), hf_dir, **{"task.loss": "margin_mse"})
  with pytest.raises(RunError, match=r"broken.jsonl:8: neither, expected 'scores': the "
                     r"teacher's scores of the positive and the negative, or 'label': the "
                     r"margin \(config.task.loss='margin_mse'\)"):
    loop.run(config, str(tmp_path / "run"))
  two = tmp_path / "two.jsonl"
  two.write_text(json.dumps({"anchor": "a b", "positive": "a c", "negative": ["d", "e"],
                             "scores": [1, 0.5, 0.2]}) + "\n")
  config = _config((str(two), scored_pairs[1]), hf_dir, **{"task.loss": "kl"})
  with pytest.raises(RunError, match=r"two.jsonl:1: 'negative': a list of 2, expected one text "
                     r"\(this task takes one negative a line: mine with --num-negatives 1\)"):
    loop.run(config, str(tmp_path / "run2"))
  config = _config(scored_pairs, hf_dir, **{"task.loss": "kl", "task.symmetric": True})
  with pytest.raises(RunError, match=r"^config.task.symmetric: True with config.task.loss='kl', "
                     r"expected False"):
    contrastive.check(config)
