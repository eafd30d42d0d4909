"""Multi-vector (ColBERT) fine-tuning (train.tasks.multi_vector): MaxSim on packed rows against
numpy's on each text encoded alone, GradCache's gradient against the plain one, the held-out
token vectors put together over batches, a run from a tiny Hugging Face BERT that ranks
held-out pairs better than its start, resumes bit for bit and exports a folder
sentence-transformers' MultiVectorEncoder loads with the run's vectors; a MultiVectorEncoder
folder as the start; one line for each bad setting."""

import json
import os
import re
import shutil
import string

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import multi_vector as multi_vector_config
from flax_encoder import EncoderConfig
from flax_encoder.multi_vector import maxsim
from flax_encoder.ranking import diagonal_metrics
from tests import runs
from tests.test_contrastive import TOPICS, _write_pairs
from train.data import pipeline
from train.errors import RunError
from train.loop import evaluate
from train.task import Resume
from train.tasks import contrastive, multi_vector, packed_pairs
from train.tasks.multi_vector import MultiVectorTask, packed_maxsim, token_model

TINY = EncoderConfig(vocab_size=40, d_model=32, n_heads=4, d_ff=48, n_layers=2, max_len=16,
                     dropout=0.0)
SKIP = (5, 7)  # ids a document does not score, in these tests


def _task(**kwargs) -> MultiVectorTask:
  return MultiVectorTask(token_model(TINY, 8), kwargs.pop("scale", 1.0),
                         kwargs.pop("eval_pairs", 2), **kwargs)


def _tokens(rng, rows, seq=12):
  """Random ids 1 … 39, each row padded (0) after a random length of 3 to seq."""
  ids = rng.integers(1, 40, (rows, seq))
  lengths = rng.integers(3, seq + 1, rows)
  return np.where(np.arange(seq)[None] < lengths[:, None], ids, 0).astype(np.int32)


def _pairs(seed: int, b: int = 8) -> dict:
  rng = np.random.default_rng(seed)
  return {"anchor": _tokens(rng, b), "positive": _tokens(rng, b), "negative": _tokens(rng, b),
          "has_negative": np.array([1, 1, 0, 1, 0, 1, 1, 1], np.uint8)[:b]}


def _packed(rows: dict, seq: int = 12, chunks: int = 1) -> dict:
  packer = packed_pairs.PairPacker(packed_pairs.text_lengths(rows, TINY.pad_id), seq,
                                   TINY.pad_id, len(rows["anchor"]), 1, chunks)
  return packer(np.arange(len(rows["anchor"])), rows, 0)


def _text(ids):
  """numpy: each row's text, up to its last id other than the pad id 0 (a pad id within a
  text is the text's, as its tokenizer's attention mask has it)."""
  ids = np.asarray(ids)
  return np.flip(np.cumsum(np.flip(ids != 0, -1), -1), -1) > 0


def _maxsim_np(queries, query_ids, documents, document_ids, skip=()):
  """numpy: MaxSim of [q, s, d] queries (their texts' ids, `_text`) against [n, t, d]
  documents (their texts' ids, less `skip`)."""
  scores = np.zeros((len(queries), len(documents)))
  for i, (q, q_ids) in enumerate(zip(queries, query_ids)):
    for j, (d, d_ids) in enumerate(zip(documents, document_ids)):
      kept = d[_text(d_ids) & ~np.isin(d_ids, skip)]
      scores[i, j] = np.sum(np.max(q[_text(q_ids)] @ kept.T, axis=1))
  return scores


def _ce_sum(scores):
  peak = scores.max(1, keepdims=True)
  return float(np.sum(peak[:, 0] + np.log(np.exp(scores - peak).sum(1)) - np.diagonal(scores)))


def _norm(tree) -> float:
  return float(jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(tree))))


@pytest.fixture(scope="module")
def tiny_params():
  return nn.unbox(_task().init(jax.random.PRNGKey(0), 12))


