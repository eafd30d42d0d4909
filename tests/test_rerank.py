"""Reranker fine-tuning (train.tasks.rerank): its losses and ranking metrics against numpy's
formulas, and a run from a tiny Hugging Face model that reranks held-out candidates better
than the first stage and its start, resumes bit for bit, predicts pairs, and exports a
directory sentence-transformers' CrossEncoder loads with the run's scores."""

import json
import os

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from configs import rerank as rerank_config
from tests import runs
from train.tasks.rerank import RerankTask, _ranks, ranking_sums

# a query's relevant documents are made of the characters it is made of
CLASSES = ("0123456789", "abcdefghij", "+-*/=<>!?%")


def test_ranks_and_metrics_of_hand_made_scores():
  scores = jnp.array([[0.1, 0.9, 0.5, 0.5], [3.0, 2.0, 1.0, 0.0]])
  present = jnp.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
  ranks = _ranks(scores, present)
  # ties go to the earlier candidate; an absent one ranks after every present one
  np.testing.assert_array_equal(ranks, [[4, 1, 2, 3], [1, 2, 3, 5]])
  relevant = jnp.array([[1, 0, 0, 1], [0, 0, 1, 0]], bool)
  sums = ranking_sums(ranks, relevant, jnp.array([2, 2]))
  ideal = 1 + 1 / np.log2(3)
  assert float(sums["mrr_at_10"]) == pytest.approx(1 / 3 + 1 / 3)
  # query 0 finds its positives at 3 and 4; query 1 one of its two, at 3
  assert float(sums["ndcg_at_10"]) == pytest.approx(
      (1 / np.log2(4) + 1 / np.log2(5)) / ideal + (1 / np.log2(4)) / ideal)


def test_the_losses_against_numpy():
  logits = np.array([[2.0, 0.5, -1.0], [0.0, 1.0, 3.0]], np.float32)
  labels = np.array([[1, 0, 0], [1, 0, 0]], np.float32)
  present = np.ones_like(logits, bool)
  log_z = np.log(np.exp(logits).sum(1))
  listwise = RerankTask(None, "listwise")._losses(logits, labels, present)
  np.testing.assert_allclose(listwise, log_z - logits[:, 0], rtol=1e-6)
  p = 1 / (1 + np.exp(-logits))
  bce = -(labels * np.log(p) + (1 - labels) * np.log(1 - p)).mean(1)
  np.testing.assert_allclose(RerankTask(None, "bce")._losses(logits, labels, present), bce,
                             rtol=1e-5)
  # a candidate that is not there counts in neither
  present[1, 2] = False
  got = RerankTask(None, "listwise")._losses(logits, labels, present)
  assert float(got[1]) == pytest.approx(np.log(np.exp(logits[1, :2]).sum()) - logits[1, 0])


def _text(rng, chars, words=3):
  return " ".join("".join(rng.choice(list(chars), rng.integers(1, 4))) for _ in range(words))


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
  """(train.jsonl, eval.jsonl): a query of one of CLASSES, its positive of the same, hard
  negatives of the others; held out, 30 queries of 12 candidates in a first stage's order that
  puts the positive 11th."""
  directory, rng = tmp_path_factory.mktemp("rerank"), np.random.default_rng(0)
  with open(directory / "train.jsonl", "w") as f:
    for i in range(192):
      mine = rng.integers(3)
      line = {"query": _text(rng, CLASSES[mine]), "positive": _text(rng, CLASSES[mine])}
      # three hard negatives but on every fourth line, which draws other lines' positives
      others = [c for c in range(3) if c != mine]
      if i % 4:
        line["negative"] = [_text(rng, CLASSES[c]) for c in rng.choice(others, 3)]
      f.write(json.dumps(line) + "\n")
  with open(directory / "eval.jsonl", "w") as f:
    for i in range(30):
      mine = i % 3
      documents = [_text(rng, CLASSES[c]) for c in rng.choice(
          [c for c in range(3) if c != mine], 11)]
      positive = _text(rng, CLASSES[mine])
      documents.insert(10, positive)
      f.write(json.dumps({"query": _text(rng, CLASSES[mine]), "positive": positive,
                          "documents": documents}) + "\n")
  return str(directory / "train.jsonl"), str(directory / "eval.jsonl")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from tests import hf_models
  path = hf_models.write(tmp_path_factory.mktemp("bert"), "bert",
                         head="sequence_classification", num_labels=1)
  # a BERT tokenizer's class, as published BERT rerankers name it: transformers then gives the
  # document's ids token type 1, as the run does (its generic class gives none)
  file = os.path.join(path, "tokenizer_config.json")
  with open(file) as f:
    settings = json.load(f)
  with open(file, "w") as f:
    json.dump({**settings, "tokenizer_class": "BertTokenizer"}, f)
  return path


