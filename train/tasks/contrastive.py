r"""Contrastive fine-tuning of sentence embeddings: anchors pulled to their positives and away
from every other text of the batch (sentence-transformers' MultipleNegativesRankingLoss).

  python -m train --config=configs/embed.py --workdir runs/embed \
      --config.data.train=pairs.jsonl --config.data.eval=held_out.jsonl \
      --config.init.hf=all-MiniLM-L6-v2    # a Hugging Face or sentence-transformers directory

Each line is {"anchor": str, "positive": str} and may add "negative": str (a hard negative).
The model is the encoder, then the mean over the real tokens (config.task.pooling="mean") or
the first token ("cls"); its parameters are {"encoder": …} alone, so a checkpoint's encoder is
read as classify's is. For a batch of B lines the loss is the cross-entropy of anchor i over
scale * cos(anchor i, positive j) for every j, target j = i; hard negatives add their B
columns (B x 2B); `symmetric` averages it with positive i over the anchors; with
`matryoshka_dims` it is summed over the embeddings' first d components (sentence-transformers'
MatryoshkaLoss, weights 1). With `cached` (GradCache, Gao et al. 2021) the batch is embedded
about `mini_batch` texts at a time without keeping activations, then back-propagated a chunk at
a time: the gradient of the whole batch's loss in the memory of one chunk.

A training batch is packed (train.tasks.packed_pairs): each device's texts lie several to a row
of seq_len ids, each encoded and pooled as if alone, so that a step computes about the ids
the texts have rather than batch x seq_len of them.

Evaluation ranks each held-out anchor against every held-out positive (the first
config.data.eval_pairs lines), not only those of its batch: MRR@10, nDCG@10, recall@1 and
@10, and the loss over the whole set.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
from collections.abc import Callable, Iterator
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder import EncoderConfig, families
from flax_encoder.embeddings import Pooling, SentenceEmbedding, SentenceModel, normalize
from flax_encoder.ranking import diagonal_metrics
from flax_encoder.tokenizer import Template, example_ids
from train.data import dataset, examples, sources
from train.errors import RunError
from train.files import sha256_bytes
from train.run import optim
from train.run.load import load_params, recorded_encoder_config
from train.task import FREE, Definition, Field, HFModel, Plots, Resume, Setup, boolean, choice
from train.task import integer, number, string
from train.tasks import finetune, packed_pairs, tokenizing
from train.tasks.start import opened, start_files_read, start_params, start_pooler

POOLINGS = ("mean", "cls")
FORMAT = "flax-encoder pairs 1"
TEXTS = ("anchor", "positive", "negative")
TOP = 10  # the cut-off of MRR, nDCG and the second recall


# ---------------------------------------------------------------------------------------------
# The model and the loss.


def sentence_model(cfg: EncoderConfig, pooling: str = "mean",
                   check_traced_ids: bool = True) -> SentenceEmbedding:
  """The model trained: the library's SentenceEmbedding of the encoder pooled by `pooling`
  (POOLINGS), float32, without the Normalize an export adds (the loss compares unit
  vectors)."""
  return SentenceEmbedding(SentenceModel(cfg, Pooling((pooling,))), check_traced_ids)


LOSSES = ("mnrl", "margin_mse", "kl")  # config.task.loss; the last two distil a teacher's


@dataclasses.dataclass(frozen=True)
class RankingLoss:
  """MultipleNegativesRankingLoss over cosine similarities times `scale`; `symmetric` averages
  it with the positives' over the anchors; `dims`: summed over those prefixes of the
  embeddings (Matryoshka), () the whole embedding alone."""

  scale: float = 20.0
  symmetric: bool = False
  dims: tuple[int, ...] = ()
  inputs = ("has_negative",)  # what it takes of the batch after the texts

  def __call__(self, anchors, positives, negatives=None, has_negative=None) -> jax.Array:
    """The loss summed over the B anchors of [B, d] embeddings; `negatives` [B, d] add their
    columns where `has_negative` [B] (default all) is true."""
    total = 0.0
    for d in self.dims or (None,):
      cut = lambda x: None if x is None else x[:, :d]
      total = total + self._one(cut(anchors), cut(positives), cut(negatives), has_negative)
    return total

  def _one(self, anchors, positives, negatives, has_negative) -> jax.Array:
    anchors, positives = normalize(anchors), normalize(positives)
    scores = self.scale * anchors @ positives.T  # [anchor, positive]
    candidates = scores
    if negatives is not None:
      hard = self.scale * anchors @ normalize(negatives).T  # [anchor, negative]
      if has_negative is not None:  # a line without one adds no column
        hard = jnp.where(jnp.asarray(has_negative, bool)[None, :], hard, -jnp.inf)
      candidates = jnp.concatenate([scores, hard], axis=1)
    targets = diagonal(scores)  # anchor i's score of positive i
    forward = cross_entropy_sum(candidates, targets)
    if not self.symmetric:
      return forward
    # sentence-transformers' symmetric loss: a positive is ranked among the anchors alone.
    return (forward + cross_entropy_sum(scores.T, targets)) / 2


def distillation(kind: str, student, teacher, temperature: float = 1.0) -> jax.Array:
  """A teacher's scores distilled, summed over the B lines of [B, 2] scores of each line's
  positive and negative, as sentence-transformers' losses of every model type compute it:
  "margin_mse", the squared error of the student's margin (the positive's score less the
  negative's) against the teacher's (MarginMSELoss); "kl", the KL divergence of the
  student's softmax over the two from the teacher's, both at `temperature`, times its square
  (DistillKLDivLoss)."""
  student, teacher = student.astype(jnp.float32), jnp.asarray(teacher, jnp.float32)
  if kind == "margin_mse":
    return jnp.sum(((student[:, 0] - student[:, 1]) - (teacher[:, 0] - teacher[:, 1])) ** 2)
  log_student = jax.nn.log_softmax(student / temperature, axis=1)
  target = jax.nn.softmax(teacher / temperature, axis=1)
  kl = jax.scipy.special.xlogy(target, target) - target * log_student  # 0 where target is 0
  return temperature ** 2 * jnp.sum(kl)


def pair_scores(anchors, positives, negatives) -> jax.Array:
  """[B, 2]: each anchor's dot product with its positive and with its negative."""
  return jnp.stack([jnp.sum(anchors * positives, -1), jnp.sum(anchors * negatives, -1)], 1)