def test_maxsim_on_packed_rows_is_each_text_encoded_alone(tiny_params):
  rows = _pairs(0)
  rows["positive"][1, 2] = TINY.pad_id  # a pad id within a text is the text's
  task = _task(scale=2.0, skip_ids=SKIP)
  batch = _packed(rows)
  assert len(batch["tokens"]) < 22  # the 22 texts share rows
  alone = {name: np.asarray(task.embed(tiny_params, (rows[name],))) for name in
           ("anchor", "positive", "negative")}
  # unit vectors of the projection's width
  np.testing.assert_allclose(np.linalg.norm(alone["anchor"], axis=-1), 1, atol=1e-6)
  has = rows["has_negative"] > 0
  want = np.concatenate([
      _maxsim_np(alone["anchor"], rows["anchor"], alone["positive"], rows["positive"], SKIP),
      np.where(has[None], _maxsim_np(alone["anchor"], rows["anchor"], alone["negative"],
                                     rows["negative"], SKIP), -np.inf)], axis=1)
  got = jax.jit(task.scores)(tiny_params, batch)
  np.testing.assert_allclose(got, want, atol=1e-5)
  # a few query tokens at a time: the same scores
  vectors = task.embed(tiny_params, (batch["tokens"], batch["segment_ids"], batch["positions"]))
  documents = jnp.concatenate([batch["positive_slot"], jnp.where(
      has, batch["negative_slot"], -1)])
  chunked = packed_maxsim(vectors, batch["tokens"], batch["segment_ids"], batch["anchor_slot"],
                          documents, SKIP, score_tokens=7)
  np.testing.assert_allclose(chunked, want, atol=1e-5)

  # the loss and its gradient: those of the texts alone, scored by the library's maxsim
  def alone_loss(params):
    embed = lambda name: task.embed(params, (rows[name],))
    kept = lambda name: _text(rows[name]) & ~np.isin(rows[name], SKIP)
    columns = [maxsim(embed("anchor"), _text(rows["anchor"]), embed(name), kept(name))
               for name in ("positive", "negative")]
    scores = 2.0 * jnp.concatenate([columns[0], jnp.where(has[None], columns[1], -jnp.inf)], 1)
    return jnp.sum(jax.nn.logsumexp(scores, axis=1) - jnp.diagonal(scores))

  packed_loss, packed_grads = jax.jit(jax.value_and_grad(task.loss_sum))(
      tiny_params, batch, jax.random.PRNGKey(1))
  assert float(packed_loss) == pytest.approx(_ce_sum(2.0 * want), rel=1e-5)
  loss, grads = jax.value_and_grad(alone_loss)(tiny_params)
  assert float(packed_loss) == pytest.approx(float(loss), rel=1e-5)
  assert _norm(grads) > 1e-2  # a gradient to compare, the projection's among it
  chex.assert_trees_all_close(packed_grads, grads, atol=1e-5, rtol=1e-5)


def test_gradcache_gives_the_plain_loss_and_gradient(tiny_params):
  batch = _packed(_pairs(1), chunks=2)
  plain, cached = _task(skip_ids=SKIP), _task(skip_ids=SKIP, chunks=2)
  grad = lambda task: jax.jit(jax.value_and_grad(task.loss_sum))(
      tiny_params, batch, jax.random.PRNGKey(1))
  (plain_loss, plain_grads), (cached_loss, cached_grads) = grad(plain), grad(cached)
  assert float(cached_loss) == pytest.approx(float(plain_loss), rel=1e-6)
  assert _norm(plain_grads) > 1e-2
  chex.assert_trees_all_close(cached_grads, plain_grads, atol=1e-5, rtol=1e-5)


def test_the_held_out_token_vectors_are_put_together_over_packed_padded_batches(tiny_params):
  rng = np.random.default_rng(2)
  rows = {"anchor": _tokens(rng, 5), "positive": _tokens(rng, 5)}
  task = _task(eval_pairs=5, skip_ids=SKIP, scale=3.0)
  packed = packed_pairs.pack_held_out(rows, TINY.pad_id, 12)
  assert len(packed["tokens"]) < 10  # texts share rows
  batches = pipeline.eval_batches(packed, 2, {"tokens": 0, "segment_ids": 0, "positions": 0,
                                              "target": -1})
  sums = evaluate(jax.jit(task.eval_sums), tiny_params, batches)
  assert sums["count"] == 5
  for name, skip in (("anchor", ()), ("positive", SKIP)):  # each text in its pair's place
    alone = np.asarray(task.embed(tiny_params, (rows[name],)))
    real = rows[name] > 0
    np.testing.assert_allclose(sums[name + "s"], np.where(real[..., None], alone, 0), atol=1e-6)
    np.testing.assert_array_equal(sums[name + "_mask"], real & ~np.isin(rows[name], skip))
  metrics = task.eval_metrics(sums)
  similarity = _maxsim_np(sums["anchors"], rows["anchor"], sums["positives"], rows["positive"],
                          SKIP)
  assert metrics["mrr_at_10"] == pytest.approx(
      diagonal_metrics(similarity)["mrr_at_10"])
  assert metrics["loss"] == pytest.approx(_ce_sum(3.0 * similarity) / 5, rel=1e-5)
  assert metrics["random_mrr_at_10"] == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 4 + 1 / 5) / 5)