RUN = {"train.seq_len": 24, "train.batch_size": 8, "train.num_steps": 400,
       "train.eval_every": 200, "train.checkpoint_every": 400, "train.log_every": 10,
       "optim.learning_rate": 3e-3, "optim.warmup_steps": 4, "task.negatives": 3}


def _config(groups, hf_dir, **fields):
  config = rerank_config.get_config()
  config.data.train, config.data.eval = groups
  config.init.hf = hf_dir
  for name, value in {**RUN, **fields}.items():
    section, field = name.split(".")
    config[section][field] = value
  return config


@pytest.fixture(scope="module")
def tuned(groups, hf_dir, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("tuned") / "run")
  overrides = {"data.train": groups[0], "data.eval": groups[1], "init.hf": hf_dir, **RUN}
  return workdir, runs.train(workdir, *[f"--config.{k}={v}" for k, v in overrides.items()],
                             config=os.path.join(runs.ROOT, "configs", "rerank.py"))


def test_fine_tuning_reranks_the_held_out_candidates_better_than_the_start(tuned):
  workdir, result = tuned
  assert result.returncode == 0, result.stderr
  assert "192 training and 30 held-out" in result.stderr
  # a batch of [queries, documents, ids], not packed rows ("8 rows of 4 ids" was said)
  memory = [line for line in result.stderr.splitlines() if line.startswith("memory: ")]
  assert memory and not any("packed" in line for line in memory)
  records = runs.read_metrics(os.path.join(workdir, "metrics.jsonl"))
  start, *_, final = [r for r in records if r["split"] == "eval"]
  print(f"MRR@10 {start['mrr_at_10']:.3f} -> {final['mrr_at_10']:.3f} (first stage "
        f"{final['first_stage_mrr_at_10']:.3f})")
  # the first stage put each positive 11th: outside the top 10
  assert start["first_stage_mrr_at_10"] == final["first_stage_mrr_at_10"] == 0
  assert final["mrr_at_10"] > start["mrr_at_10"] + 0.2  # 12 candidates: random is 0.26
  assert final["ndcg_at_10"] > start["ndcg_at_10"]
  assert final["loss"] < start["loss"]
  assert result.stdout.strip().splitlines()[-1].startswith("step 400: eval MRR@10")


def _pairs_and_scores(workdir, groups, tmp_path):
  """The held-out (query, candidate) pairs, and the run's scores of them by train.predict."""
  pairs = []
  with open(groups[1]) as f:
    for line in map(json.loads, f):
      pairs += [(line["query"], d) for d in line["documents"][:4]]
  # queries that spell the separator: their ids after it are still the query's (token type 0)
  pairs += [(f"{q} [SEP] {q}", d) for q, d in pairs[:8]]
  lines = tmp_path / "pairs.jsonl"
  lines.write_text("".join(json.dumps({"query": q, "document": d, "label": int(i % 4 == 2)})
                           + "\n" for i, (q, d) in enumerate(pairs)))
  out = tmp_path / "scores.jsonl"
  from train.outputs.predict import predict
  assert predict(workdir, str(lines), str(out)).count == len(pairs)
  scored = [json.loads(l) for l in out.read_text().splitlines()]
  return pairs, np.array([s["score"] for s in scored]), np.array([s["logit"] for s in scored])