@dataclasses.dataclass(frozen=True)
class DistillationLoss:
  """`distillation` of the dot products of the embeddings as the model gives them (unit
  vectors where `normalize`, as an export's Normalize makes them): sentence-transformers'
  default pairwise_dot_score."""

  kind: str
  normalize: bool = True
  temperature: float = 1.0
  scale: float = 20.0  # the held-out loss's (every positive ranked: eval_metrics), not this one's
  dims = ()
  inputs = ("teacher",)

  def __call__(self, anchors, positives, negatives, teacher) -> jax.Array:
    """The loss summed over the B anchors of [B, d] embeddings; `teacher` [B, 2]: its scores
    of each line's positive and negative."""
    if self.normalize:
      anchors, positives, negatives = map(normalize, (anchors, positives, negatives))
    return distillation(self.kind, pair_scores(anchors, positives, negatives), teacher,
                        self.temperature)


def diagonal(scores) -> jax.Array:
  """scores[i, i] of a square [B, B] matrix: each row summed with all but that entry masked
  to 0, the same values as jnp.diagonal. jnp.diagonal lowers to a gather inside a conditional
  (its platform-dependent lowering), and on a mesh the conditional holds the gather's
  collectives; XLA:CPU does not order those with the step's other collectives in an executable
  loaded from the persistent compilation cache, and devices that then run them in different
  orders wait on each other until XLA aborts the process."""
  return jnp.sum(jnp.where(jnp.eye(scores.shape[0], dtype=bool), scores, 0.0), axis=1)


def cross_entropy_sum(scores, target_scores) -> jax.Array:
  """The cross-entropy of each row of `scores` against its `target_scores` entry, summed."""
  return jnp.sum(jax.nn.logsumexp(scores, axis=1) - target_scores)


def _chunks(x, k: int):
  """[k * m, ...] -> [k, m, ...], chunk c holding rows c, c + k, …: a device's contiguous
  block of the batch holds rows of every chunk, so splitting needs no communication."""
  return jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)


def _unchunk(x):
  """The inverse of `_chunks`."""
  return jnp.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:])


# (params, rows: a tuple of arrays [n, ...], rng) -> [n, ...]
Embed = Callable[[object, tuple, jax.Array], jax.Array]


def cached(embed: Embed, chunks: int) -> Embed:
  """`embed` over all rows in `chunks` chunks, one at a time, keeping no activations:
  GradCache.

  The step differentiates the loss with jax.value_and_grad, which would keep every row's
  activations; a custom VJP instead runs the encoder forward chunk by chunk without them
  (the loss then takes its gradient w.r.t. the embeddings, [rows, d], cheaply), and its
  backward runs each chunk again under jax.vjp with that chunk's embedding gradient, summing
  the parameter gradients in a scan. Chunk c draws its dropout from fold_in(rng, c) in both
  passes, so they agree; without dropout the gradient is the uncached one."""

  def run_chunk(params, c, chunk, rng):
    return embed(params, chunk, jax.random.fold_in(rng, c))

  def split(rows):
    return jax.tree.map(lambda x: _chunks(x, chunks), rows)

  @jax.custom_vjp
  def embed_all(params, rows, rng):
    return _unchunk(jax.lax.map(lambda c: run_chunk(params, *c, rng),
                                (jnp.arange(chunks), split(rows))))

  def forward(params, rows, rng):
    return embed_all(params, rows, rng), (params, rows, rng)

  def backward(saved, grad_embeddings):
    params, rows, rng = saved

    def add(total, inputs):
      c, chunk, grad_chunk = inputs
      _, vjp = jax.vjp(lambda p: run_chunk(p, c, chunk, rng), params)
      return jax.tree.map(lambda t, g: t + g.astype(jnp.float32), total, vjp(grad_chunk)[0]), None

    zero = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)  # bf16 sums drift
    total, _ = jax.lax.scan(add, zero, (jnp.arange(chunks), split(rows),
                                        _chunks(grad_embeddings, chunks)))
    return jax.tree.map(lambda t, p: t.astype(p.dtype), total, params), None, None

  embed_all.defvjp(forward, backward)
  return embed_all