# ---------------------------------------------------------------------------------------------
# Runs from a tiny Hugging Face BERT.


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from tests import hf_models
  return hf_models.write(tmp_path_factory.mktemp("bert"), "bert", head="base")


@pytest.fixture(scope="module")
def topic_pairs(tmp_path_factory):
  """(train.jsonl, eval.jsonl): 256 training pairs of random topics, every other one with a
  hard negative, and 32 held out of distinct topics."""
  directory, rng = tmp_path_factory.mktemp("pairs"), np.random.default_rng(0)
  train = _write_pairs(directory / "train.jsonl", rng.choice(TOPICS, 256), rng, negatives=True)
  eval_ = _write_pairs(directory / "eval.jsonl", rng.choice(TOPICS, 32, replace=False), rng)
  return train, eval_


RUN = {"train.seq_len": 16, "train.batch_size": 16, "train.num_steps": 40,
       "train.eval_every": 20, "train.checkpoint_every": 20, "train.keep_checkpoints": 2,
       "train.log_every": 10, "optim.learning_rate": 5e-3, "optim.warmup_steps": 4,
       "task.cached": True, "task.mini_batch": 8, "task.skiplist": True}


def _overrides(fields: dict) -> list[str]:
  return [f"--config.{name}={value}" for name, value in fields.items()]


def _train(workdir, topic_pairs, hf_dir, check=True, **fields):
  return runs.train(workdir, *_overrides({
      "data.train": topic_pairs[0], "data.eval": topic_pairs[1], "init.hf": hf_dir, **RUN,
      **fields}), config=os.path.join(runs.ROOT, "configs", "multi_vector.py"), check=check)


@pytest.fixture(scope="module")
def tuned(topic_pairs, hf_dir, tmp_path_factory):
  """(workdir, the program's result): GradCache, hard negatives, the punctuation skiplist."""
  workdir = str(tmp_path_factory.mktemp("tuned") / "run")
  return workdir, _train(workdir, topic_pairs, hf_dir)


def _evals(workdir) -> dict:
  return {r["step"]: r for r in runs.read_metrics(os.path.join(workdir, "metrics.jsonl"))
          if r["split"] == "eval"}


def test_fine_tuning_ranks_the_held_out_pairs_better_than_the_start(tuned):
  workdir, result = tuned
  assert "256 training and 32 held-out" in result.stderr
  assert "pairs (with hard negatives), token vectors of 128 (documents skip punctuation)" in (
      result.stderr)
  evals = _evals(workdir)
  start, final = evals[0], evals[40]  # the start's figures: configs/multi_vector.py
  print(f"MRR@10 {start['mrr_at_10']:.3f} -> {final['mrr_at_10']:.3f}, loss "
        f"{start['loss']:.3f} -> {final['loss']:.3f}")
  assert final["mrr_at_10"] > start["mrr_at_10"] + 0.2
  assert final["loss"] < start["loss"]
  assert final["random_mrr_at_10"] == pytest.approx(sum(1 / r for r in range(1, 11)) / 32)
  assert result.stdout.strip().splitlines()[-1].startswith("step 40: eval MRR@10")
  params, record = multi_vector.read_trained(workdir)[1:]
  assert set(params) == {"encoder", "dense_0"} and params["dense_0"]["kernel"].shape == (32, 128)
  assert {k: record[k] for k in ("dim", "skiplist", "similarity", "scale", "family")} == {
      "dim": 128, "skiplist": True, "similarity": "maxsim", "scale": 1.0, "family": "bert"}
  assert record["skip_ids"]  # the punctuation's ids in the tokenizer


