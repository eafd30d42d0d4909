"""Contrastive fine-tuning (train.tasks.contrastive): the ranking loss and its options against
numpy's formulas, GradCache's gradient against the plain one, the ranking metrics, the
held-out embeddings put together over batches, a run from a Hugging Face directory that
ranks the held-out pairs better than where it started, and one line for each bad input."""

import json
import os
import re

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import embed as embed_config
from flax_encoder import EncoderConfig
from flax_encoder.ranking import diagonal_metrics
from tests import runs
from train.data import pipeline
from train.errors import RunError
from train.loop import evaluate
from train.task import Resume
from train.tasks import contrastive, packed_pairs
from train.tasks.contrastive import ContrastiveTask, RankingLoss, sentence_model


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _ce_sum(scores):
  """numpy: the cross-entropy of row i of `scores` against column i, summed over rows."""
  peak = scores.max(1, keepdims=True)
  log_z = peak[:, 0] + np.log(np.exp(scores - peak).sum(1))
  return float(np.sum(log_z - np.diagonal(scores)))


A = np.array([[1.0, 0.0, 0.5, 0.0], [0.2, 1.0, 0.0, 0.3]], np.float32)
P = np.array([[0.9, 0.1, 0.4, 0.2], [0.0, 0.8, 0.3, 0.1]], np.float32)
N = np.array([[0.8, 0.3, 0.6, 0.0], [0.1, 0.9, 0.2, 0.5]], np.float32)


def test_the_loss_is_the_cross_entropy_of_scaled_cosines_with_hard_negatives_as_columns():
  s_ap = 20 * _unit(A) @ _unit(P).T
  s_an = 20 * _unit(A) @ _unit(N).T
  plain, hard = RankingLoss()(A, P), RankingLoss()(A, P, N)
  assert float(plain) == pytest.approx(_ce_sum(s_ap), rel=1e-5)
  assert float(hard) == pytest.approx(_ce_sum(np.concatenate([s_ap, s_an], 1)), rel=1e-5)
  assert float(hard) > float(plain) + 1  # the negatives are close to the anchors: harder
  # A line without a negative adds no column: only anchor 0's negative counts.
  masked = RankingLoss()(A, P, N, np.array([1, 0], np.uint8))
  assert float(masked) == pytest.approx(_ce_sum(np.concatenate([s_ap, s_an[:, :1]], 1)),
                                        rel=1e-5)
  # The scale is the inverse temperature.
  assert float(RankingLoss(scale=5.0)(A, P)) == pytest.approx(_ce_sum(s_ap / 4), rel=1e-5)


def test_symmetric_averages_with_the_positives_ranked_among_the_anchors():
  s_ap = 20 * _unit(A) @ _unit(P).T
  s_an = 20 * _unit(A) @ _unit(N).T
  forward = _ce_sum(np.concatenate([s_ap, s_an], 1))
  backward = _ce_sum(s_ap.T)  # the negatives are no candidates for a positive
  assert float(RankingLoss(symmetric=True)(A, P, N)) == pytest.approx(
      (forward + backward) / 2, rel=1e-5)


def test_matryoshka_sums_the_loss_of_each_renormalised_prefix():
  loss = RankingLoss(dims=(4, 2))(A, P)
  prefix = lambda d: 20 * _unit(A[:, :d]) @ _unit(P[:, :d]).T
  assert float(loss) == pytest.approx(_ce_sum(prefix(4)) + _ce_sum(prefix(2)), rel=1e-5)
  assert float(RankingLoss(dims=(2,))(A, P)) == pytest.approx(_ce_sum(prefix(2)), rel=1e-5)