def test_the_export_is_a_cross_encoder_with_the_runs_scores(tuned, groups, tmp_path):
  st = pytest.importorskip("sentence_transformers")
  workdir, _ = tuned
  pairs, scores, logits = _pairs_and_scores(workdir, groups, tmp_path)
  np.testing.assert_allclose(scores, 1 / (1 + np.exp(-logits)), rtol=1e-6)
  out = str(tmp_path / "reranker")
  from train.outputs.export import main as export
  assert export(["--workdir", workdir, "--layout", "hf", "--out", out]) == 0
  want = st.CrossEncoder(out, device="cpu").predict(pairs)
  np.testing.assert_allclose(scores, want, atol=1e-5)


def test_predict_in_int8_scores_near_the_runs_float_scores(tuned, groups, tmp_path):
  # --quantize int8: the dense layers' kernels in int8 with a scale per output channel, the
  # activations quantized per token (qwix); the logits follow the float ones closely.
  pytest.importorskip("qwix")
  from train.outputs.predict import main, predict
  workdir, _ = tuned
  lines = tmp_path / "pairs.jsonl"
  with open(groups[1]) as f:
    lines.write_text("".join(json.dumps({"query": line["query"], "document": d}) + "\n"
                             for line in map(json.loads, f) for d in line["documents"][:4]))
  logits = {}
  for quantize in (None, "int8"):
    out = tmp_path / f"{quantize}.jsonl"
    assert predict(workdir, str(lines), str(out), quantize=quantize).count == 120
    logits[quantize] = np.array([json.loads(l)["logit"] for l in out.read_text().splitlines()])
  assert not np.array_equal(logits["int8"], logits[None])  # computed otherwise
  assert np.corrcoef(logits["int8"], logits[None])[0, 1] >= 0.999
  assert np.abs(logits["int8"] - logits[None]).max() <= 0.05 * np.ptp(logits[None])
  assert main(["--workdir", workdir, "--input", str(lines), "--out", str(tmp_path / "q.jsonl"),
               "--quantize", "int8"]) == 0


@pytest.mark.slow  # two runs of the program
def test_a_rerank_run_resumes_exactly(groups, hf_dir, tmp_path, capfd):
  from train.run.load import load_encoder
  config = _config(groups, hf_dir, **{"train.num_steps": 8, "train.checkpoint_every": 4,
                                      "train.eval_every": 4, "train.keep_checkpoints": 2,
                                      "task.loss": "bce"})
  straight, resumed = runs.straight_and_resumed(config, tmp_path, capfd)
  assert runs.losses(resumed) == runs.losses(straight)
  evals = lambda workdir: {r["step"]: r["mrr_at_10"] for r in runs.read_metrics(
      os.path.join(workdir, "metrics.jsonl")) if r["split"] == "eval"}
  assert evals(resumed) == evals(straight)
  chex.assert_trees_all_equal(load_encoder(resumed)[1], load_encoder(straight)[1])


@pytest.mark.parametrize("line, said", [
    ({"positive": "a"}, "'query': no such field"),
    ({"query": "a", "positive": 3}, "'positive': got 3"),
    ({"query": "a", "positive": "b", "negative": ["c", ""]}, "'negative'"),
    ({"query": ["a", "b"], "positive": "b"}, "'query': a list, expected one string"),
])
def test_a_bad_line_is_one_line_naming_file_line_and_field(line, said, groups, hf_dir, tmp_path):
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"query": "x", "positive": "y"}) + "\n" + json.dumps(line) + "\n")
  result = runs.train(str(tmp_path / "run"), f"--config.data.train={bad}",
                      f"--config.data.eval={groups[1]}", f"--config.init.hf={hf_dir}",
                      check=False, config=os.path.join(runs.ROOT, "configs", "rerank.py"))
  assert result.returncode == 2
  *before, message = [line for line in result.stderr.splitlines() if line.strip()]
  assert before == ["config.train.epochs: 1, the default from a pretrained start"]
  assert f"{bad}:2" in message and said in message