@pytest.mark.slow  # two runs of the program
def test_a_multi_vector_run_resumes_exactly(tuned, topic_pairs, hf_dir, tmp_path, capfd):
  # The run from its checkpoint at step 20, as a run stopped there resumes, against the run
  # that went on: the same losses, held-out ranking and parameters, bit for bit.
  straight, resumed = tuned[0], str(tmp_path / "resumed")
  shutil.copytree(straight, resumed)
  shutil.rmtree(os.path.join(resumed, "checkpoints", "40"))
  result = _train(resumed, topic_pairs, hf_dir)
  assert "resumed from the checkpoint at step 20" in result.stderr
  assert runs.losses(resumed) == runs.losses(straight)
  assert _evals(resumed) == _evals(straight)
  chex.assert_trees_all_equal(multi_vector.read_trained(resumed)[1],
                              multi_vector.read_trained(straight)[1])


def _held_out_texts(topic_pairs) -> list[str]:
  lines = [json.loads(line) for line in open(topic_pairs[1])]
  return [line[name] for line in lines[:8] for name in ("anchor", "positive")]


def test_the_run_gives_the_token_vectors_its_step_computed(tuned, topic_pairs):
  workdir = tuned[0]
  cfg, params, record = multi_vector.read_trained(workdir)
  ids = np.asarray(contrastive.load_pairs(os.path.join(workdir, "data"))["eval"]["anchor"][:8])
  stepped = np.asarray(token_model(cfg, record["dim"]).apply({"params": params}, ids))
  encoder = multi_vector.multi_vector_encoder(workdir)
  texts = _held_out_texts(topic_pairs)[::2]
  for got, row, text_ids in zip(encoder.encode_query(texts), stepped, ids):
    np.testing.assert_allclose(got, row[text_ids > 0], atol=1e-5)
  # a document leaves its punctuation out
  for got, row, text_ids in zip(encoder.encode_document(texts), stepped, ids):
    kept = (text_ids > 0) & ~np.isin(text_ids, record["skip_ids"])
    assert kept.sum() < (text_ids > 0).sum()
    np.testing.assert_allclose(got, row[kept], atol=1e-5)


