r"""Fine-tuning a multi-vector (ColBERT late-interaction) model: a vector for each token of a
text, a query scored against a document by MaxSim.

  python -m train --config=configs/multi_vector.py --workdir runs/colbert \
      --config.data.train=pairs.jsonl --config.data.eval=held_out.jsonl \
      --config.init.hf=bert-base-uncased   # or a sentence-transformers MultiVectorEncoder folder

The lines are contrastive's (train.tasks.contrastive): {"anchor": the query, "positive": its
document}, optionally "negative" (a hard negative). The model is the encoder, then each token's
vector through a Dense projection to config.task.dim (no bias) and scaled to unit length:
sentence-transformers' MultiVectorEncoder (Transformer, Dense, MultiVectorMask, Normalize). Its
parameters are {"encoder": …, "dense_0": {"kernel": [d_model, dim]}}. From a MultiVectorEncoder
folder the projection and the skiplist are the folder's; from anything else the projection is
fresh (initialised as torch's Linear) and 128 wide unless config.task.dim says.

A query's scored tokens are all its ids ([CLS] and [SEP] too); a document's are too, less the
punctuation of config.task.skiplist (ColBERT's, string.punctuation: MultiVectorMask's
skiplist_words on the document side). score(q, d) = the sum over q's scored tokens of the
largest dot product with one of d's. For a batch of B pairs the loss is the cross-entropy of
query i over config.task.scale * score(i, j) for every positive j (and every hard negative,
B columns more), target j = i: sentence-transformers'
MultiVectorMultipleNegativesRankingLoss, whose scale is 1 (MaxSim is a sum over the query's
tokens, not a cosine). A batch is packed as contrastive's is (train.tasks.packed_pairs), and
MaxSim is computed on the packed rows directly (`packed_maxsim`); config.task.cached runs
GradCache over the token vectors as contrastive does over pooled ones.

Evaluation ranks each held-out query against every held-out positive by MaxSim: MRR@10,
nDCG@10, recall@1 and @10, and the loss over them all.

`multi_vector_encoder(workdir)` is the run as a flax_encoder.multi_vector.MultiVectorEncoder;
`python -m train.export --layout sentence-transformers` writes it as a folder that
sentence-transformers' MultiVectorEncoder loads with the run's token vectors (its Transformer
the bare model `--layout hf` writes).

Shapes: r = packed rows, l = ids of a row, d = vector width, q = queries, n = documents,
t = all the tokens of a batch (r * l), c = the query tokens scored at once.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import string

import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder import EncoderConfig
from flax_encoder.embeddings import Dense, Normalize, segments_per_row
from flax_encoder.multi_vector import (EMPTY_DOCUMENT_SCORE, SCORE_ELEMENTS, MultiVectorEncoder,
                                       MultiVectorError, MultiVectorModel, ScoringMask,
                                       TokenVectors, _vocabulary, maxsim)
from flax_encoder.ranking import diagonal_metrics
from flax_encoder.tokenizer import Template
from train.errors import RunError
from train.run.load import recorded_encoder_config
from train.task import (FIXES_STATE, Definition, Field, Plots, Resume, Setup, boolean, integer,
                        optional)
from train.tasks import contrastive, finetune, tokenizing
from train.tasks.contrastive import cached, cross_entropy_sum, diagonal
from train.tasks.start import start_params

DIM = 128  # the projection's width from a start without one (sentence-transformers' default)
SKIPLIST = tuple(string.punctuation)  # ColBERT's skiplist_words (PyLate's, Stanford's)
# Query tokens the step scores at once against every token of the batch: its MaxSim keeps
# [t, SCORE_TOKENS] products, not [t, t], which a large (GradCache) batch would not hold.
SCORE_TOKENS = 2048


# ---------------------------------------------------------------------------------------------
# The model and MaxSim on packed rows.


def token_model(cfg: EncoderConfig, dim: int = DIM, skip_words: tuple[str, ...] = (),
                check_traced_ids: bool = True) -> TokenVectors:
  """The model trained: the library's TokenVectors of the encoder, a Dense projection to `dim`
  without a bias, then Normalize, as a MultiVectorEncoder folder computes each token's
  vector; `skip_words`: its documents' skiplist, which the export keeps."""
  steps = (Dense(cfg.d_model, dim, False, "Identity"), Normalize())
  return TokenVectors(MultiVectorModel(cfg, steps, ScoringMask(skip_words)), check_traced_ids)