def test_ranking_metrics_of_a_hand_made_similarity_matrix():
  similarity = np.eye(12)
  similarity[1, [5, 7]] = 2  # two above the relevant one: rank 3
  similarity[2] = 5
  similarity[2, 2] = 1  # every other above: rank 12, outside the top 10
  similarity[3, 4] = 1  # a tie ranks above: rank 2
  ranks = np.array([1, 3, 12, 2] + [1] * 8)
  metrics = diagonal_metrics(similarity)
  in_top = ranks <= 10
  assert metrics["mrr_at_10"] == pytest.approx((1 + 1 / 3 + 0 + 1 / 2 + 8) / 12)
  assert metrics["ndcg_at_10"] == pytest.approx((1 + 1 / 2 + 0 + 1 / np.log2(3) + 8) / 12)
  assert metrics["recall_at_1"] == pytest.approx(9 / 12)
  assert metrics["recall_at_10"] == pytest.approx(in_top.mean()) == pytest.approx(11 / 12)
  # A model that scores everything alike ranks every relevant one last.
  flat = diagonal_metrics(np.zeros((12, 12)))
  assert flat["recall_at_10"] == 0 and flat["mrr_at_10"] == 0


# ---------------------------------------------------------------------------------------------
# The task on a tiny encoder.

TINY = EncoderConfig(vocab_size=40, d_model=32, n_heads=4, d_ff=48, n_layers=2, max_len=16,
                     dropout=0.0)


def _task(**kwargs) -> ContrastiveTask:
  return ContrastiveTask(sentence_model(TINY, kwargs.pop("pooling", "mean")),
                         kwargs.pop("loss", RankingLoss()), **kwargs)


def _params(task):
  return nn.unbox(task.init(jax.random.PRNGKey(0), 12))


def _tokens(rng, rows, seq=12):
  """Random ids 1 … 39, each row padded (0) after a random length of 3 to seq."""
  ids = rng.integers(1, 40, (rows, seq))
  lengths = rng.integers(3, seq + 1, rows)
  return np.where(np.arange(seq)[None] < lengths[:, None], ids, 0).astype(np.int32)


def _packed(rows: dict, seq: int = 12, shards: int = 1, chunks: int = 1) -> dict:
  """The pairs `rows` ({'anchor': [b, seq], …}) as one packed batch, as the pipeline packs it."""
  packer = packed_pairs.PairPacker(packed_pairs.text_lengths(rows, TINY.pad_id), seq,
                                   TINY.pad_id, len(rows["anchor"]), shards, chunks)
  return packer(np.arange(len(rows["anchor"])), rows, 0)


def _pairs(seed: int, b: int = 8) -> dict:
  rng = np.random.default_rng(seed)
  return {"anchor": _tokens(rng, b), "positive": _tokens(rng, b), "negative": _tokens(rng, b),
          "has_negative": np.array([1, 1, 0, 1, 0, 1, 1, 1], np.uint8)[:b]}


def test_a_packed_batch_gives_the_loss_and_gradient_of_each_text_encoded_alone():
  rows, loss = _pairs(0), RankingLoss(symmetric=True, dims=(32, 8))
  # a pad id within a text (a literal "[PAD]") is the text's, as its tokenizer's mask has it
  rows["anchor"][0, 5] = TINY.pad_id
  rows["anchor"][0, 6] = 7
  task = _task(loss=loss, eval_pairs=2)
  params, key = _params(task), jax.random.PRNGKey(1)
  batch = _packed(rows)
  assert len(batch["tokens"]) < 24  # the 22 texts share rows
  lengths = packed_pairs.text_lengths(rows, TINY.pad_id)
  assert (batch["segment_ids"] > 0).sum() == sum(n.sum() for n in lengths.values())

  def alone(params):
    texts = [task.embed(params, (rows[name],)) for name in ("anchor", "positive", "negative")]
    return loss(*texts, rows["has_negative"])

  packed_loss, packed_grads = jax.jit(jax.value_and_grad(task.loss_sum))(params, batch, key)
  alone_loss, alone_grads = jax.value_and_grad(alone)(params)
  assert float(packed_loss) == pytest.approx(float(alone_loss), rel=1e-6)
  assert _norm(alone_grads) > 1e-2  # a gradient to compare
  chex.assert_trees_all_close(packed_grads, alone_grads, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunks", [2, 4])
def test_gradcache_gives_the_plain_loss_and_gradient(chunks):
  batch = _packed(_pairs(0), chunks=chunks)
  assert len(batch["tokens"]) % chunks == 0
  loss = RankingLoss(symmetric=True, dims=(32, 8))
  plain, cached = _task(loss=loss, eval_pairs=2), _task(loss=loss, eval_pairs=2, chunks=chunks)
  params, key = _params(plain), jax.random.PRNGKey(1)
  grad = lambda task: jax.jit(jax.value_and_grad(task.loss_sum))(params, batch, key)
  (plain_loss, plain_grads), (cached_loss, cached_grads) = grad(plain), grad(cached)
  assert float(cached_loss) == pytest.approx(float(plain_loss), rel=1e-6)
  assert _norm(plain_grads) > 1e-2  # a gradient to compare
  # JAX 0.12's XLA sums the chunks' products in another order: 1 of 1,024 weights' gradients
  # then differs by 1.2e-5 (a float32 rounding of a gradient near 0)
  chex.assert_trees_all_close(cached_grads, plain_grads, atol=3e-5, rtol=1e-5)


def _norm(tree) -> float:
  return float(jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(tree))))