# ---------------------------------------------------------------------------------------------
# Ranking the held-out pairs.


def _unit_np(x: np.ndarray) -> np.ndarray:
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


# ---------------------------------------------------------------------------------------------
# The task as the step runs it.


@dataclasses.dataclass(frozen=True)
class PairsTask:
  """What the tasks of packed pairs share (this one's, train.tasks.sparse's and
  train.tasks.multi_vector's): the model that embeds packed rows, with dropout where
  training, and a loss per anchor."""

  model: nn.Module

  def init(self, rng: jax.Array, seq_len: int):
    return self.model.init(rng, jnp.ones((1, seq_len), jnp.int32))["params"]

  def batch(self, rows: dict, key: jax.Array) -> dict:
    return rows  # nothing drawn

  def embed(self, params, rows: tuple, dropout_rng: jax.Array | None = None):
    """The model of `rows`: (tokens,) or packed (tokens, segment_ids, positions)."""
    if dropout_rng is None:
      return self.model.apply({"params": params}, *rows)
    return self.model.apply({"params": params}, *rows, deterministic=False,
                            rngs={"dropout": dropout_rng})

  def loss_count(self, batch: dict) -> jax.Array:
    return jnp.asarray(batch["anchor_slot"].shape[0], jnp.float32)


@dataclasses.dataclass(frozen=True)
class ContrastiveTask(PairsTask):
  """Contrastive training as `train.run.step` runs it (`train.task.Task`). A training batch
  is packed (train.tasks.packed_pairs): 'tokens', 'segment_ids' and 'positions' [rows, seq]
  hold the texts, and 'anchor_slot', 'positive_slot' [batch] say where each pair's texts are
  among the rows' segments; 'negative_slot' and 'has_negative' [batch] where the training
  file has hard negatives. A held-out batch is rows of the `eval_pairs` pairs packed once
  (packed_pairs.pack_held_out): 'tokens', 'segment_ids', 'positions' and 'target' [rows,
  segments], the text each segment is (anchor i: i, positive i: eval_pairs + i, -1 none)."""

  model: SentenceEmbedding
  loss: RankingLoss | DistillationLoss
  eval_pairs: int
  chunks: int | None = None  # GradCache's: the rows embedded in this many chunks; None: at once

  def loss_sum(self, params, batch: dict, dropout_rng: jax.Array) -> jax.Array:
    rows = (batch["tokens"], batch["segment_ids"], batch["positions"])
    embed = cached(self.embed, self.chunks) if self.chunks else self.embed
    pooled = embed(params, rows, dropout_rng)  # [rows, segments, d]
    flat = pooled.reshape(-1, pooled.shape[-1])
    texts = [flat[batch[f"{name}_slot"]] for name in TEXTS if f"{name}_slot" in batch]
    return self.loss(*texts, *(batch.get(name) for name in self.loss.inputs))

  def eval_sums(self, params, batch: dict) -> dict:
    """Each text's embedding at its row of [eval_pairs, d] arrays of anchors and positives
    (zeros elsewhere): the loop adds up the batches' sums, which puts every held-out
    embedding in place, so that eval_metrics can rank each anchor against all the positives."""
    pooled = self.embed(params, (batch["tokens"], batch["segment_ids"], batch["positions"]))
    pooled = pooled.reshape(-1, pooled.shape[-1])
    n, target = self.eval_pairs, batch["target"].reshape(-1)
    table = jnp.zeros((2 * n, pooled.shape[-1]), pooled.dtype).at[
        jnp.where(target >= 0, target, 2 * n)].add(pooled, mode="drop")  # past the end: none
    return {"anchors": table[:n], "positives": table[n:],
            "count": jnp.sum((target >= 0) & (target < n))}

  def eval_metrics(self, sums: dict) -> dict:
    """The ranking metrics of every held-out anchor against every held-out positive, the
    loss over them all (a softmax over every positive, without hard negatives), MRR@10 of
    each Matryoshka prefix, and MRR@10 of a random ranking (the baseline)."""
    anchors, positives = np.asarray(sums["anchors"]), np.asarray(sums["positives"])
    similarity = _unit_np(anchors) @ _unit_np(positives).T
    scores = self.loss.scale * similarity
    peak = scores.max(axis=1, keepdims=True)
    log_z = peak[:, 0] + np.log(np.sum(np.exp(scores - peak), axis=1))
    n = len(similarity)
    metrics = {"loss": float(np.mean(log_z - np.diagonal(scores))),
               **diagonal_metrics(similarity),
               "random_mrr_at_10": float(sum(1 / r for r in range(1, min(TOP, n) + 1)) / n)}
    for d in self.loss.dims:
      if d < anchors.shape[1]:
        prefix = _unit_np(anchors[:, :d]) @ _unit_np(positives[:, :d]).T
        metrics[f"mrr_at_10_dim_{d}"] = diagonal_metrics(prefix)["mrr_at_10"]
    return metrics

  @staticmethod
  def token_count(rows: dict) -> int:
    return int(rows["tokens"].size)  # the packed rows', padding included