def packed_maxsim(vectors: jax.Array, tokens: jax.Array, segment_ids: jax.Array,
                  queries: jax.Array, documents: jax.Array, skip_ids: tuple[int, ...] = (),
                  score_tokens: int = SCORE_TOKENS) -> jax.Array:
  """MaxSim of every query against every document, all of them texts of the same packed rows.

  Args:
    vectors: float32 [r, l, d] token vectors of the rows.
    tokens, segment_ids: int [r, l], as packed_pairs packs them (segment 0: padding).
    queries: int [q], each query's slot (row * segments_per_row(l) + its segment - 1).
    documents: int [n], each document's slot; -1: no document.
    skip_ids: the ids a document does not score (its skiplist's); a query scores all its ids.
    score_tokens: tokens scored as queries at once (memory [t, score_tokens]).

  Returns:
    float32 [q, n]: the sum over the query's tokens of the largest product with one of the
    document's scored tokens; EMPTY_DOCUMENT_SCORE where it has none (as
    flax_encoder.multi_vector.maxsim), -inf where there is no document.
  """
  rows, length, dim = vectors.shape
  segments = segments_per_row(length)
  real = (segment_ids > 0) & (segment_ids <= segments)
  slots = rows * segments
  slot = jnp.where(real, jnp.arange(rows)[:, None] * segments + segment_ids - 1, slots)

  def text_of(text_slots, scored):
    """Each token's place among `text_slots` [k] (-1: none); k where it is none of theirs."""
    k = text_slots.shape[0]
    # a slot of -1 goes past the end and is dropped: `slots` (padding) keeps k
    place = jnp.full(slots + 1, k, jnp.int32).at[
        jnp.where(text_slots >= 0, text_slots, slots + 1)].set(
            jnp.arange(k, dtype=jnp.int32), mode="drop")
    return jnp.where(scored, place[slot], k).reshape(-1)

  scored = real
  if skip_ids:
    scored = scored & ~jnp.isin(tokens, jnp.asarray(skip_ids, tokens.dtype))
  q, n = queries.shape[0], documents.shape[0]
  query_of, document_of = text_of(queries, real), text_of(documents, scored)
  flat = vectors.reshape(-1, dim)  # [t, d]
  chunk = min(score_tokens, flat.shape[0])
  extra = -flat.shape[0] % chunk
  chunked = (jnp.pad(flat, ((0, extra), (0, 0))).reshape(-1, chunk, dim),
             jnp.pad(query_of, (0, extra), constant_values=q).reshape(-1, chunk))

  @jax.checkpoint  # the backward pass computes a chunk's products again instead of keeping them
  def add(total, inputs):
    query_vectors, query_index = inputs
    products = flat @ query_vectors.T  # [t, c]: document token, query token
    best = jax.ops.segment_max(products, document_of, num_segments=n + 1)  # [n + 1, c]
    return total + jax.ops.segment_sum(best.T, query_index, num_segments=q + 1), None

  total, _ = jax.lax.scan(add, jnp.zeros((q + 1, n + 1), jnp.float32), chunked)
  has_tokens = jax.ops.segment_sum(jnp.ones_like(document_of), document_of,
                                   num_segments=n + 1)[:n] > 0
  scores = jnp.where(has_tokens[None, :], total[:q, :n], EMPTY_DOCUMENT_SCORE)
  return jnp.where((documents >= 0)[None, :], scores, -jnp.inf)


# ---------------------------------------------------------------------------------------------
# The task as the step runs it.