def test_the_held_out_embeddings_are_put_together_over_packed_padded_batches():
  rng = np.random.default_rng(1)
  rows = {"anchor": _tokens(rng, 5), "positive": _tokens(rng, 5)}
  task = _task(eval_pairs=5)
  params = _params(task)
  packed = packed_pairs.pack_held_out(rows, TINY.pad_id, 12)
  assert len(packed["tokens"]) < 10  # texts share rows
  batches = pipeline.eval_batches(packed, 2, {"tokens": 0, "segment_ids": 0, "positions": 0,
                                              "target": -1})
  assert (batches[-1]["target"][-1] == -1).all() or len(packed["tokens"]) % 2 == 0
  sums = evaluate(jax.jit(task.eval_sums), params, batches)
  assert sums["count"] == 5
  for name in ("anchor", "positive"):  # each text as if alone, in its pair's place
    np.testing.assert_allclose(sums[name + "s"], task.embed(params, (rows[name],)), atol=1e-6)
  metrics = task.eval_metrics(sums)
  similarity = _unit(sums["anchors"]) @ _unit(sums["positives"]).T
  assert metrics["mrr_at_10"] == pytest.approx(
      diagonal_metrics(similarity)["mrr_at_10"])
  assert metrics["loss"] == pytest.approx(_ce_sum(20 * similarity) / 5, rel=1e-6)
  assert metrics["random_mrr_at_10"] == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 4 + 1 / 5) / 5)


def test_cls_pooling_takes_the_first_token_and_mean_pooling_leaves_padding_out():
  rng = np.random.default_rng(2)
  tokens = _tokens(rng, 3)
  mean, cls = _task(eval_pairs=2), _task(eval_pairs=2, pooling="cls")
  params = _params(mean)
  alone = [mean.embed(params, (tokens[i:i + 1, :int((tokens[i] > 0).sum())],)) for i in range(3)]
  np.testing.assert_allclose(mean.embed(params, (tokens,)), np.concatenate(alone), atol=1e-5)
  assert not np.allclose(cls.embed(params, (tokens,)), mean.embed(params, (tokens,)))


# ---------------------------------------------------------------------------------------------
# Runs from a tiny Hugging Face BERT.

# The wordpiece vocabulary of tests/hf_models holds these as whole words: a pair shares its
# topic, among distractors (digits and symbols) drawn for each text.
TOPICS = (list("abcdefghijklmnopqrstuvwxyz") +
          "the ab br do ef fo ij ju la ov qu abcd brow dog efgh fox jump lazy over quic brown "
          "jumps quick".split())
DISTRACTORS = list("0123456789!%*+-/<=>?")


def _text(rng, topic, words=6):
  text = list(rng.choice(DISTRACTORS, words))
  text.insert(int(rng.integers(0, words + 1)), topic)
  return " ".join(text)