def test_the_run_exports_a_folder_sentence_transformers_loads_with_its_vectors(
    tuned, topic_pairs, tmp_path):
  st = pytest.importorskip("sentence_transformers")
  from flax_encoder.multi_vector import MultiVectorEncoder
  from train.outputs.export import main as export_main
  workdir, out = tuned[0], str(tmp_path / "folder")
  assert export_main(["--workdir", workdir, "--layout", "sentence-transformers",
                      "--out", out]) == 0
  texts = _held_out_texts(topic_pairs) + ["a text far longer than the run's sixteen ids , which "
                                          "both cut where the run cut its pairs ! ?"]
  ours = multi_vector.multi_vector_encoder(workdir)
  theirs = st.MultiVectorEncoder(out, device="cpu")
  for side in ("query", "document"):
    want = getattr(ours, f"encode_{side}")(texts)
    got = getattr(theirs, f"encode_{side}")(texts, convert_to_numpy=True)
    for a, b in zip(got, want):
      np.testing.assert_allclose(np.asarray(a), b, atol=1e-5)
    loaded = getattr(MultiVectorEncoder.load(out), f"encode_{side}")(texts)
    for a, b in zip(loaded, want):
      np.testing.assert_allclose(a, b, atol=1e-5)
  queries, documents = ours.encode_query(texts[:4]), ours.encode_document(texts[4:])
  np.testing.assert_allclose(theirs.similarity(queries, documents), ours.similarity(
      queries, documents), atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Where it starts, and what it refuses.


def _config(topic_pairs, start, **fields):
  config = multi_vector_config.get_config()
  config.data.train, config.data.eval = topic_pairs
  config.init.hf = start
  for name, value in {**RUN, **fields}.items():
    section, field = name.split(".")
    config[section][field] = value
  return config


def _folder(path, hf_dir, transformer=None, dim=16, mask=None, **options) -> str:
  """A MultiVectorEncoder folder of `hf_dir`, as sentence-transformers saves one."""
  import torch
  from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder
  from sentence_transformers.base.modules import Dense, Normalize, Transformer
  from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
  torch.manual_seed(0)
  modules = [Transformer(hf_dir, max_seq_length=16, **(transformer or {})),
             Dense(32, dim, bias=False, activation_function=torch.nn.Identity(),
                   module_input_name="token_embeddings"),
             MultiVectorMask(**(mask or {})), Normalize(module_input_name="token_embeddings")]
  STMultiVectorEncoder(modules=modules, device="cpu", **options).save(str(path))
  return str(path)


def test_a_multi_vector_folder_starts_with_its_projection_and_skiplist(
    topic_pairs, hf_dir, tmp_path):
  pytest.importorskip("sentence_transformers")
  from train import tasks
  folder = _folder(tmp_path / "colbert", hf_dir,
                   mask={"skiplist_words": list(string.punctuation)})
  config = _config(topic_pairs, folder, **{"task.skiplist": None})
  tasks.checked(config)
  setup = multi_vector.setup(config, str(tmp_path / "run"), Resume())
  from safetensors.numpy import load_file
  weight = load_file(os.path.join(folder, "1_Dense", "model.safetensors"))["linear.weight"]
  np.testing.assert_array_equal(setup.start_params["dense_0"]["kernel"], weight.T)
  assert setup.task.model.dim == 16 and setup.record["dim"] == 16
  assert setup.record["skiplist"] and setup.task.skip_ids == tuple(setup.record["skip_ids"])


@pytest.mark.parametrize("fields, said", [
    ({"train.batch_size": 1}, "config.train.batch_size: 1, expected at least 2"),
    ({"train.grad_accum_steps": 2}, "config.train.grad_accum_steps: 2, expected 1"),
    ({"task.mini_batch": 5},
     "config.task.mini_batch: 5, expected a divisor of config.train.batch_size (16)"),
    ({"task.dim": 0}, "config.task.dim: 0, expected an integer >= 1"),
    ({"task.scale": -1.0}, "config.task.scale: -1.0, expected a number > 0"),
])
def test_a_bad_setting_is_one_line_naming_the_field(fields, said, topic_pairs, hf_dir):
  from train import tasks
  with pytest.raises(RunError, match="^" + re.escape(said)) as e:
    tasks.checked(_config(topic_pairs, hf_dir, **fields))
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("folder, fields, said", [
    ({"transformer": {"query_expansion": {"strategy": "fixed", "length": 8}}}, {},
     "has query expansion (its sentence_bert_config.json's query_expansion), which "
     "multi_vector training does not compute"),
    ({"similarity_fn_name": "meanmaxsim"}, {}, "has similarity_fn_name 'meanmaxsim'"),
    ({"prompts": {"query": "[Q] ", "document": "[D] "}}, {},
     "has prompts {'document': '[D] ', 'query': '[Q] '} (config_sentence_transformers.json), "
     "which multi_vector training does not compute; it tokenizes the texts as they are"),
    ({}, {"task.dim": 24}, "config.task.dim: 24, but config.init.hf {} projects to 16"),
])
def test_a_start_folder_with_what_the_task_does_not_train_is_one_line(
    folder, fields, said, topic_pairs, hf_dir, tmp_path):
  pytest.importorskip("sentence_transformers")
  path = _folder(tmp_path / "colbert", hf_dir, **folder)
  with pytest.raises(RunError) as e:
    multi_vector.setup(_config(topic_pairs, path, **fields), str(tmp_path / "run"), Resume())
  message = str(e.value)
  assert said.replace("{}", path) in message and "\n" not in message
  assert message.startswith("config.")
  assert not os.path.exists(tmp_path / "run" / "data")  # refused before the data is prepared


def test_a_skiplist_needs_a_hugging_face_tokenizer(topic_pairs, tmp_path):
  config = _config(topic_pairs, None, **{"data.tokenizer": "bytes", "model.d_model": 16,
                                         "model.n_heads": 2, "model.d_ff": 32,
                                         "model.n_layers": 1, "model.max_len": 32})
  with pytest.raises(RunError, match=re.escape(
      "config.task.skiplist: True, but the run's tokenizer is bytes")):
    multi_vector.setup(config, str(tmp_path / "run"), Resume())


def test_train_embed_refuses_a_run_of_token_vectors_in_one_line(tuned, tmp_path):
  from train.outputs import embed
  source = tmp_path / "texts.txt"
  source.write_text("a b\n")
  with pytest.raises(RunError) as e:
    embed.embed(tuned[0], str(source), str(tmp_path / "e.npy"))
  assert str(e.value).startswith(f"--model {tuned[0]}: a multi_vector run, whose vectors are "
                                 f"not one dense vector a text") and "\n" not in str(e.value)
  assert not os.path.exists(tmp_path / "e.npy")