# ---------------------------------------------------------------------------------------------
# The pairs, prepared once into WORKDIR/data.
#
#   {train,eval}.tokens.bin        the anchors' ids [n, seq_len], padded
#   {train,eval}.positive.bin      the positives'
#   train.negative.bin             the hard negatives' (all padding where a line has none) and
#   train.has_negative.bin         uint8 [n], where the training file has any
#   train.teacher.bin              float32 [n, 2]: a teacher's scores of each line's positive
#                                  and negative (distillation: config.task.loss)
#   dataset.json                   what examples.prepare_examples records, format FORMAT


def _text(record: dict, field: str, where: str, required: bool) -> str | None:
  value = record.get(field)
  if isinstance(value, list) and not required:  # a mined line's negatives (python -m train.mine)
    if len(value) != 1:
      raise RunError(f"{where}: {field!r}: a list of {len(value)}, expected one text (this "
                     f"task takes one negative a line: mine with --num-negatives 1)")
    value = value[0]
  if value is None and not required:
    return None
  if not isinstance(value, str) or not value.strip():
    got = "no such field" if field not in record else f"got {value!r}"[:60]
    raise RunError(f"{where}: {field!r}: {got}, expected a non-empty string")
  return value


def _pairs(source, fields: dict, teacher: dict | None = None) -> Iterator[tuple]:
  """(line number, anchor, positive, negative or None) of each line, checked; and, where
  `teacher` ({'scores': field, 'label': field}) is given, the teacher's scores of its positive
  and negative (`_teacher_scores`)."""
  for line, record in examples.records(source):
    where = f"{source.path}:{line}"
    texts = tuple(_text(record, fields[name], where, name != "negative") for name in TEXTS)
    yield (line, *texts) if teacher is None else (
        line, *texts, _teacher_scores(record, teacher, where, texts[2] is not None))


def _teacher_scores(record: dict, teacher: dict, where: str, has_negative: bool
                    ) -> tuple[float, float]:
  """(the positive's score, the negative's) a line gives under teacher['scores'] (a list of
  the two), or its margin under teacher['label'] (the positive's score less the negative's,
  as sentence-transformers' MarginMSELoss takes a label): (margin, 0)."""
  scores, label = record.get(teacher["scores"]), record.get(teacher["label"])
  finite = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
  if not has_negative:
    raise RunError(f"{where}: no {teacher['negative']!r}, expected a negative on every line "
                   f"of a distillation (config.task.loss={teacher['loss']!r})")
  if isinstance(scores, list) and len(scores) >= 2 and all(finite(x) for x in scores[:2]):
    return float(scores[0]), float(scores[1])  # a mined line's: the positive's, then the first
  if scores is None and finite(label) and teacher["loss"] == "margin_mse":
    return float(label), 0.0
  got = f"{teacher['scores']!r}: {scores!r}"[:80] if scores is not None else (
      f"{teacher['label']!r}: {label!r}"[:80] if label is not None else "neither")
  margin = f", or {teacher['label']!r}: the margin" if teacher["loss"] == "margin_mse" else ""
  raise RunError(f"{where}: {got}, expected {teacher['scores']!r}: the teacher's scores of the "
                 f"positive and the negative{margin} (config.task.loss={teacher['loss']!r})")


def _has_negatives(path: str, fields: dict) -> bool:
  """Whether any line of `path` has a hard negative (every line checked)."""
  found = False
  for *_, negative in _pairs(sources.Source(path), fields):
    found = found or negative is not None
  return found