def _write_pairs(path, topics, rng, negatives=False):
  """Pairs of `topics`; with `negatives`, every other line adds a text of the next topic."""
  with open(path, "w") as f:
    for i, topic in enumerate(topics):
      line = {"anchor": _text(rng, topic), "positive": _text(rng, topic)}
      if negatives and i % 2:
        line["negative"] = _text(rng, TOPICS[(TOPICS.index(topic) + 1) % len(TOPICS)])
      f.write(json.dumps(line) + "\n")
  return str(path)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from tests import hf_models
  return hf_models.write(tmp_path_factory.mktemp("bert"), "bert")


@pytest.fixture(scope="module")
def topic_pairs(tmp_path_factory):
  """(train.jsonl, eval.jsonl): 320 training pairs of random topics, every other one with a
  hard negative, and 40 held out of distinct topics."""
  directory, rng = tmp_path_factory.mktemp("pairs"), np.random.default_rng(0)
  train = _write_pairs(directory / "train.jsonl", rng.choice(TOPICS, 320), rng, negatives=True)
  eval_ = _write_pairs(directory / "eval.jsonl", rng.choice(TOPICS, 40, replace=False), rng)
  return train, eval_


RUN = {"train.seq_len": 16, "train.batch_size": 16, "train.num_steps": 80,
       "train.eval_every": 40, "train.checkpoint_every": 80, "train.log_every": 10,
       "optim.learning_rate": 5e-3, "optim.warmup_steps": 4}


def _config(pairs, hf_dir, **fields):
  config = embed_config.get_config()
  config.data.train, config.data.eval = pairs
  config.init.hf = hf_dir
  for name, value in {**RUN, **fields}.items():
    section, field = name.split(".")
    config[section][field] = value
  return config


def _overrides(config_fields: dict) -> list[str]:
  return [f"--config.{name}={value}" for name, value in config_fields.items()]


@pytest.fixture(scope="module")
def tuned(topic_pairs, hf_dir, tmp_path_factory):
  """(workdir, the program's result): GradCache, hard negatives and Matryoshka prefixes, as a
  run of the program."""
  workdir = str(tmp_path_factory.mktemp("tuned") / "run")
  return workdir, runs.train(workdir, *_overrides({
      "data.train": topic_pairs[0], "data.eval": topic_pairs[1], "init.hf": hf_dir, **RUN,
      "task.cached": True, "task.mini_batch": 8, "task.matryoshka_dims": "32,16"}),
      config=os.path.join(runs.ROOT, "configs", "embed.py"))


def test_fine_tuning_ranks_the_held_out_pairs_better_than_the_start(tuned):
  workdir, result = tuned
  assert "320 training and 40 held-out" in result.stderr
  assert "pairs (with hard negatives)" in result.stderr
  records = runs.read_metrics(os.path.join(workdir, "metrics.jsonl"))
  # The start's figures, evaluated at step 0 (configs/embed.py: train.eval_at_start).
  start, *_, final = [r for r in records if r["split"] == "eval"]
  assert start["step"] == 0
  print(f"MRR@10 {start['mrr_at_10']:.3f} -> {final['mrr_at_10']:.3f}, recall@1 "
        f"{start['recall_at_1']:.3f} -> {final['recall_at_1']:.3f}")
  assert final["step"] == 80
  assert final["mrr_at_10"] > start["mrr_at_10"] + 0.3
  assert final["mrr_at_10_dim_16"] > start["mrr_at_10"]
  assert final["loss"] < start["loss"]
  assert final["random_mrr_at_10"] == pytest.approx(sum(1 / r for r in range(1, 11)) / 40)
  said = result.stdout.strip().splitlines()  # the start's figures, then the end's
  assert said[0].startswith(f"step 0, before training: eval MRR@10 {start['mrr_at_10']:.3f}")
  assert said[-1].startswith("step 80: eval MRR@10")

  # An exporter reads the encoder where classify's is, and the embedding's settings.
  from train.run.load import load_params, recorded_encoder_config
  init_for = lambda meta: lambda: sentence_model(recorded_encoder_config(meta)).init(
      jax.random.PRNGKey(0), jnp.ones((1, 1), jnp.int32))["params"]
  params, meta = load_params(workdir, init_for)
  assert set(params) == {"encoder"}
  assert {k: meta[k] for k in ("pooling", "normalize", "matryoshka_dims", "similarity",
                               "family")} == {
      "pooling": "mean", "normalize": True, "matryoshka_dims": [32, 16],
      "similarity": "cosine", "family": "bert"}


