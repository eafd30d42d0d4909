"""Distillation in the contrastive task (config.task.loss = margin_mse, kl): each loss equal to
sentence-transformers' on the same embeddings and teacher scores, and a run that reads a
teacher's scores from its lines, trains and resumes exactly."""

import json
import os

import numpy as np
import pytest

from tests import runs
from tests.test_contrastive import TOPICS, _config, _text
from train.errors import RunError
from train.tasks.contrastive import DistillationLoss

B, D = 6, 8


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """A tiny BERT, test_contrastive's start."""
  pytest.importorskip("torch")
  from tests import hf_models
  return hf_models.write(tmp_path_factory.mktemp("bert"), "bert")


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


@pytest.mark.parametrize("loss", ["margin_mse", pytest.param("kl", marks=pytest.mark.slow)])
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


@pytest.mark.parametrize("kind", ["margin_mse", "kl"])
def test_sparse_distillation_is_splade_loss_around_sentence_transformers_distillation(kind):
  torch = pytest.importorskip("torch")
  pytest.importorskip("sentence_transformers")
  from sentence_transformers.sparse_encoder.losses import (FlopsLoss, SparseDistillKLDivLoss,
                                                           SparseMarginMSELoss)
  from train.tasks.sparse import SparseDistillationLoss
  # SPLADE's vectors: non-negative, most 0
  a, p, n = (np.maximum(x, 0) * 3 for x in _embeddings(4))
  teacher = (5 * np.random.default_rng(5).normal(size=(B, 2))).astype(np.float32)
  base = (SparseMarginMSELoss(model=None) if kind == "margin_mse"
          else SparseDistillKLDivLoss(model=None))  # temperature 2, theirs and ours
  columns = [torch.from_numpy(x) for x in (a, p, n)]
  flops = FlopsLoss(model=None)
  # SpladeLoss: the base loss, the documents' (positives and negatives) FLOPS and the queries'
  want = (float(base.compute_loss_from_embeddings(columns, torch.from_numpy(teacher)))
          + 3e-5 * float(flops.compute_loss_from_embeddings(torch.cat(columns[1:])))
          + 5e-5 * float(flops.compute_loss_from_embeddings(columns[0])))
  ours = float(SparseDistillationLoss(kind)(a, p, n, teacher)) / B
  assert ours == pytest.approx(want, rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("kind", ["margin_mse", "kl"])
def test_multi_vector_distillation_is_sentence_transformers_on_their_maxsim(tmp_path, kind):
  """sentence-transformers' loss on a batch of a MultiVectorEncoder folder, against
  `distillation` of that model's own MaxSim of each anchor with its positive and negative
  (which flax-encoder computes equally: tests/test_multi_vector.py)."""
  torch = pytest.importorskip("torch")
  pytest.importorskip("sentence_transformers")
  from sentence_transformers import MultiVectorEncoder
  from sentence_transformers.multi_vector_encoder.losses import (MultiVectorDistillKLDivLoss,
                                                                 MultiVectorMarginMSELoss)

  from tests import hf_models
  from train.tasks.contrastive import distillation
  torch.manual_seed(0)
  model = MultiVectorEncoder(hf_models.write(tmp_path / "hf", "bert", head="base"), device="cpu")
  rng = np.random.default_rng(6)
  columns = [[_text(rng, t) for t in rng.choice(TOPICS, 4)] for _ in range(3)]
  teacher = (3 * rng.normal(size=(4, 2))).astype(np.float32)
  theirs = (MultiVectorMarginMSELoss(model) if kind == "margin_mse"
            else MultiVectorDistillKLDivLoss(model, temperature=2.0))
  features = [model.tokenize(texts) for texts in columns]
  features[0]["task"] = "query"
  with torch.no_grad():
    want = float(theirs(features, torch.from_numpy(teacher)))
    queries = model.encode_query(columns[0])
    student = np.stack([model.similarity_pairwise(queries, model.encode_document(c)).numpy()
                        for c in columns[1:]], 1)
  ours = float(distillation(kind, student, teacher, 2.0)) / 4
  assert ours == pytest.approx(want, rel=1e-5, abs=1e-6)


@pytest.fixture(scope="module")
def starts(tmp_path_factory):
  """config name -> a tiny start: SPLADE's masked-LM directory, ColBERT's bare encoder."""
  pytest.importorskip("torch")
  from tests import hf_models
  root = tmp_path_factory.mktemp("starts")
  return {"sparse": hf_models.write(root / "mlm", "bert", head="masked_lm"),
          "multi_vector": hf_models.write(root / "base", "bert", head="base")}


@pytest.mark.slow  # two runs of each
@pytest.mark.parametrize("name, loss", [("sparse", "kl"), ("multi_vector", "margin_mse")])
def test_sparse_and_multi_vector_runs_distil_and_resume_exactly(scored_pairs, starts, tmp_path,
                                                                capfd, name, loss):
  import importlib
  config = importlib.import_module(f"configs.{name}").get_config()
  config.data.train, config.data.eval = scored_pairs
  config.init.hf = starts[name]
  for field, value in {"train.seq_len": 16, "train.batch_size": 16, "train.num_steps": 8,
                       "train.checkpoint_every": 4, "train.eval_every": 4,
                       "train.log_every": 1, "train.keep_checkpoints": 2,
                       "optim.learning_rate": 5e-3, "optim.warmup_steps": 2,
                       "task.loss": loss}.items():
    section, key = field.split(".")
    config[section][key] = value
  straight, resumed = runs.straight_and_resumed(config, tmp_path, capfd)
  # (the losses' formulas are checked above; a few steps of these tiny models move them by
  # less than their noise)
  assert runs.losses(resumed) == runs.losses(straight)
  assert np.isfinite(list(runs.losses(straight).values())).all()


def test_reranker_distillation_is_cross_encoder_margin_mse(tmp_path):
  """sentence-transformers' CrossEncoder MarginMSELoss on a batch of (query, positive, two
  negatives), against `margin_mse` of that model's own logits (which flax-encoder's Reranker
  computes equally: tests/test_cross_encoder.py); a group's drawn negatives (NaN: no teacher
  score) left out."""
  torch = pytest.importorskip("torch")
  pytest.importorskip("sentence_transformers")
  from sentence_transformers import CrossEncoder
  from sentence_transformers.cross_encoder.losses import MarginMSELoss

  from tests import hf_models
  from train.tasks.rerank import margin_mse
  model = CrossEncoder(hf_models.write(tmp_path / "ce", "bert", head="sequence_classification",
                                       num_labels=1), device="cpu")
  rng = np.random.default_rng(7)
  columns = [[_text(rng, t) for t in rng.choice(TOPICS, 5)] for _ in range(4)]
  teacher = (3 * rng.normal(size=(5, 3))).astype(np.float32)
  with torch.no_grad():
    want = float(MarginMSELoss(model)(columns, torch.from_numpy(teacher)))
    logits = np.stack([model.predict(list(zip(columns[0], c)), activation_fn=torch.nn.Identity())
                       for c in columns[1:]], 1)
  drawn = np.concatenate([logits, rng.normal(size=(5, 2))], 1)  # two drawn, unscored
  scored = np.concatenate([teacher, np.full((5, 2), np.nan, np.float32)], 1)
  assert float(np.mean(margin_mse(drawn, scored))) == pytest.approx(want, rel=1e-5, abs=1e-7)


@pytest.mark.slow  # two runs
def test_a_reranker_distillation_run_reads_each_lines_scores_and_resumes_exactly(tmp_path, capfd):
  pytest.importorskip("torch")
  from configs import rerank as rerank_config
  from tests import hf_models
  from train import loop
  from train.tasks.rerank import load_groups
  rng = np.random.default_rng(8)
  train, held = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
  with open(train, "w") as f:
    for topic in rng.choice(TOPICS, 64):
      f.write(json.dumps({"query": _text(rng, topic), "positive": _text(rng, topic),
                          "negative": [_text(rng, t) for t in rng.choice(TOPICS, 2)],
                          "scores": [float(rng.uniform(2, 4)), *rng.uniform(-2, 1, 2).tolist()]
                          }) + "\n")
  with open(held, "w") as f:
    for topic in rng.choice(TOPICS, 12):
      f.write(json.dumps({"query": _text(rng, topic), "positive": _text(rng, topic),
                          "negative": [_text(rng, t) for t in rng.choice(TOPICS, 5)]}) + "\n")
  config = rerank_config.get_config()
  config.data.train, config.data.eval = str(train), str(held)
  config.init.hf = hf_models.write(tmp_path / "ce", "bert", head="sequence_classification",
                                   num_labels=1)
  for field, value in {"train.seq_len": 24, "train.batch_size": 8, "train.num_steps": 8,
                       "train.checkpoint_every": 4, "train.eval_every": 4, "train.log_every": 1,
                       "train.keep_checkpoints": 2, "task.negatives": 3,
                       "task.loss": "margin_mse"}.items():
    section, key = field.split(".")
    config[section][key] = value
  straight, resumed = runs.straight_and_resumed(config, tmp_path, capfd)
  assert runs.losses(resumed) == runs.losses(straight)
  teacher = load_groups(os.path.join(straight, "data"))["train"]["teacher"]
  with open(train) as f:
    first = json.loads(f.readline())["scores"]
  # the positive's and the line's two negatives' scores; the one drawn from another line: NaN
  np.testing.assert_array_equal(teacher[0, :3], np.asarray(first, np.float32))
  assert np.isnan(teacher[:, 3]).all()
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"query": "a b", "positive": "a c", "negative": ["d", "e"],
                             "scores": [1.0, 0.5]}) + "\n")
  config.data.train = str(bad)
  with pytest.raises(RunError, match=r"bad.jsonl:1: 'scores': \[1.0, 0.5\], expected the "
                     r"teacher's scores of the positive and each of the 2 negatives"):
    loop.run(config, str(tmp_path / "bad"))