def prepare_pairs(paths: dict, directory: str, tokenizer, tokenizer_file, seq_len: int,
                  fields: dict, pad_id: int, template=None, teacher: dict | None = None) -> dict:
  """Writes the pairs of `paths` {'train': …, 'eval': …} into `directory` (the layout above),
  each text laid out as the starting tokenizer lays out one text (`template`) and cut to
  `seq_len` ids, with the training lines' teacher scores where `teacher` (`_pairs`) is given;
  returns its dataset.json."""
  examples.check_ids(tokenizer, pad_id, (*template.start, *template.end) if template else ())
  dtype = examples.ids_dtype(tokenizer)
  negatives = {"train": _has_negatives(paths["train"], fields), "eval": False}

  def laid(ids):
    return example_ids(ids, None, seq_len, pad_id, template)

  splits = iter(paths)  # examples.write_splits encodes the splits in this order

  def encode(source, counts):
    split = next(splits)
    with_negatives, scored = negatives[split], teacher if split == "train" else None
    for chunk in examples.chunked(_pairs(source, fields, scored), examples.CHUNK,
                                  lambda e: e[1:4]):
      columns = {name: [line[1 + i] for line in chunk] for i, name in enumerate(TEXTS)}
      arrays = {}
      for name in TEXTS[:2] + (TEXTS[2:] if with_negatives else ()):
        texts = columns[name]
        # One id more than a row holds, so that example_ids knows what it truncates.
        encoded = tokenizer.encode_leading([t or "" for t in texts], seq_len + 1)
        rows = np.full((len(chunk), seq_len), pad_id, dtype)
        for i, (text, ids, line) in enumerate(zip(texts, encoded, chunk)):
          if text is None:
            continue
          row, truncated = laid(ids)
          rows[i, :len(row)] = row
          counts.truncated += truncated
          counts.tokenized(line[0], text, ids, tokenizer.unk_id)
        arrays["tokens" if name == "anchor" else name] = rows
      if with_negatives:
        arrays["has_negative"] = np.array([n is not None for n in columns["negative"]], np.uint8)
      if scored:
        arrays["teacher"] = np.array([line[4] for line in chunk], np.float32)
      counts.examples += len(chunk)
      yield arrays

  return examples.write_splits(paths, directory, tokenizer, tokenizer_file, encode,
                         "an anchor and a positive", {
                             "format": FORMAT, "label_kind": "pairs", "negatives": negatives,
                             "teacher": teacher,
                             "pad_id": pad_id, "seq_len": seq_len, "fields": fields,
                             "template": template.to_dict() if template else None,
                             "dtype": np.dtype(dtype).name})


def read_meta(directory: str) -> dict:
  """The dataset.json of prepared pairs."""
  return dataset.read_meta(directory, FORMAT)


def load_pairs(directory: str) -> dict:
  """{'train': rows, 'eval': rows} memory-mapped (the layout above), 'meta' (dataset.json)
  and 'identity' (its SHA-256)."""
  path = os.path.join(directory, "dataset.json")
  with open(path, "rb") as f:
    raw = f.read()
  meta = read_meta(directory)
  dtype, seq_len = np.dtype(meta["dtype"]), meta["seq_len"]
  loaded = {"meta": meta, "identity": sha256_bytes(raw)}
  for split, n in meta["examples"].items():
    read = lambda name, dtype, shape: np.memmap(os.path.join(directory, f"{split}.{name}.bin"),
                                                dtype, "r", shape=shape)
    rows = {"anchor": read("tokens", dtype, (n, seq_len)),
            "positive": read("positive", dtype, (n, seq_len))}
    if meta["negatives"][split]:
      rows["negative"] = read("negative", dtype, (n, seq_len))
      rows["has_negative"] = read("has_negative", np.uint8, (n,))
    if meta.get("teacher") and split == "train":
      rows["teacher"] = read("teacher", np.float32, (n, 2))
    loaded[split] = rows
  return loaded


def prepared_pairs(config, workdir: str, resume: Resume, paths: dict) -> finetune.Prepared:
  """The pairs of `paths` in WORKDIR/data, prepared unless they are there already for the same
  request, and the encoder's config."""
  fields = {name: config.data[f"{name}_field"] for name in TEXTS}
  seq_len = config.train.seq_len
  loss = config.task.get("loss", "mnrl")
  teacher = None if loss == "mnrl" else {
      "loss": loss, "scores": config.data.scores_field, "label": config.data.label_field,
      "negative": config.data.negative_field}
  return finetune.prepare(
      config, workdir, resume, paths, lambda record: [record.get(f) for f in fields.values()],
      lambda d, tokenizer, tokenizer_file, pad_id, template: prepare_pairs(
          paths, d, tokenizer, tokenizer_file, seq_len, fields, pad_id, template, teacher),
      {"format": FORMAT, "fields": fields, "teacher": teacher}, load=load_pairs)


# ---------------------------------------------------------------------------------------------
# What the loop needs.


def matryoshka_dims(value: str) -> tuple[int, ...] | None:
  """config.task.matryoshka_dims ("384,256,128", "" for none) as integers; None if it is not
  such a list."""
  if not isinstance(value, str):
    return None
  parts = [p.strip() for p in value.split(",") if p.strip()]
  if not all(p.isdigit() and int(p) > 0 for p in parts) or len(set(parts)) < len(parts):
    return None
  return tuple(int(p) for p in parts)


class HeldOut(NamedTuple):
  """The held-out pairs a task of pairs ranks: how many, their rows packed once
  (packed_pairs.pack_held_out), what pads their last batch, and what the run says of them."""
  count: int
  rows: dict
  fill: dict
  ranked: str