def _one_text_a_row(model, params, ids, pad_id) -> np.ndarray:
  """The embeddings the step's model gives padded rows of prepared ids, a text a row."""
  ids = jnp.asarray(ids)
  segment_ids = (ids != pad_id).astype(jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  return np.asarray(model.apply({"params": params}, ids, segment_ids, positions)[:, 0])


def _held_out_texts(topic_pairs) -> list[str]:
  lines = [json.loads(line) for line in open(topic_pairs[1])]
  return [line[name] for line in lines[:12] for name in ("anchor", "positive")]


def test_the_run_embeds_texts_as_it_embedded_its_prepared_pairs(tuned, topic_pairs):
  # The run read back (train.embed --model WORKDIR, the exports) against the model the step
  # ran, on the ids the run prepared from the same held-out texts.
  from train.run.load import load_params, recorded_encoder_config
  workdir = tuned[0]
  encoder = contrastive.sentence_encoder(workdir)
  params, meta = load_params(workdir, lambda meta: lambda: sentence_model(
      recorded_encoder_config(meta)).init(jax.random.PRNGKey(0), jnp.ones((1, 1), jnp.int32))[
          "params"])
  ids = contrastive.load_pairs(os.path.join(workdir, "data"))["eval"]
  cfg = recorded_encoder_config(meta)
  stepped = _one_text_a_row(sentence_model(cfg, "mean"), params, ids["anchor"][:12], cfg.pad_id)
  texts = _held_out_texts(topic_pairs)[::2]
  got = encoder(texts)
  np.testing.assert_allclose(got, stepped / np.linalg.norm(stepped, axis=1, keepdims=True),
                             atol=1e-5)
  assert encoder.max_seq_length == RUN["train.seq_len"] and encoder.similarity == "cosine"


def test_the_run_exports_a_sentence_transformers_folder_that_gives_its_embeddings(
    tuned, topic_pairs, tmp_path):
  st = pytest.importorskip("sentence_transformers")
  from flax_encoder.embeddings import SentenceEncoder
  from train.outputs import embed
  from train.outputs.export import main as export_main
  workdir, out = tuned[0], str(tmp_path / "folder")
  assert export_main(["--workdir", workdir, "--layout", "sentence-transformers",
                      "--out", out]) == 0
  texts = _held_out_texts(topic_pairs) + ["a text far longer than the run's sixteen ids, which "
                                          "both cut where the run cut its pairs"]
  want = contrastive.sentence_encoder(workdir)(texts)
  theirs = st.SentenceTransformer(out, device="cpu")
  got = theirs.encode(texts)
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert np.min(np.sum(got * want, axis=1)) >= 0.99999
  assert theirs.max_seq_length == RUN["train.seq_len"]
  np.testing.assert_allclose(SentenceEncoder.load(out)(texts), want, atol=1e-5)
  # python -m train.embed --model WORKDIR: the run's own vectors, the folder's
  source = tmp_path / "texts.txt"
  source.write_text("\n".join(texts) + "\n")
  embed.embed(workdir, str(source), str(tmp_path / "e.npy"))
  np.testing.assert_allclose(np.load(tmp_path / "e.npy"), got, atol=1e-5)


def test_the_run_exports_its_encoder_alone_as_the_bare_model_with_its_start_pooler(
    tuned, hf_dir, tmp_path):
  import torch
  import transformers
  from train.outputs.export import main as export_main
  workdir, out = tuned[0], str(tmp_path / "hf")
  assert export_main(["--workdir", workdir, "--layout", "hf", "--out", out]) == 0
  model, info = transformers.AutoModel.from_pretrained(out, output_loading_info=True)
  assert type(model).__name__ == "BertModel" and not info["missing_keys"], info
  start = transformers.AutoModel.from_pretrained(hf_dir)
  torch.testing.assert_close(model.pooler.dense.weight, start.pooler.dense.weight)
  tokens = np.asarray(contrastive.load_pairs(os.path.join(workdir, "data"))["eval"]["anchor"][:4])
  with torch.no_grad():
    hidden = model(torch.as_tensor(tokens, dtype=torch.long),
                   attention_mask=torch.as_tensor(tokens != 0)).last_hidden_state.numpy()
  assert not np.allclose(hidden, start(torch.as_tensor(tokens, dtype=torch.long),
                                       attention_mask=torch.as_tensor(tokens != 0))
                         .last_hidden_state.detach().numpy(), atol=1e-3)  # the trained one
  from train.run.load import load_encoder
  cfg, variables = load_encoder(workdir)
  from flax_encoder import Encoder
  ours = np.asarray(Encoder(cfg).apply(variables, jnp.asarray(tokens)))
  real = tokens != 0
  np.testing.assert_allclose(hidden[real], ours[real], atol=1e-5)


def test_a_contrastive_run_resumes_exactly(topic_pairs, hf_dir, tmp_path, capfd):
  # The run from its checkpoint at step 4, as a run stopped there resumes, against the run
  # that went on: the same losses, held-out ranking and parameters, bit for bit.
  from train.run.load import load_encoder
  config = _config(topic_pairs, hf_dir, **{
      "train.num_steps": 8, "train.checkpoint_every": 4, "train.eval_every": 4,
      "train.keep_checkpoints": 2, "task.cached": True, "task.mini_batch": 8})
  straight, resumed = runs.straight_and_resumed(config, tmp_path, capfd)
  assert runs.losses(resumed) == runs.losses(straight)
  evals = lambda workdir: {r["step"]: r["mrr_at_10"] for r in runs.read_metrics(
      os.path.join(workdir, "metrics.jsonl")) if r["split"] == "eval"}
  assert evals(resumed) == evals(straight)
  chex.assert_trees_all_equal(load_encoder(resumed)[1], load_encoder(straight)[1])


# a family's architecture (the paper's is none): only its ids keep it from being exported
DISTILBERT = {"model.position_embedding": "learned", "model.embedding_scale": False,
              "model.embedding_norm": True, "model.final_norm": False,
              "model.layer_norm_eps": 1e-12, "model.activation": "gelu"}


def test_a_run_from_scratch_embeds_its_own_ids_and_is_no_sentence_transformers_folder(
    topic_pairs, tmp_path, capsys):
  # bytes ids with this project's offset, no special ids around a text: embedded as prepared;
  # sentence-transformers would have no tokenizer to read them with
  from train import loop
  from train.outputs.export import main as export_main
  from train.run.load import load_params, recorded_encoder_config
  config = _config(topic_pairs, None, **{
      "train.num_steps": 2, "train.eval_every": 2, "train.checkpoint_every": 2,
      "data.tokenizer": "bytes", "model.d_model": 16, "model.n_heads": 2, "model.d_ff": 32,
      "model.n_layers": 1, "model.max_len": 32, **DISTILBERT})
  workdir = str(tmp_path / "run")
  assert loop.run(config, workdir) == 0
  encoder = contrastive.sentence_encoder(workdir)
  params, meta = load_params(workdir, lambda meta: lambda: sentence_model(
      recorded_encoder_config(meta)).init(jax.random.PRNGKey(0), jnp.ones((1, 1), jnp.int32))[
          "params"])
  ids = contrastive.load_pairs(os.path.join(workdir, "data"))["eval"]["anchor"][:6]
  cfg = recorded_encoder_config(meta)
  stepped = _one_text_a_row(sentence_model(cfg), params, ids, cfg.pad_id)
  np.testing.assert_allclose(encoder(_held_out_texts(topic_pairs)[:12:2]),
                             stepped / np.linalg.norm(stepped, axis=1, keepdims=True), atol=1e-5)
  capsys.readouterr()
  out = str(tmp_path / "folder")
  assert export_main(["--workdir", workdir, "--layout", "sentence-transformers",
                      "--out", out]) == 2
  err = capsys.readouterr().err
  assert err.startswith("export: error: --layout sentence-transformers: the run's ids are this "
                        "project's own (config.data.tokenizer='bytes')") and err.count("\n") == 1
  assert not os.path.exists(out)


@pytest.mark.parametrize("modules, said", [
    (("cls",), "config.task.pooling: 'mean', but config.init.hf {} pools by 'cls' (its Pooling "
               "module); set config.task.pooling=cls"),
    (("max",), "config.init.hf: {} pools by max (its Pooling module), expected one of ('mean', "
               "'cls')"),
    (("mean", "dense"), "config.init.hf: {} has a Dense module after its pooling (2_Dense), "
                        "which contrastive fine-tuning neither trains nor exports"),
    (("mean",), None)])
def test_a_sentence_transformers_start_is_fine_tuned_as_the_embeddings_it_gives(
    modules, said, topic_pairs, hf_dir, tmp_path):
  st = pytest.importorskip("sentence_transformers")
  from sentence_transformers.base.modules import Dense, Transformer
  from sentence_transformers.sentence_transformer.modules import Pooling

  from train import tasks
  folder = str(tmp_path / "st")
  layers = [Transformer(hf_dir), Pooling(32, pooling_mode=modules[0])]
  layers += [Dense(32, 8)] if "dense" in modules else []
  st.SentenceTransformer(modules=layers, device="cpu").save(folder)
  config = _config(topic_pairs, folder)
  if said is None:
    tasks.checked(config)
    return
  with pytest.raises(RunError) as e:
    tasks.checked(config)
  assert str(e.value).startswith(said.format(folder)) and "\n" not in str(e.value)


BAD_LINES = [
    ({"anchor": "a b", "text": "c d"}, "'positive': no such field, expected a non-empty string"),
    ({"anchor": 7, "positive": "c d"}, "'anchor': got 7, expected a non-empty string"),
    ({"anchor": "a", "positive": "b", "negative": ["c", "d"]},
     "'negative': a list of 2, expected one text (this task takes one negative a line: mine "
     "with --num-negatives 1)"),
    ({"anchor": "a", "positive": "b", "negative": [3]},
     "'negative': got 3, expected a non-empty string"),
    ({"anchor": "  ", "positive": "b"}, "'anchor': got '  ', expected a non-empty string"),
]


@pytest.mark.parametrize("line,said", BAD_LINES)
def test_a_bad_line_is_one_line_naming_file_line_and_field(line, said, hf_dir, tmp_path):
  good = json.dumps({"anchor": "a 1 2", "positive": "a 3 4"})
  train = tmp_path / "train.jsonl"
  train.write_text(good + "\n" + good + "\n" + json.dumps(line) + "\n")
  with pytest.raises(RunError) as error:
    contrastive.setup(_config((str(train), str(train)), hf_dir), str(tmp_path / "w"), Resume())
  assert str(error.value) == f"{train}:3: {said}"


def test_the_program_says_a_bad_line_in_one_line(hf_dir, tmp_path):
  train = tmp_path / "train.jsonl"
  train.write_text(json.dumps({"anchor": "a b", "positive": "c d"}) + "\n{\"anchor\": \"x\"}\n")
  result = runs.train(str(tmp_path / "w"), f"--config.data.train={train}",
                      f"--config.data.eval={train}", f"--config.init.hf={hf_dir}",
                      config=os.path.join(runs.ROOT, "configs", "embed.py"), check=False)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: {train}:2: 'positive': no such field, expected a non-empty string")


@pytest.mark.parametrize("fields,said", [
    ({"train.grad_accum_steps": 2}, "config.train.grad_accum_steps: 2, expected 1"),
    ({"task.cached": True, "task.mini_batch": 5},
     "config.task.mini_batch: 5, expected a divisor of config.train.batch_size (16)"),
    ({"task.matryoshka_dims": "32,x"}, "config.task.matryoshka_dims: '32,x', expected a string"),
    ({"task.matryoshka_dims": "64,16"},
     "config.task.matryoshka_dims: '64,16', expected sizes of at most the encoder's d_model "
     "(32)"),
    ({"task.pooling": "max"}, "config.task.pooling: 'max', expected one of ('mean', 'cls')"),
    ({"train.batch_size": 1}, "config.train.batch_size: 1, expected at least 2"),
])
def test_a_bad_setting_is_one_line_naming_the_field(fields, said, topic_pairs, hf_dir, tmp_path):
  from train import tasks
  config = _config(topic_pairs, hf_dir, **fields)
  with pytest.raises(RunError, match="^" + re.escape(said)):
    tasks.checked(config)
    contrastive.setup(config, str(tmp_path), Resume())


def _st_folder(path, hf_dir, max_seq_length: int) -> str:
  st = pytest.importorskip("sentence_transformers")
  from sentence_transformers.base.modules import Transformer
  from sentence_transformers.sentence_transformer.modules import Pooling
  st.SentenceTransformer(modules=[Transformer(hf_dir, max_seq_length=max_seq_length),
                                  Pooling(32, pooling_mode="mean")], device="cpu").save(str(path))
  return str(path)


def test_a_run_from_a_folder_takes_its_max_seq_length_and_trains_one_epoch_unless_asked(
    topic_pairs, tmp_path, capfd):
  pytest.importorskip("torch")
  pytest.importorskip("sentence_transformers")
  from tests import hf_models
  from train import tasks
  long = hf_models.write(tmp_path / "long", "bert", max_position_embeddings=1024)

  def resolved(folder, **train):
    config = embed_config.get_config()
    config.data.train, config.data.eval = topic_pairs
    config.init.hf = folder
    config.train.update(train)
    capfd.readouterr()
    tasks.checked(config)
    return config.train.seq_len, config.train.epochs, capfd.readouterr().err

  folder = _st_folder(tmp_path / "st", long, 40)
  assert resolved(folder) == (40, 1, f"config.train.seq_len: 40, the max_seq_length of "
                                     f"{folder}; config.train.epochs: 1, the default from a "
                                     f"pretrained start\n")
  assert resolved(_st_folder(tmp_path / "st1000", long, 1000))[:2] == (512, 1)  # capped
  assert resolved(folder, seq_len=24, num_steps=5)[:2] == (24, None)  # as asked, said nothing
  assert resolved(None) == (128, None, "config.train.seq_len: 128, the default\n")  # scratch


def test_an_export_says_the_runs_max_seq_length_where_its_start_had_another(
    topic_pairs, hf_dir, tmp_path, capfd):
  from train.outputs.export import main as export_main
  folder = _st_folder(tmp_path / "st", hf_dir, 40)
  workdir, out = str(tmp_path / "run"), str(tmp_path / "out")
  runs.train(workdir, *_overrides({"data.train": topic_pairs[0], "data.eval": topic_pairs[1],
                                   "init.hf": folder, **RUN, "train.num_steps": 2}),
             config=os.path.join(runs.ROOT, "configs", "embed.py"))
  capfd.readouterr()
  assert export_main(["--workdir", workdir, "--layout", "sentence-transformers",
                      "--out", out]) == 0
  assert (f"export: max_seq_length 16, the run's config.train.seq_len (its start, {folder}, "
          f"had 40)") in capfd.readouterr().err
  with open(os.path.join(out, "sentence_bert_config.json")) as f:
    assert json.load(f)["max_seq_length"] == 16
