"""Sparse (SPLADE) contrastive fine-tuning (train.tasks.sparse): its loss against numpy's
formula, and a run from a tiny Hugging Face masked LM that ranks held-out pairs better than
its start, resumes bit for bit and exports a folder sentence-transformers' SparseEncoder
loads with the run's vectors."""

import json
import os

import chex
import numpy as np
import pytest

from configs import sparse as sparse_config
from tests import runs
from train.tasks.sparse import SparseRankingLoss

# whole words of tests/hf_models' wordpiece vocabulary: a pair shares its topic
TOPICS = (list("abcdefghij") +
          "the ab br do ef fo ij ju la ov qu abcd brow dog efgh fox jump lazy over quic brown "
          "jumps quick".split())
DISTRACTORS = list("0123456789!%*+-/<=>?")


def test_the_loss_is_the_cross_entropy_of_dot_products_plus_flops():
  rng = np.random.default_rng(0)
  a, p, n = (np.maximum(rng.normal(size=(3, 7)), 0).astype(np.float32) for _ in range(3))
  has = np.array([1, 0, 1], np.uint8)
  loss = SparseRankingLoss(scale=2.0, document_regularizer=0.1, query_regularizer=0.3)
  scores = np.concatenate([2 * a @ p.T, np.where(has[None] > 0, 2 * a @ n.T, -np.inf)], 1)
  peak = scores.max(1, keepdims=True)
  ranking = np.sum(peak[:, 0] + np.log(np.exp(scores - peak).sum(1)) - np.diagonal(scores))
  documents = np.concatenate([p, n[has > 0]])
  flops = lambda x: np.sum(x.mean(0) ** 2)
  want = ranking + 3 * (0.1 * flops(documents) + 0.3 * flops(a))
  assert float(loss(a, p, n, has)) == pytest.approx(want, rel=1e-5)
  # without the regularisers, the cross-entropy alone
  bare = SparseRankingLoss(scale=2.0, document_regularizer=0, query_regularizer=0)
  assert float(bare(a, p, n, has)) == pytest.approx(ranking, rel=1e-5)


def _text(rng, topic, words=5):
  text = list(rng.choice(DISTRACTORS, words))
  text.insert(int(rng.integers(0, words + 1)), topic)
  return " ".join(text)


@pytest.fixture(scope="module")
def topic_pairs(tmp_path_factory):
  directory, rng = tmp_path_factory.mktemp("pairs"), np.random.default_rng(0)

  def write(name, topics):
    with open(directory / name, "w") as f:
      for topic in topics:
        f.write(json.dumps({"anchor": _text(rng, topic), "positive": _text(rng, topic)}) + "\n")
    return str(directory / name)

  return (write("train.jsonl", rng.choice(TOPICS, 256)),
          write("eval.jsonl", rng.choice(TOPICS, 24, replace=False)))


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from tests import hf_models
  return hf_models.write(tmp_path_factory.mktemp("bert"), "bert", head="masked_lm")


RUN = {"train.seq_len": 16, "train.batch_size": 16, "train.num_steps": 60,
       "train.eval_every": 30, "train.checkpoint_every": 60, "train.log_every": 10,
       "optim.learning_rate": 3e-3, "optim.warmup_steps": 4}


@pytest.fixture(scope="module")
def tuned(topic_pairs, mlm_dir, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("tuned") / "run")
  overrides = {"data.train": topic_pairs[0], "data.eval": topic_pairs[1], "init.hf": mlm_dir,
               **RUN}
  return workdir, runs.train(workdir, *[f"--config.{k}={v}" for k, v in overrides.items()],
                             config=os.path.join(runs.ROOT, "configs", "sparse.py"))


def test_fine_tuning_ranks_the_held_out_pairs_better_than_the_start(tuned):
  workdir, result = tuned
  records = runs.read_metrics(os.path.join(workdir, "metrics.jsonl"))
  start, *_, final = [r for r in records if r["split"] == "eval"]
  print(f"MRR@10 {start['mrr_at_10']:.3f} -> {final['mrr_at_10']:.3f}; active dimensions "
        f"{start['active_dims_anchor']:.0f} -> {final['active_dims_anchor']:.0f}")
  assert start["step"] == 0 and final["step"] == 60
  assert final["mrr_at_10"] > start["mrr_at_10"] + 0.2
  assert final["loss"] < start["loss"]
  assert 0 < final["active_dims_anchor"] < 119  # of the tiny vocabulary's 119
  assert "active dimensions" in result.stdout


def test_the_export_is_a_sparse_encoder_with_the_runs_vectors(tuned, tmp_path):
  st = pytest.importorskip("sentence_transformers")
  from train.outputs.export import main as export
  from train.tasks.sparse import sparse_encoder
  workdir, _ = tuned
  out = str(tmp_path / "splade")
  assert export(["--workdir", workdir, "--layout", "sentence-transformers", "--out", out]) == 0
  texts = ["the quick brown fox", "0 1 2 dog", "lazy", "abcd efgh ij + - *"]
  ours = sparse_encoder(workdir).encode(texts).toarray()
  theirs = st.SparseEncoder(out, device="cpu").encode(texts).to_dense().numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-5)
  assert (ours != 0).sum() > 0


@pytest.mark.slow  # two runs of the program
def test_a_sparse_run_resumes_exactly(topic_pairs, mlm_dir, tmp_path, capfd):
  from train.run.load import load_encoder
  config = sparse_config.get_config()
  config.data.train, config.data.eval = topic_pairs
  config.init.hf = mlm_dir
  for name, value in {**RUN, "train.num_steps": 8, "train.checkpoint_every": 4,
                      "train.eval_every": 4, "train.keep_checkpoints": 2, "task.cached": True,
                      "task.mini_batch": 8}.items():
    section, field = name.split(".")
    config[section][field] = value
  straight, resumed = runs.straight_and_resumed(config, tmp_path, capfd)
  assert runs.losses(resumed) == runs.losses(straight)
  chex.assert_trees_all_equal(load_encoder(resumed)[1], load_encoder(straight)[1])


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
  """A tiny BERT without a masked-LM head."""
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from tests import hf_models
  return hf_models.write(tmp_path_factory.mktemp("base"), "bert", head="base")


def test_a_start_without_a_masked_lm_head_is_refused_in_one_line(topic_pairs, base_dir,
                                                                tmp_path):
  base = base_dir
  result = runs.train(str(tmp_path / "run"), f"--config.data.train={topic_pairs[0]}",
                      f"--config.data.eval={topic_pairs[1]}", f"--config.init.hf={base}",
                      check=False, config=os.path.join(runs.ROOT, "configs", "sparse.py"))
  assert result.returncode == 2
  (message,) = result.stderr.strip().splitlines()[-1:]
  assert "config.init.hf" in message and "masked-LM head" in message


def test_a_fresh_head_starts_on_an_encoder_without_one(topic_pairs, base_dir, tmp_path):
  base = base_dir
  workdir = str(tmp_path / "run")
  result = runs.train(workdir, f"--config.data.train={topic_pairs[0]}",
                      f"--config.data.eval={topic_pairs[1]}", f"--config.init.hf={base}",
                      "--config.init.fresh_head=True", "--config.train.num_steps=2",
                      "--config.train.seq_len=16", "--config.train.batch_size=8",
                      config=os.path.join(runs.ROOT, "configs", "sparse.py"))
  assert "has no masked-LM head: a new one starts" in result.stderr
  from train.tasks.sparse import read_trained
  _, params, _ = read_trained(workdir)
  assert set(params) == {"encoder", "masked_lm"}