def held_out_pairs(config, prepared: finetune.Prepared) -> HeldOut:
  """The first config.data.eval_pairs held-out pairs of `prepared`, packed to be ranked."""
  loaded = prepared.loaded
  given = loaded["meta"]["examples"]["eval"]
  count = min(config.data.eval_pairs, given)
  rows = packed_pairs.pack_held_out(
      {name: loaded["eval"][name][:count] for name in ("anchor", "positive")}, prepared.pad_id,
      config.train.seq_len)
  return HeldOut(count, rows, {"tokens": prepared.pad_id, "segment_ids": 0, "positions": 0,
                               "target": -1},
                 f", the first {count} of them ranked" if count < given else "")


def gradcache_chunks(config, loaded: dict) -> int | None:
  """The chunks GradCache embeds a batch in (config.task.cached; None: at once), each of
  config.task.mini_batch texts on average."""
  texts = sum(name in loaded["train"] for name in TEXTS) * config.train.batch_size
  return texts // config.task.mini_batch if config.task.cached else None


def pair_packer(config, prepared: finetune.Prepared, chunks: int | None):
  """Shards -> the packer of the training batches (Setup.packer), rows a multiple of
  GradCache's `chunks`."""
  lengths = packed_pairs.text_lengths(prepared.loaded["train"], prepared.pad_id)
  return functools.partial(packed_pairs.PairPacker, lengths, config.train.seq_len,
                           prepared.pad_id, config.train.batch_size, multiple=chunks or 1,
                           teacher="teacher" in prepared.loaded["train"])


def setup(config, workdir: str, resume: Resume) -> Setup:
  """Contrastive fine-tuning on config.data.train, ranked on config.data.eval."""
  paths = {"train": config.data.train, "eval": config.data.eval}
  prepared = prepared_pairs(config, workdir, resume, paths)
  cfg, loaded = prepared.encoder, prepared.loaded
  dims = matryoshka_dims(config.task.matryoshka_dims)
  if any(d > cfg.d_model for d in dims):
    raise RunError(f"config.task.matryoshka_dims: {config.task.matryoshka_dims!r}, expected "
                   f"sizes of at most the encoder's d_model ({cfg.d_model})")
  held_out = held_out_pairs(config, prepared)
  count = held_out.count
  model = sentence_model(cfg, config.task.pooling, check_traced_ids=False)  # tokenized here
  chunks = gradcache_chunks(config, loaded)
  loss = (RankingLoss(float(config.task.scale), config.task.symmetric, dims)
          if config.task.loss == "mnrl" else
          DistillationLoss(config.task.loss, config.task.normalize,
                           float(config.task.temperature), float(config.task.scale)))
  task = ContrastiveTask(model, loss, count, chunks)
  negatives = "with hard negatives" if "negative" in loaded["train"] else "no hard negatives"
  if "teacher" in loaded["train"]:
    negatives += ", a teacher's scores"
  finetune.say_prepared(prepared, f"pairs ({negatives})", config.train.seq_len,
                        held_out.ranked)
  return Setup(task=task, encoder=cfg, train=loaded["train"], eval=held_out.rows,
               eval_fill=held_out.fill,
               record={"encoder": cfg.record(), "dataset": loaded["identity"],
                       "source": os.path.join(workdir, "data"),
                       "start": prepared.start.source, "family": prepared.start.family,
                       # what an exporter writes as sentence-transformers' modules
                       "pooling": config.task.pooling, "normalize": config.task.normalize,
                       "matryoshka_dims": list(dims), "similarity": "cosine",
                       "scale": float(config.task.scale)},
               start_params=start_params(prepared.start, cfg, config, 0),
               packer=pair_packer(config, prepared, chunks))


SEQ_LEN = 128  # config.train.seq_len where neither it nor a start says
MOST_SEQ_LEN = 512  # of a start's max_seq_length: a row's attention grows with its square


def defaults(config) -> None:
  """config.train.seq_len, where unset, from config.init.hf (`start_max_seq_length`, at most
  MOST_SEQ_LEN); the run's length, where neither num_steps nor epochs is set, one epoch from a
  pretrained start. Each said in one line (process 0)."""
  train, said = config.train, []
  if train.seq_len is None:
    length, whence = start_max_seq_length(config), "the default"
    if length:
      whence = f"the max_seq_length of {config.init.hf}"
      if length > MOST_SEQ_LEN:
        length, whence = MOST_SEQ_LEN, f"{whence} ({length}) capped at {MOST_SEQ_LEN}"
    train.seq_len = length or SEQ_LEN
    said.append(f"config.train.seq_len: {train.seq_len}, {whence}")
  said += one_epoch_from_a_start(config)
  if said and jax.process_index() == 0:
    print("; ".join(said), file=sys.stderr)