@dataclasses.dataclass(frozen=True)
class MultiVectorTask(contrastive.PairsTask):
  """Multi-vector training as `train.run.step` runs it (`train.task.Task`). The batches are
  contrastive's (`contrastive.ContrastiveTask`): packed pairs with their slots for training;
  the held-out pairs packed once with each segment's 'target' for evaluation."""

  model: TokenVectors
  scale: float
  eval_pairs: int
  skip_ids: tuple[int, ...] = ()  # a document's ids it does not score
  chunks: int | None = None  # GradCache's: the rows embedded in this many chunks; None: at once
  # a teacher's scores distilled ("margin_mse", "kl": contrastive.distillation of MaxSim, as
  # MultiVectorMarginMSELoss and MultiVectorDistillKLDivLoss), where not None
  distil: str | None = None
  temperature: float = 1.0

  def scores(self, params, batch: dict, dropout_rng: jax.Array | None = None) -> jax.Array:
    """float32 [B, B or 2B]: MaxSim of each anchor against each positive, then each hard
    negative (-inf where a line has none)."""
    rows = (batch["tokens"], batch["segment_ids"], batch["positions"])
    embed = cached(self.embed, self.chunks) if self.chunks else self.embed
    vectors = embed(params, rows, dropout_rng)
    documents = batch["positive_slot"]
    if "negative_slot" in batch:
      negatives = jnp.where(batch["has_negative"] > 0, batch["negative_slot"], -1)
      documents = jnp.concatenate([documents, negatives])
    return packed_maxsim(vectors, batch["tokens"], batch["segment_ids"], batch["anchor_slot"],
                         documents, self.skip_ids)

  def loss_sum(self, params, batch: dict, dropout_rng: jax.Array) -> jax.Array:
    scores = self.scores(params, batch, dropout_rng)
    b = scores.shape[0]
    if self.distil:  # each anchor's MaxSim with its own positive and its own negative
      student = jnp.stack([diagonal(scores[:, :b]), diagonal(scores[:, b:])], 1)
      return contrastive.distillation(self.distil, student, batch["teacher"], self.temperature)
    scores = self.scale * scores
    return cross_entropy_sum(scores, diagonal(scores[:, :b]))

  def eval_sums(self, params, batch: dict) -> dict:
    """Each held-out text's token vectors at its row of [eval_pairs, l, dim] tables of anchors
    and positives (zeros elsewhere), and which of them it scores ([eval_pairs, l]): the loop
    adds up the batches' sums, which puts every text's vectors in place."""
    tokens, segment_ids = batch["tokens"], batch["segment_ids"]
    vectors = self.embed(params, (tokens, segment_ids, batch["positions"]))
    rows, length, dim = vectors.shape
    target = batch["target"]  # [r, segments]
    n, segments = self.eval_pairs, target.shape[1]
    real = (segment_ids > 0) & (segment_ids <= segments)
    text = jnp.where(real, jnp.take_along_axis(
        target, jnp.clip(segment_ids - 1, 0, segments - 1), axis=1), -1)  # [r, l]
    held = (text >= 0) & (text < 2 * n)
    scored = held
    if self.skip_ids:
      scored &= ~((text >= n) & jnp.isin(tokens, jnp.asarray(self.skip_ids, tokens.dtype)))
    place = jnp.where(held, text * length + batch["positions"], 2 * n * length).reshape(-1)
    table = jnp.zeros((2 * n * length, dim), vectors.dtype).at[place].add(
        vectors.reshape(-1, dim), mode="drop").reshape(2 * n, length, dim)  # past the end: none
    mask = jnp.zeros(2 * n * length, jnp.float32).at[place].add(
        scored.reshape(-1).astype(jnp.float32), mode="drop").reshape(2 * n, length)
    return {"anchors": table[:n], "positives": table[n:], "anchor_mask": mask[:n],
            "positive_mask": mask[n:], "count": jnp.sum((target >= 0) & (target < n))}

  def eval_metrics(self, sums: dict) -> dict:
    """The ranking metrics of every held-out anchor against every held-out positive by
    MaxSim, the loss over them all (a softmax over every positive), and MRR@10 of a random
    ranking (the baseline)."""
    tables = {}
    for side in ("anchor", "positive"):
      mask = np.asarray(sums[f"{side}_mask"]) > 0
      width = max(1, int(np.flatnonzero(mask.any(axis=0)).max(initial=0)) + 1)
      tables[side] = (np.asarray(sums[f"{side}s"][:, :width], np.float32), mask[:, :width])
    similarity = held_out_scores(*tables["anchor"], *tables["positive"]).astype(np.float64)
    scores = self.scale * similarity
    peak = scores.max(axis=1, keepdims=True)
    log_z = peak[:, 0] + np.log(np.sum(np.exp(scores - peak), axis=1))
    n = len(similarity)
    return {"loss": float(np.mean(log_z - np.diagonal(scores))), **diagonal_metrics(similarity),
            "random_mrr_at_10": float(sum(1 / r for r in range(1, min(contrastive.TOP, n) + 1))
                                      / n)}

  @staticmethod
  def token_count(rows: dict) -> int:
    return int(rows["tokens"].size)  # the packed rows', padding included


_maxsim = jax.jit(maxsim, static_argnames="mean")