def test_a_reranker_start_goes_on_from_its_own_classifier(groups, hf_dir, tmp_path):
  from safetensors.numpy import load_file

  from flax_encoder import families
  from train.tasks import rerank
  from train.tasks.start import start_of
  cfg, _ = families.load_hf(hf_dir)
  state = load_file(os.path.join(hf_dir, "model.safetensors"))
  start = start_of(_config(groups, hf_dir), str(tmp_path))
  params = rerank._with_start_classifier({"encoder": {}}, start, cfg, "pooler")
  np.testing.assert_array_equal(params["classifier"]["kernel"], state["classifier.weight"].T)
  np.testing.assert_array_equal(params["pooler"]["dense"]["bias"],
                                state["bert.pooler.dense.bias"])
  # pooled otherwise than the checkpoint's classifier: a new one
  assert rerank._with_start_classifier({"encoder": {}}, start, cfg, "mean") == {"encoder": {}}


def test_a_run_reads_its_start_folder_once(groups, hf_dir, tmp_path, monkeypatch):
  # config.init.hf parsed into one value: config.json copied into the run and read once, the
  # weights read once, its tokenizer.json read once (the tokenizer, the data's copy of it),
  # whatever the pooling, the classifier and the start's checks ask of it.
  import builtins

  from flax_encoder.families import directory
  from train import tasks
  from train.task import Resume
  from train.tasks import rerank, start
  config_json = os.path.realpath(os.path.join(hf_dir, "config.json"))
  tokenizer_json = os.path.realpath(os.path.join(hf_dir, "tokenizer.json"))
  # as in a process of its own
  monkeypatch.setattr(start, "_OPENED", {})
  monkeypatch.setattr(start, "_FILES", {})
  opened, weights, tokenizers = [], [], []
  real_open, real_read = builtins.open, directory._read_file

  def counting_open(file, *args, **kwargs):
    if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == config_json:
      opened.append(file)
    if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == tokenizer_json:
      tokenizers.append(file)
    return real_open(file, *args, **kwargs)

  def counting_read(file):
    weights.append(file)
    return real_read(file)

  monkeypatch.setattr(builtins, "open", counting_open)
  monkeypatch.setattr(directory, "_read_file", counting_read)
  config = _config(groups, hf_dir, **{"train.num_steps": 2})
  tasks.checked(config)
  setup = rerank.setup(config, str(tmp_path / "run"), Resume())
  assert len(opened) == 2 and len(weights) == 1, (opened, weights)
  assert len(tokenizers) == 1, tokenizers
  assert "classifier" in setup.start_params  # the start's own, read from those weights


def test_a_run_from_a_pretrained_start_trains_one_epoch_as_the_other_retrieval_tasks(
    groups, hf_dir, capfd):
  """configs/rerank.py trained 800 steps where configs/embed.py trains one epoch of the pairs
  from a published start: one convention, said in one line."""
  from train import tasks
  config = rerank_config.get_config()
  config.data.train, config.data.eval = groups
  config.init.hf = hf_dir
  capfd.readouterr()
  tasks.checked(config)
  assert (config.train.num_steps, config.train.epochs) == (None, 1)
  assert capfd.readouterr().err == "config.train.epochs: 1, the default from a pretrained start\n"
  scratch = rerank_config.get_config()
  scratch.data.train, scratch.data.eval = groups
  tasks.checked(scratch)
  assert scratch.train.epochs is None  # 800 steps, as every task from scratch