def one_epoch_from_a_start(config) -> list[str]:
  """The retrieval tasks' length where neither num_steps nor epochs is set: one epoch from a
  pretrained start (a published model trained long overfits the pairs), as said in a line
  ([] where nothing was set)."""
  train = config.train
  started = any(config.init.get(name) for name in optim.INITS)
  if train.num_steps is None and train.epochs is None and started:
    train.epochs = 1
    return ["config.train.epochs: 1, the default from a pretrained start"]
  return []


def start_max_seq_length(config) -> int | None:
  """The ids config.init.hf cuts a text to (flax_encoder.embeddings.read_max_seq_length), or
  None where there is no such directory or it does not say (loading it says what is wrong)."""
  from flax_encoder.embeddings import read_max_seq_length
  start = config.init.get("hf")
  if not start:
    return None
  try:
    directory = opened(start)
    positions = families.config_from_hf(directory.hf).max_len
    return read_max_seq_length(directory.module, positions, start_files_read(start))
  except (ValueError, TypeError, OSError):
    return None


def check(config) -> None:
  """The cross-field checks of a contrastive config (RunError naming the field)."""
  _check_start_modules(config)
  check_batch(config)
  task = config.task
  if task.loss != "mnrl":
    for name, value, plain in (("symmetric", task.symmetric, False),
                               ("matryoshka_dims", task.matryoshka_dims, "")):
      if value != plain:
        raise RunError(f"config.task.{name}: {value!r} with config.task.loss={task.loss!r}, "
                       f"expected {plain!r}: it shapes the ranking loss (mnrl), not a "
                       f"distillation")


def check_batch(config) -> None:
  """finetune's checks, and those of a batch of in-batch negatives (RunError naming the
  field): the contrastive, sparse and multi-vector tasks'."""
  finetune.check(config)
  train, task = config.train, config.task
  if train.batch_size < 2:
    raise RunError(f"config.train.batch_size: {train.batch_size}, expected at least 2: the "
                   f"other pairs of a batch are each anchor's negatives")
  if train.grad_accum_steps != 1:
    raise RunError(f"config.train.grad_accum_steps: {train.grad_accum_steps}, expected 1: "
                   f"microbatches would rank each anchor among its microbatch's pairs alone; "
                   f"set config.task.cached=True (GradCache) for a large batch in little memory")
  if task.cached and train.batch_size % task.mini_batch:
    raise RunError(f"config.task.mini_batch: {task.mini_batch}, expected a divisor of "
                   f"config.train.batch_size ({train.batch_size}) with config.task.cached")


def _check_start_modules(config) -> None:
  """A sentence-transformers folder as config.init.hf is fine-tuned as the embeddings it
  gives: by the pooling it has, and no module after it that this task does not train."""
  from flax_encoder import embeddings
  from flax_encoder.modules_json import transformer_folder
  start = config.init.get("hf")
  try:
    files = start_files_read(start) if start else None
    modules = (embeddings.read_modules(start, files) if start and transformer_folder(start, files)
               else [])
    pooling = embeddings.read_pooling(modules[0][1], files=files) if modules else None
  except ValueError:
    return  # loading the start says what is wrong with it, in one line
  if pooling is None:
    return
  modes = pooling.modes
  if len(modes) != 1 or modes[0] not in POOLINGS:
    raise RunError(f"config.init.hf: {start} pools by {', '.join(modes)} (its Pooling module), "
                   f"expected one of {POOLINGS}: the poolings contrastive fine-tuning computes")
  if modes[0] != config.task.pooling:
    raise RunError(f"config.task.pooling: {config.task.pooling!r}, but config.init.hf {start} "
                   f"pools by {modes[0]!r} (its Pooling module); set config.task.pooling="
                   f"{modes[0]} to fine-tune the embeddings it gives")
  dense = [os.path.basename(folder) for kind, folder in modules if kind == "Dense"]
  if dense:
    raise RunError(f"config.init.hf: {start} has a Dense module after its pooling ({dense[0]}), "
                   f"which contrastive fine-tuning neither trains nor exports; expected a "
                   f"Transformer, a Pooling and at most a Normalize")


def summary(metrics: dict) -> str:
  return (f"eval MRR@10 {metrics['mrr_at_10']:.3f} (random ranking "
          f"{metrics['random_mrr_at_10']:.3f}), nDCG@10 {metrics['ndcg_at_10']:.3f}, recall@1 "
          f"{metrics['recall_at_1']:.3f}, recall@10 {metrics['recall_at_10']:.3f}, eval loss "
          f"{metrics['loss']:.3f}")


# ---------------------------------------------------------------------------------------------
# The run read back: train.embed --model WORKDIR, train.export --layout hf or
# sentence-transformers.


def read_run(workdir: str, model_of, **settings) -> tuple[EncoderConfig, dict, dict]:
  """(the encoder's config, run as `settings` say; the parameters; the checkpoint's record) of
  the newest verified checkpoint of the run of pairs `workdir`, whose model `model_of(record)`
  is (the pair tasks' read_trained)."""
  def init_for(record):
    model = model_of(record)
    return lambda: model.init(jax.random.PRNGKey(0), jnp.ones((1, 1), jnp.int32))["params"]

  params, record = load_params(workdir, init_for)
  return recorded_encoder_config(record, **settings), params, record