def held_out_scores(queries: np.ndarray, query_mask: np.ndarray, documents: np.ndarray,
                    document_mask: np.ndarray) -> np.ndarray:
  """float32 [q, n]: flax_encoder.multi_vector.maxsim of [q, s, d] queries against [n, t, d]
  documents (their masks [q, s], [n, t]), in blocks of SCORE_ELEMENTS products at most where
  a pair allows; every block of one shape (the last padded), compiled once."""
  (q, s, _), (n, t, _) = queries.shape, documents.shape
  per_document = min(n, max(1, SCORE_ELEMENTS // (s * t)))
  per_query = min(q, max(1, SCORE_ELEMENTS // (per_document * s * t)))
  pad = lambda x, rows: np.pad(x, [(0, rows - len(x))] + [(0, 0)] * (x.ndim - 1))
  out = np.zeros((q, n), np.float32)
  for i in range(0, q, per_query):
    block_q = [pad(x[i:i + per_query], per_query) for x in (queries, query_mask)]
    for j in range(0, n, per_document):
      block_d = [pad(x[j:j + per_document], per_document) for x in (documents, document_mask)]
      block = np.asarray(_maxsim(*block_q, *block_d))
      out[i:i + per_query, j:j + per_document] = block[:min(per_query, q - i),
                                                       :min(per_document, n - j)]
  return out


# ---------------------------------------------------------------------------------------------
# Where the projection starts.


def start_folder(config) -> MultiVectorEncoder | None:
  """config.init.hf as the MultiVectorEncoder it is (its config_sentence_transformers.json
  says so), checked to compute nothing this task does not train; None for any other start
  (a Hugging Face directory, a sentence-transformers folder: the encoder alone)."""
  start = config.init.get("hf")
  if not start:
    return None
  file = os.path.join(start, "config_sentence_transformers.json")
  try:
    with open(file, encoding="utf-8") as f:
      kind = json.load(f).get("model_type")
  except (OSError, ValueError, AttributeError):
    return None  # none, or unreadable: loading the encoder says what is wrong with it
  if kind not in ("MultiVectorEncoder", "ColBERT"):  # PyLate's is refused by the load
    return None
  try:
    folder = MultiVectorEncoder.load(start, attention_impl="reference")
  except MultiVectorError as e:
    raise RunError(f"config.init.hf: {e}") from None
  model, steps, mask = folder.model, folder.model.steps, folder.model.mask
  prompts = {k: v for k, v in sorted(folder.prompts.items()) if v}
  refused = None  # (what the folder has, why or what is expected)
  if model.expansion is not None:
    refused = "query expansion (its sentence_bert_config.json's query_expansion)", ""
  elif model.query_length is not None or model.document_length is not None:
    refused = ("a query_length or document_length (its sentence_bert_config.json)",
               "; it cuts every text to config.train.seq_len")
  elif not (len(steps) == 2 and isinstance(steps[0], Dense) and isinstance(steps[1], Normalize)
            and steps[0] == Dense(steps[0].in_features, folder.dim, False, "Identity")):
    refused = (f"the modules {', '.join(type(s).__name__ for s in steps)} after its "
               f"Transformer", "; expected one Dense without a bias or an activation, then a "
               "Normalize")
  elif mask.keep_only_token_ids is not None or mask.skiplist_tasks != ("document",) or set(
      mask.skiplist_words) not in (set(), set(SKIPLIST)):
    refused = (f"a MultiVectorMask of {mask.to_dict()}", "; expected the skiplist of "
               "string.punctuation or none, on documents alone")
  elif prompts:
    refused = (f"prompts {prompts} (config_sentence_transformers.json)",
               "; it tokenizes the texts as they are")
  elif folder.similarity_fn_name != "maxsim":
    refused = f"similarity_fn_name {folder.similarity_fn_name!r}", "; it scores by maxsim"
  if refused:
    raise RunError(f"config.init.hf: {start} has {refused[0]}, which multi_vector training "
                   f"does not compute{refused[1]}")
  dim = config.task.dim
  if dim is not None and dim != folder.dim:
    raise RunError(f"config.task.dim: {dim}, but config.init.hf {start} projects to "
                   f"{folder.dim} (its Dense); leave it unset to fine-tune its projection")
  return folder


def _skip_ids(workdir: str, meta: dict) -> tuple[int, ...]:
  """The ids of SKIPLIST's words in the run's tokenizer, as sentence-transformers finds them
  (a word that is no token of it is left out)."""
  tokenizer = tokenizing.run_tokenizer(workdir, meta)
  if tokenizer.spec.kind != "huggingface":
    raise RunError(f"config.task.skiplist: True, but the run's tokenizer is {tokenizer.spec.kind} "
                   f"(config.data.tokenizer), expected a Hugging Face tokenizer (config.init.hf) "
                   f"whose tokens the punctuation is")
  vocab = _vocabulary(tokenizer)
  return tuple(sorted({vocab[w] for w in SKIPLIST if w in vocab}))


# ---------------------------------------------------------------------------------------------
# What the loop needs.


def setup(config, workdir: str, resume: Resume) -> Setup:
  """Multi-vector fine-tuning on config.data.train, ranked on config.data.eval."""
  folder = start_folder(config)
  paths = {"train": config.data.train, "eval": config.data.eval}
  prepared = contrastive.prepared_pairs(config, workdir, resume, paths)
  cfg, loaded = prepared.encoder, prepared.loaded
  dim = folder.dim if folder else config.task.dim or DIM
  skiplist = config.task.skiplist
  if skiplist is None:
    skiplist = bool(folder and folder.model.mask.skiplist_words)
  skip_ids = _skip_ids(workdir, prepared.meta) if skiplist else ()
  held_out = contrastive.held_out_pairs(config, prepared)
  model = token_model(cfg, dim, check_traced_ids=False)  # tokenized here
  chunks = contrastive.gradcache_chunks(config, loaded)
  task = MultiVectorTask(model, float(config.task.scale), held_out.count, skip_ids, chunks,
                         None if config.task.loss == "mnrl" else config.task.loss,
                         float(config.task.temperature))
  params = start_params(prepared.start, cfg, config, 0)
  if folder is not None:
    params["dense_0"] = {"kernel": np.asarray(folder.params["dense_0"]["kernel"], np.float32)}
  negatives = "with hard negatives" if "negative" in loaded["train"] else "no hard negatives"
  finetune.say_prepared(prepared, f"pairs ({negatives}), token vectors of {dim}"
                        + (" (documents skip punctuation)" if skiplist else ""),
                        config.train.seq_len, held_out.ranked)
  return Setup(task=task, encoder=cfg, train=loaded["train"], eval=held_out.rows,
               eval_fill=held_out.fill,
               record={"encoder": cfg.record(), "dataset": loaded["identity"],
                       "source": os.path.join(workdir, "data"),
                       "start": prepared.start.source, "family": prepared.start.family,
                       # what the readers rebuild: the projection, the scoring mask
                       "dim": dim, "skiplist": bool(skiplist), "skip_ids": list(skip_ids),
                       "similarity": "maxsim", "scale": float(config.task.scale)},
               start_params=params,
               packer=contrastive.pair_packer(config, prepared, chunks))


# ---------------------------------------------------------------------------------------------
# The run read back.


def read_trained(workdir: str, **settings) -> tuple[EncoderConfig, dict, dict]:
  """`contrastive.read_run` of the multi-vector run `workdir`: the parameters {'encoder': …,
  'dense_0': …}."""
  return contrastive.read_run(workdir, lambda record: token_model(
      recorded_encoder_config(record), record["dim"]), **settings)


def multi_vector_encoder(workdir: str, dtype: str = "float32") -> MultiVectorEncoder:
  """The run as a MultiVectorEncoder computed in `dtype`: its encoder, its projection, its
  skiplist; its tokenizer and template, texts cut to its seq_len, as its pairs were prepared.
  What an export writes with flax_encoder.multi_vector.save_multi_vector."""
  cfg, params, record = read_trained(workdir, dtype=dtype)
  meta = contrastive.read_meta(os.path.join(workdir, "data"))
  model = token_model(cfg, record["dim"], SKIPLIST if record["skiplist"] else ()).model
  return MultiVectorEncoder(model, params,
                            tokenizing.run_tokenizer(workdir, meta), meta["seq_len"],
                            similarity=record["similarity"], skip_ids=record["skip_ids"],
                            template=Template.from_dict(meta["template"]) if meta.get("template")
                            else Template())


DEFINITION = Definition(
    name="multi_vector",
    fields={**contrastive.PAIR_FIELDS, **contrastive.DISTILLATION_FIELDS,
            "task.dim": Field(optional(integer(1)), FIXES_STATE),
            "task.skiplist": Field(optional(boolean))},
    setup=setup,
    plots=Plots(loss_title="Multi-vector loss (MaxSim, in-batch negatives)",
                loss_unit="nats / query", train_loss="train (the batch's candidates)",
                **contrastive.RANKING_PLOTS,
                accuracy_title="Held-out retrieval: each query among all positives"),
    summary=contrastive.summary,
    # its encoder alone, as the dense task's: what a MultiVectorEncoder's Transformer loads
    hf_model=functools.partial(contrastive.hf_model, read=read_trained),
    sentence_encoder=multi_vector_encoder,
    check=contrastive.check_batch,
    defaults=contrastive.defaults,
    tokenizer=contrastive.run_tokenizer,
)