def read_trained(workdir: str, **settings) -> tuple[EncoderConfig, dict, dict]:
  """`read_run` of the contrastive run `workdir`: the parameters {'encoder': …}."""
  return read_run(workdir, lambda record: sentence_model(recorded_encoder_config(record),
                                                         record["pooling"]), **settings)


def sentence_encoder(workdir: str, dtype: str = "float32"):
  """The run as a SentenceEncoder computed in `dtype`: its encoder, its pooling and (with
  config.task.normalize) a Normalize; its tokenizer and template, texts cut to its seq_len,
  as its pairs were prepared."""
  from flax_encoder.embeddings import Normalize, Pooling, SentenceEncoder, SentenceModel
  cfg, params, record = read_trained(workdir, dtype=dtype)
  meta = read_meta(os.path.join(workdir, "data"))
  steps = (Normalize(),) if record["normalize"] else ()
  return SentenceEncoder(SentenceModel(cfg, Pooling((record["pooling"],)), steps), params,
                         tokenizing.run_tokenizer(workdir, meta), meta["seq_len"],
                         similarity=record["similarity"],
                         template=Template.from_dict(meta["template"]) if meta.get("template")
                         else Template())


def run_tokenizer(config, workdir: str):
  """The tokenizer of a run of pairs (train.task.Definition.tokenizer), as it prepared them."""
  return tokenizing.run_tokenizer(workdir, read_meta(os.path.join(workdir, "data")))


def hf_model(workdir: str, config, read=None) -> HFModel:
  """The run's encoder as transformers' bare model (AutoModel: what sentence-transformers'
  Transformer module loads), with the pooler of the checkpoint it started from, which it did
  not train (sentence-transformers' fine-tuning leaves it as it is too). `read`: the task's
  `read_trained` (this one's where None)."""
  cfg, params, record = (read or read_trained)(workdir)
  tokenizer = run_tokenizer(config, workdir)
  own = tokenizer.spec.kind == "huggingface" and tokenizer.offset == 0
  # the pooler as the run took it when it started, whatever became of its directory since
  variables = {"params": params["encoder"], "heads": start_pooler(
      workdir, record.get("start") if config.init.get("hf") else None)}
  return HFModel(cfg, record.get("family"), lambda family: (
      families.to_hf_state_dict(variables, cfg, family.name),
      {"architectures": [f"{family.stem}Model"]}), tokenizer.spec.path if own else None)


def _dims_field(value):
  return None if matryoshka_dims(value) is not None else (
      "a string of distinct positive integers separated by commas ('384,256,128'), or ''")


# The config fields of every task of pairs: their files, how many are ranked, the scale of the
# scores and GradCache.
PAIR_FIELDS = {
    **{k: v for k, v in finetune.FIELDS.items() if k != "task.packed"},
    "data.anchor_field": Field(string),
    "data.positive_field": Field(string),
    "data.negative_field": Field(string),
    "data.eval_pairs": Field(integer(2), FREE),  # evaluation only
    "task.scale": Field(number(0)),
    # the same gradient (dropout aside) in less memory, as grad_accum_steps
    "task.cached": Field(boolean, FREE),
    "task.mini_batch": Field(integer(1), FREE)}
# The loss, and a distillation's teacher scores: the fields of the tasks of pairs that distil.
DISTILLATION_FIELDS = {
    "task.loss": Field(choice(LOSSES)),
    "task.temperature": Field(number(0)),
    "data.scores_field": Field(string),
    "data.label_field": Field(string)}
# What every task of pairs plots beside its loss: the held-out ranking.
RANKING_PLOTS = dict(
    eval_loss="eval (all held-out positives)",
    metrics={"mrr_at_10": "MRR@10", "ndcg_at_10": "nDCG@10", "recall_at_1": "recall@1",
             "recall_at_10": "recall@10"},
    baseline=("random_mrr_at_10", "baseline: MRR@10 of a random ranking"))


DEFINITION = Definition(
    name="contrastive",
    fields={**PAIR_FIELDS,
            "task.pooling": Field(choice(POOLINGS)),
            "task.normalize": Field(boolean),
            "task.symmetric": Field(boolean),
            "task.matryoshka_dims": Field(_dims_field),
            **DISTILLATION_FIELDS},
    setup=setup,
    plots=Plots(loss_title="Contrastive loss (in-batch negatives)", loss_unit="nats / anchor",
                train_loss="train (the batch's candidates)", **RANKING_PLOTS,
                accuracy_title="Held-out retrieval: each anchor among all positives"),
    summary=summary,
    hf_model=hf_model,
    sentence_encoder=sentence_encoder,
    check=check,
    defaults=defaults,
    tokenizer=run_tokenizer,
)
