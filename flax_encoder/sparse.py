"""Sparse (SPLADE) vectors of a sentence-transformers SparseEncoder folder, in JAX.

    encoder = SparseEncoder.load("splade-folder")
    vectors = encoder.encode(["A man is eating food.", "Two dogs play."])  # SparseVectors
    vectors.toarray()                      # float32 [2, vocab_size]
    ids, weights = vectors.top(10)         # each text's 10 largest dimensions, largest first
    scores = encoder.similarity(encoder.encode_query(queries), encoder.encode_document(docs))

The vectors are `SparseEncoder(folder).encode(texts)`'s. SPLADE (SpladePooling) takes the
masked-LM logits at each id of a text, relu, log1p (twice for activation_function
"log1p_relu"), then the max or the sum over the text's ids (pooling_strategy): a vector of the
vocabulary's size, zero wherever no id's logit is positive. The folder's modules (modules.json)
are a Transformer of transformer_task "fill-mask" (or sentence-transformers 5's MLMTransformer)
then SpladePooling; or one Router whose routes are that pair or a SparseStaticEmbedding (a
weight per token id, given to each id a text holds: inference-free queries), chosen by the task
(`encode_query`, `encode_document`) as sentence-transformers chooses them. A Hugging Face
*ForMaskedLM directory reads as sentence-transformers makes one of it: max pooling, relu.

Texts are packed many to a row and dispatched as `flax_encoder.embeddings.SentenceEncoder`
packs them; `splade` maps packed rows to each text's vector, a pure function to jit:

    rows = encoder.pack(encoder.tokenize(texts))
    out = jax.jit(encoder.apply)(encoder.params, rows.tokens, rows.segment_ids, rows.positions)
    dense = out[rows.where[:, 0], rows.where[:, 1]]  # out: float32 [rows, segments, vocab]

`save_splade` writes, beside a *ForMaskedLM directory, the files that make sentence-transformers
load it as a SparseEncoder.

Shapes: r = rows, s = ids of a row, k = segments of a row, v = the vocabulary, n = texts.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder import embeddings, families, modules_json, quantized
from flax_encoder.config import EncoderConfig
from flax_encoder.embeddings import EmbeddingError, SentenceEncoder, segments_per_row
from flax_encoder.families import HFError, read_hf, read_hf_weights
from flax_encoder.hf_tokenizer import TokenizerError, tokenizer_from_directory
from flax_encoder.masked_lm import MaskedLM
from flax_encoder.pooling import one_text_a_row
from flax_encoder.modules_json import TRANSFORMER_CONFIGS, TRANSFORMERS, ModulesError
from flax_encoder.router import ROUTERS, Router, read_router
from flax_encoder.tokenizer import Tokenizer, TokenizerFailure

POOLING_STRATEGIES = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")  # SpladePooling's activation_function
SIMILARITIES = ("dot", "cosine")  # of sentence-transformers' four, those `similarity` computes
# modules.json's (and router_config.json's) type of each module read -> its kind: where
# sentence-transformers keeps the class, which 5.4 and 6 moved.
MLM_TRANSFORMERS = ("sentence_transformers.sparse_encoder.models.MLMTransformer",
                    "sentence_transformers.sparse_encoder.modules.mlm_transformer.MLMTransformer")
MODULE_KINDS = {
    **dict.fromkeys(TRANSFORMERS, "Transformer"),
    **dict.fromkeys(MLM_TRANSFORMERS, "MLMTransformer"),
    "sentence_transformers.sparse_encoder.models.SpladePooling": "SpladePooling",
    "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling": "SpladePooling",
    "sentence_transformers.sparse_encoder.models.SparseStaticEmbedding": "SparseStaticEmbedding",
    "sentence_transformers.sparse_encoder.modules.sparse_static_embedding."
    "SparseStaticEmbedding": "SparseStaticEmbedding",
    **dict.fromkeys(ROUTERS, "Router"),
}
# What a folder, or a route of its Router, may hold.
SPLADE_MODULES = (("Transformer", "SpladePooling"), ("MLMTransformer", "SpladePooling"))
STATIC_MODULES = (("SparseStaticEmbedding",),)
# The types written (sentence-transformers 6's names).
_WRITTEN_TYPES = ("sentence_transformers.base.modules.transformer.Transformer",
                  "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling")


class SparseError(EmbeddingError):
  """A SparseEncoder folder, or an argument, that SparseEncoder cannot take. (What it shares
  with SentenceEncoder, prompts and texts, is refused as EmbeddingError, of which this is one.)"""


# ---------------------------------------------------------------------------------------------
# The computation


@dataclasses.dataclass(frozen=True)
class SpladeModel:
  """What a Transformer (fill-mask) and SpladePooling compute, apart from their weights."""
  config: EncoderConfig
  pooling: str = "max"
  activation: str = "relu"
  untied_decoder: bool = False  # the masked-LM decoder is a dense layer of its own (EuroBERT's)
  quantize: str | None = None  # the dense layers' products in int8 (flax_encoder.quantized)

  def __post_init__(self):
    if self.pooling not in POOLING_STRATEGIES:
      raise SparseError(f"pooling={self.pooling!r}, expected one of {POOLING_STRATEGIES}")
    if self.activation not in SPLADE_ACTIVATIONS:
      raise SparseError(f"activation={self.activation!r}, expected one of {SPLADE_ACTIVATIONS}")

  @property
  def dim(self) -> int:
    return self.config.vocab_size


class SpladeEmbedding(nn.Module):
  """A SPLADE folder's computation as a linen module: the masked LM (`MaskedLM`'s 'encoder'
  and 'masked_lm'), then SpladePooling of its logits. `splade` applies it to a folder's
  parameters; `python -m train`'s sparse task trains it.

  Attributes:
    model: what it computes.
    check_traced_ids: as `Encoder`'s (False where the ids were checked on the host).
  """

  model: SpladeModel
  check_traced_ids: bool = True

  def setup(self):
    model = self.model
    self.language_model = MaskedLM(model.config, checkpoint_head=True,
                                   decoder_head=model.untied_decoder,
                                   check_traced_ids=self.check_traced_ids)
    nn.share_scope(self, self.language_model)  # its parameters at the top, as a folder's

  def __call__(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None, segments: int | None = None, *,
               deterministic: bool = True) -> jax.Array:
    """Packed rows -> float32 [r, segments, v] (see `splade`). Without `segment_ids`, padded
    rows of a text each -> float32 [r, v], the run of config.pad_id that ends a row being
    padding (as `Encoder` takes such rows)."""
    rows, length = tokens.shape
    model = self.model
    logits = self.language_model(tokens, segment_ids=segment_ids, positions=positions,
                                 deterministic=deterministic)
    if segment_ids is None:
      padded, _ = one_text_a_row(tokens, model.config.pad_id)
      return splade_pool(logits, padded, 1, model.pooling, model.activation)[:, 0]
    segments = segments or segments_per_row(length)
    return splade_pool(logits, segment_ids, segments, model.pooling, model.activation)


def splade(model: SpladeModel, params: dict, tokens: jax.Array, segment_ids: jax.Array,
           positions: jax.Array, segments: int | None = None) -> jax.Array:
  """Packed rows -> each segment's SPLADE vector, a pure function to jit.

  Args:
    model: what it computes (`SparseEncoder.model`).
    params: {'encoder': load_hf's variables['params'], 'masked_lm': its
      variables['heads']['masked_lm']} (`SparseEncoder.params`).
    tokens, segment_ids, positions: int [r, s], as `flax_encoder.embeddings.embed` takes them:
      segment ids 1 … `segments` for the texts of a row, 0 at padding.
    segments: the segments of a row (default `segments_per_row(s)`).

  Returns:
    float32 [r, segments, v]: segment j + 1 of row i at [i, j]; zeros where a row has no
    segment j + 1.
  """
  module = quantized.quantized(SpladeEmbedding(model), model.quantize)
  return module.apply({"params": params}, tokens, segment_ids, positions, segments)


def splade_pool(logits: jax.Array, segment_ids: jax.Array, segments: int, pooling: str = "max",
                activation: str = "relu") -> jax.Array:
  """Masked-LM logits [r, s, v] of packed rows -> each segment's SPLADE vector, float32
  [r, segments, v]: log(1 + relu(logit)) (log1p_relu: log1p once more), its max or sum over
  the segment's ids; zeros where a row has no segment j + 1."""
  rows, length, _ = logits.shape
  x = jnp.log1p(jax.nn.relu(logits.astype(jnp.float32)))  # [r, s, v]
  if activation == "log1p_relu":
    x = jnp.log1p(x)
  slots = rows * segments  # segment j + 1 of row i is slot i * segments + j
  real = (segment_ids > 0) & (segment_ids <= segments)
  # padding goes to one slot past the rest, dropped after
  slot = jnp.where(real, jnp.arange(rows)[:, None] * segments + segment_ids - 1, slots)
  x, slot = x.reshape(rows * length, -1), slot.reshape(-1)
  if pooling == "max":
    # every value is >= 0: an absent segment's -inf becomes the 0 it reads as
    pooled = jnp.maximum(jax.ops.segment_max(x, slot, num_segments=slots + 1)[:slots], 0)
  else:
    pooled = jax.ops.segment_sum(x, slot, num_segments=slots + 1)[:slots]
  return pooled.reshape(rows, segments, -1)


# One jit for every encoder: two of the same model share compiles.
_jitted_splade = jax.jit(splade, static_argnames=("model", "segments"))


# ---------------------------------------------------------------------------------------------
# Sparse vectors


@dataclasses.dataclass(frozen=True, eq=False)
class SparseVectors:
  """n vectors of `shape[1]` dimensions in CSR: row i's active dimensions are
  indices[indptr[i]:indptr[i + 1]] (ascending), their values the same slice of `values`. A
  dimension is active where its value is not 0, as in sentence-transformers' sparse tensors."""
  indptr: np.ndarray  # int64 [n + 1]
  indices: np.ndarray  # int32 [nnz]
  values: np.ndarray  # float32 [nnz]
  shape: tuple[int, int]

  def __len__(self) -> int:
    return self.shape[0]

  @property
  def active(self) -> np.ndarray:
    """int64 [n]: each vector's active dimensions."""
    return np.diff(self.indptr)

  def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices, values) of vector i."""
    at = slice(self.indptr[i], self.indptr[i + 1])
    return self.indices[at], self.values[at]

  def toarray(self) -> np.ndarray:
    """float32 [n, dim], dense."""
    out = np.zeros(self.shape, np.float32)
    out[self._rows(), self.indices] = self.values
    return out

  def to_scipy(self):
    """A scipy.sparse.csr_array of the vectors (scipy imported here, on first use)."""
    from scipy import sparse
    return sparse.csr_array((self.values, self.indices, self.indptr), shape=self.shape)

  def keep_largest(self, k: int) -> SparseVectors:
    """Each vector with only its k largest values (by magnitude; of equal ones, the lowest
    dimensions) left active, as sentence-transformers' max_active_dims."""
    k = _positive(k, "k")
    rows, rank, order = self._ranked()
    kept = np.sort(order[rank < k])  # back to (row, dimension) order
    counts = np.bincount(rows[kept], minlength=len(self))
    return SparseVectors(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                         self.indices[kept], self.values[kept], self.shape)

  def top(self, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 [n, k], weights float32 [n, k]): each vector's k largest values (by
    magnitude) and their dimensions, largest first; a vector of fewer active dimensions ends
    in ids -1 of weight 0."""
    k = _positive(k, "k")
    rows, rank, order = self._ranked()
    keep = rank < k
    ids = np.full((len(self), k), -1, np.int32)
    weights = np.zeros((len(self), k), np.float32)
    ids[rows[order[keep]], rank[keep]] = self.indices[order[keep]]
    weights[rows[order[keep]], rank[keep]] = self.values[order[keep]]
    return ids, weights

  def _rows(self) -> np.ndarray:
    return np.repeat(np.arange(len(self)), self.active)

  def _ranked(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the row of each value, each value's rank in its row by magnitude, the order of
    values by row then rank)."""
    rows = self._rows()
    order = np.lexsort((self.indices, -np.abs(self.values), rows))
    return rows, np.arange(len(order)) - self.indptr[rows[order]], order

  @classmethod
  def from_dense(cls, dense: np.ndarray) -> SparseVectors:
    """The vectors of float [n, dim] `dense`."""
    dense = np.asarray(dense, np.float32)
    counts, indices, values = _csr_rows(dense)
    return cls(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), indices, values,
               dense.shape)

  @classmethod
  def _assemble(cls, n: int, dim: int, chunks: Sequence[tuple]) -> SparseVectors:
    """The vectors of n texts from chunks of (which texts, their active dimensions' counts,
    indices, values), each chunk's rows in the order of its texts."""
    counts = np.zeros(n, np.int64)
    for texts, count, _, _ in chunks:
      counts[texts] = count
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    indices, values = np.empty(indptr[-1], np.int32), np.empty(indptr[-1], np.float32)
    for texts, count, index, value in chunks:
      first = np.cumsum(count) - count  # each row's first value within the chunk
      to = np.repeat(indptr[texts] - first, count) + np.arange(len(index))
      indices[to], values[to] = index, value
    return cls(indptr, indices, values, (n, dim))


def _csr_rows(dense: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(each row's active dimensions' count, their indices, their values) of [m, dim]."""
  rows, cols = np.nonzero(dense)  # row-major: each row's dimensions ascending
  return (np.bincount(rows, minlength=len(dense)), cols.astype(np.int32),
          dense[rows, cols].astype(np.float32))


def _positive(k, name: str) -> int:
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
    raise SparseError(f"{name}={k!r}, expected an integer >= 1")
  return int(k)


def similarity(a: SparseVectors | np.ndarray, b: SparseVectors | np.ndarray,
               fn: str = "dot") -> np.ndarray:
  """float32 [len(a), len(b)]: each pair's dot product (fn "dot") or cosine ("cosine": a
  vector of no active dimension scores 0), as sentence-transformers' SparseEncoder.similarity
  computes them. `a` and `b`: SparseVectors or dense float [n, dim]."""
  if fn not in SIMILARITIES:
    raise SparseError(f"similarity {fn!r}, expected one of {SIMILARITIES}")
  from scipy import sparse
  a, b = (x.to_scipy() if isinstance(x, SparseVectors) else
          sparse.csr_array(np.atleast_2d(np.asarray(x, np.float32))) for x in (a, b))
  if a.shape[1] != b.shape[1]:
    raise SparseError(f"vectors of {a.shape[1]} and of {b.shape[1]} dimensions, expected the "
                      f"same")
  scores = np.asarray((a @ b.T).toarray(), np.float32)
  if fn == "cosine":
    norm = lambda x: np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).reshape(-1))
    na, nb = norm(a), norm(b)
    scores = np.where(np.outer(na, nb) > 0, scores / np.maximum(np.outer(na, nb), 1e-30), 0)
  return scores.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# SparseStaticEmbedding (a Router's static route: flax_encoder.router)


@dataclasses.dataclass(frozen=True, eq=False)
class StaticEmbedding:
  """SparseStaticEmbedding: a text's vector is, at each id its tokenizer gives it (no special
  ids, cut to `max_length` ids), that id's weight."""
  weights: np.ndarray  # float32 [dim]
  tokenizer: Tokenizer
  max_length: int | None
  folder: str  # what an error names

  def encode(self, texts: Sequence[str], prompt: str = "") -> SparseVectors:
    """Each text's vector, the prompt before it."""
    texts = [prompt + t for t in texts]
    try:
      ids = (self.tokenizer.encode_leading(texts, self.max_length) if self.max_length else
             self.tokenizer.encode_batch(texts))
    except TokenizerFailure as e:  # `tokenizers` panicked
      raise SparseError(f"{self.folder}: {e}") from None
    dim = len(self.weights)
    if ids and max(int(i.max(initial=0)) for i in ids) >= dim:
      raise SparseError(f"{self.folder}: the tokenizer gives ids past the {dim} weights")
    rows = np.repeat(np.arange(len(ids)), [len(i) for i in ids])
    # each id a text holds counts once, however often it is there
    keys = np.unique(rows * dim + np.concatenate([np.zeros(0, np.int64), *ids]))
    rows, cols = keys // dim, keys % dim
    values = self.weights[cols]
    nonzero = values != 0
    counts = np.bincount(rows[nonzero], minlength=len(ids))
    return SparseVectors._assemble(len(ids), dim, [(np.arange(len(ids)), counts,
                                                    cols[nonzero].astype(np.int32),
                                                    values[nonzero])])


# ---------------------------------------------------------------------------------------------
# The encoder


class SparseEncoder(SentenceEncoder):
  """A SparseEncoder folder's texts -> SparseVectors function (`load`); `encode` returns
  `SparseEncoder(folder).encode(texts)`'s vectors."""

  def __init__(self, model: SpladeModel, params: dict, tokenizer: Tokenizer,
               max_seq_length: int, prompts: dict[str, str] | None = None,
               default_prompt_name: str | None = None, similarity: str = "dot",
               max_active_dims: int | None = None, router: Router | None = None, **options):
    # sentence-transformers' SparseEncoder always has a query and a document prompt, '' where
    # the folder gives none: encode_query never falls back on the default prompt
    prompts = {"query": "", "document": "", **(prompts or {})}
    super().__init__(model, params, tokenizer, max_seq_length, prompts, default_prompt_name,
                     similarity, **options)
    self.max_active_dims = None if max_active_dims is None else _positive(
        max_active_dims, "max_active_dims")
    self.router = router

  @classmethod
  def load(cls, path: str | os.PathLike, dtype="float32", attention_impl: str | None = None,
           **options) -> SparseEncoder:
    """The SparseEncoder folder `path` (or a Hugging Face *ForMaskedLM directory, max pooled
    through relu as sentence-transformers makes one of it), computed in `dtype` (vectors are
    float32 either way) by `attention_impl` (load_hf's default where None). `options`:
    row_lengths, max_segments, devices (SentenceEncoder's). Raises SparseError in one line
    naming the file."""
    path, files = os.fspath(path), modules_json.FolderFiles()
    settings = {"dtype": dtype} | ({"attention_impl": attention_impl} if attention_impl else {})
    try:
      modules = modules_json.read_modules(path, files)
    except ModulesError as e:
      raise SparseError(str(e)) from None
    router = None
    if modules is None:
      if not os.path.isfile(os.path.join(path, "config.json")):
        raise SparseError(f"{path}: neither modules.json nor config.json, expected a "
                          f"SparseEncoder folder or a Hugging Face *ForMaskedLM directory")
      _check_masked_lm_architecture(path, files)
      module, pooling = path, None
    else:
      file = os.path.join(path, "modules.json")
      kinds = tuple(_kind(m.get("type"), file, f"module {i}") for i, m in enumerate(modules))
      folders = [os.path.normpath(os.path.join(path, m["path"])) for m in modules]
      if kinds == ("Router",):
        router, splade_folders = _read_router(folders[0], files)
        (kind, _), (module, pooling) = splade_folders
      elif kinds in SPLADE_MODULES:
        (kind, _), (module, pooling) = kinds, folders
        _check_top_module(path, module, kind)
      else:
        raise SparseError(f"{file}: modules {list(kinds)}, expected a Transformer "
                          f"(fill-mask) then SpladePooling, or one Router")
      _check_fill_mask(module, kind, files)
    model, params, tokenizer, length = _read_splade(module, pooling, settings, files)
    prompts, default, _ = embeddings.read_settings(path, files)
    similarity, max_active_dims = (_read_sparse_settings(path, files) if modules else
                                   ("dot", None))
    tokenizer_file = os.path.join(module, "tokenizer.json")
    return cls(model, params, tokenizer, length, prompts, default, similarity,
               max_active_dims, router, **options,
               tokenizer_file=tokenizer_file if os.path.isfile(tokenizer_file) else path)

  @property
  def dim(self) -> int:
    return self.model.dim

  @staticmethod
  def module(model: SpladeModel) -> nn.Module:
    return SpladeEmbedding(model)

  @staticmethod
  def _example_call(rows: jax.Array) -> tuple:
    return rows, rows, rows, 1

  def apply(self, params: dict, tokens, segment_ids, positions, pool_from=0,
            segments: int | None = None) -> jax.Array:
    """`splade` with this encoder's model: packed rows -> float32 [r, segments, v]. (SPLADE
    pools a prompt's ids too: `pool_from` is there for SentenceEncoder's signature.)"""
    del pool_from
    return splade(self.model, params, tokens, segment_ids, positions, segments)

  def default_batch_tokens(self) -> int:
    """SentenceEncoder's, less on an accelerator where a call's rows of vocabulary logits
    (float32 [ids, v], about twice over with their activation) would take more than a
    quarter of its memory."""
    dense = super().default_batch_tokens()
    device = self.devices[0]
    limit = (device.memory_stats() or {}).get("bytes_limit") if device.platform != "cpu" else None
    if not limit:
      return dense
    fits = max(1, limit // 4 // (8 * self.dim))
    return int(max(embeddings.BATCH_TOKENS // 8, min(dense, 1 << (fits.bit_length() - 1))))

  def encode(self, texts: Sequence[str] | str, prompt_name: str | None = None,
             prompt: str | None = None, top_k: int | None = None, task: str | None = None,
             batch_tokens: int | None = None) -> SparseVectors:
    """Each text's vector (a text alone: one vector), the prompt (`prompt_text`) before it;
    with `top_k`, only each vector's top_k largest values active (else the folder's
    max_active_dims, where it has one). `task` picks the Router's route ("query",
    "document"; None: its default). A call encodes `batch_tokens` ids on each device at most
    (default: `default_batch_tokens()`)."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    for i, text in enumerate(texts):
      if not isinstance(text, str):
        raise SparseError(f"texts[{i}]: a {type(text).__name__}, expected a str")
    batch_tokens = self._batch_tokens(batch_tokens, SparseError)
    keep = top_k if top_k is not None else self.max_active_dims
    keep = None if keep is None else _positive(keep, "top_k")
    if task is not None and not isinstance(task, str):
      raise SparseError(f"task={task!r}, expected a str such as 'query' or 'document'")
    prompt = self.prompt_text(prompt, prompt_name)
    route = self.router.routes[self.router.resolve(task)] if self.router else None
    if route is not None:
      vectors = route.encode(texts, prompt)
    else:
      chunks: list = []
      self._encode_chunks(texts, lambda chunk: self.tokenize(chunk, prompt), batch_tokens, 0,
                          chunks)
      vectors = SparseVectors._assemble(len(texts), self.dim, chunks)
    return vectors if keep is None else vectors.keep_largest(keep)

  __call__ = encode

  def encode_query(self, texts: Sequence[str] | str, prompt_name: str | None = None,
                   prompt: str | None = None, **options) -> SparseVectors:
    """`encode` of queries: the "query" prompt unless another is given, the Router's query
    route."""
    if prompt_name is None and prompt is None:
      prompt_name = "query"
    return self.encode(texts, prompt_name, prompt, task="query", **options)

  def encode_document(self, texts: Sequence[str] | str, prompt_name: str | None = None,
                      prompt: str | None = None, **options) -> SparseVectors:
    """`encode` of documents: the "document" prompt unless another is given, the Router's
    document route."""
    if prompt_name is None and prompt is None:
      prompt_name = "document"
    return self.encode(texts, prompt_name, prompt, task="document", **options)

  def _encode(self, tokens, segment_ids, positions, pool_from, segments) -> jax.Array:
    return _jitted_splade(self.model, self.params, tokens, segment_ids, positions, segments)

  def _collect(self, calls, out: list) -> None:
    """Each call's texts' vectors, read back and made sparse: (texts, counts, indices,
    values) appended to `out`."""
    for output, where, texts in calls:
      out.append((texts, *_csr_rows(np.asarray(output)[where[:, 0], where[:, 1]])))

  def save_modules(self, path: str) -> None:
    """Writes beside the Hugging Face *ForMaskedLM directory in `path` the files that make it
    this encoder's SparseEncoder folder (`save_splade`; not its Router)."""
    prompts = {k: v for k, v in self.prompts.items() if v or k not in ("query", "document")}
    save_splade(path, self.model.pooling, self.model.activation, self.max_seq_length, prompts,
                self.default_prompt_name, self.similarity_fn_name)

  # SentenceEncoder.__init__ sets `similarity` to the folder's similarity_fn_name; here it is
  # sentence-transformers' SparseEncoder.similarity, and the name is `similarity_fn_name`.
  @property
  def similarity(self):
    """similarity(a, b) -> float32 [len(a), len(b)], by the folder's similarity_fn_name (dot
    where it names none): `flax_encoder.sparse.similarity`."""
    return functools.partial(similarity, fn=self.similarity_fn_name)

  @similarity.setter
  def similarity(self, name: str) -> None:
    if name not in embeddings.SIMILARITIES:
      raise SparseError(f"similarity={name!r}, expected one of {embeddings.SIMILARITIES}")
    self.similarity_fn_name = name


# ---------------------------------------------------------------------------------------------
# Reading a folder


def _kind(module_type, file: str, which: str) -> str:
  return embeddings.module_kind(module_type, file, which, MODULE_KINDS, SparseError,
                                "SparseEncoder")


def _check_masked_lm_architecture(path: str, files: modules_json.FolderFiles | None = None) -> None:
  """A Hugging Face directory, which sentence-transformers makes a SPLADE model of only where
  config.json's architectures name a *ForMaskedLM."""
  file = os.path.join(path, "config.json")
  architectures = (SparseError.read(file, files=files) or {}).get("architectures") or []
  if not any(isinstance(a, str) and a.endswith("ForMaskedLM") for a in architectures):
    raise SparseError(f"{file}: architectures={architectures!r}, expected a *ForMaskedLM "
                      f"(sentence-transformers makes another model, SparseAutoEncoder's, of "
                      f"any other)")


def _check_top_module(path: str, module: str, kind: str) -> None:
  """An MLMTransformer at the folder's top: the readers of flax_encoder.families and
  hf_tokenizer take the folder itself for its Transformer only where modules.json's first
  type is one of modules_json.TRANSFORMERS."""
  if kind == "MLMTransformer" and os.path.realpath(module) == os.path.realpath(path) and not (
      set(MLM_TRANSFORMERS) & set(TRANSFORMERS)):
    raise SparseError(f"{os.path.join(path, 'modules.json')}: the first module is an "
                      f"MLMTransformer (sentence-transformers 5) in the folder itself, which "
                      f"is not read yet; save it again with sentence-transformers 6 "
                      f"(SparseEncoder(path).save(out)) and load that")


def _read_splade(module: str, pooling: str | None, settings: dict,
                 files: modules_json.FolderFiles | None = None
                ) -> tuple[SpladeModel, dict, Tokenizer, int]:
  """The model, its params, tokenizer and max_seq_length of the Transformer module's folder
  `module` and the SpladePooling folder `pooling` (None: max pooling of relu), their files
  read through the load's `files`."""
  strategy, activation, dimension = "max", "relu", None
  if pooling is not None:
    file = os.path.join(pooling, "config.json")
    config = SparseError.read(file, files=files)
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    dimension = config.get("embedding_dimension", config.get("word_embedding_dimension"))
    if strategy not in POOLING_STRATEGIES:
      raise SparseError(f"{file}: pooling_strategy={strategy!r}, expected one of "
                        f"{POOLING_STRATEGIES}")
    if activation not in SPLADE_ACTIVATIONS:
      raise SparseError(f"{file}: activation_function={activation!r}, expected one of "
                        f"{SPLADE_ACTIVATIONS}")
  try:
    hf = read_hf(module, files=files, **settings)
    tokenizer = tokenizer_from_directory(module, files=files)
  except (HFError, TokenizerError) as e:
    raise SparseError(str(e)) from None
  heads = hf.variables.get("heads", {})
  if "masked_lm" not in heads:
    raise SparseError(f"{module}: the weights hold no masked-LM head (SPLADE pools its "
                      f"logits), expected a *ForMaskedLM checkpoint's")
  if dimension is not None and dimension != hf.config.vocab_size:
    raise SparseError(f"{os.path.join(pooling, 'config.json')}: embedding_dimension="
                      f"{dimension!r}, expected the vocabulary's size {hf.config.vocab_size}")
  model = SpladeModel(hf.config, strategy, activation, families.get(hf.family).untied_decoder)
  params = {"encoder": hf.variables["params"], "masked_lm": heads["masked_lm"]}
  try:
    length = embeddings.read_max_seq_length(module, hf.config.max_len, files)
  except EmbeddingError as e:
    raise SparseError(str(e)) from None
  return model, params, tokenizer, length


def _check_fill_mask(module: str, kind: str, files: modules_json.FolderFiles | None = None) -> None:
  """The Transformer module's transformer_task (its sentence_*_config.json) is "fill-mask",
  where its outputs are the masked-LM logits SpladePooling pools (a Transformer's default is
  "feature-extraction", MLMTransformer's "fill-mask")."""
  for name in TRANSFORMER_CONFIGS:
    file = os.path.join(module, name)
    config = SparseError.read(file, required=False, files=files)
    if config is not None:
      break
  else:
    file, config = os.path.join(module, TRANSFORMER_CONFIGS[0]), {}
  task = config.get("transformer_task", "fill-mask" if kind == "MLMTransformer" else
                    "feature-extraction")
  if task != "fill-mask":
    raise SparseError(f"{file}: transformer_task={task!r}, expected 'fill-mask' (the "
                      f"masked-LM logits that SpladePooling pools)")


def _read_sparse_settings(path: str, files: modules_json.FolderFiles | None = None
                          ) -> tuple[str, int | None]:
  """config_sentence_transformers.json's similarity_fn_name (dot where it names none, as
  SparseEncoder defaults) and max_active_dims; its model_type checked to be SparseEncoder's."""
  file = os.path.join(path, "config_sentence_transformers.json")
  config = SparseError.read(file, required=False, files=files) or {}
  # sentence-transformers takes a folder without it for a SentenceTransformer's, and makes a
  # SparseEncoder of that by appending a SparseAutoEncoder drawn afresh
  if config.get("model_type") != "SparseEncoder":
    raise SparseError(f"{file}: model_type={config.get('model_type')!r}"
                      f"{'' if config else ' (no such file)'}, expected 'SparseEncoder'")
  similarity = config.get("similarity_fn_name") or "dot"  # read_settings checked it
  dims = config.get("max_active_dims")
  if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims < 1):
    raise SparseError(f"{file}: max_active_dims={dims!r}, expected an integer >= 1 or null")
  return similarity, dims


def _read_router(folder: str, files: modules_json.FolderFiles | None = None
                ) -> tuple[Router, tuple]:
  """The Router in `folder` (`flax_encoder.router.read_router`): its routes (None: the
  Transformer and SpladePooling; else a StaticEmbedding), and the (kinds, folders) of its one
  Transformer and SpladePooling."""
  router = read_router(folder, SparseError, files)
  file = router.file
  routes: dict[str, StaticEmbedding | None] = {}
  splade = None
  for route, modules in router.routes.items():
    kinds = tuple(_kind(m.type, file, f"module {m.name!r}") for m in modules)
    if kinds in STATIC_MODULES:
      routes[route] = _read_static(modules[0].folder, files)
    elif kinds in SPLADE_MODULES:
      if splade is not None and splade[1] != modules:
        raise SparseError(f"{file}: routes {splade[0]!r} and {route!r} each run a "
                          f"Transformer of their own, expected one")
      splade = (route, modules, kinds)
      routes[route] = None
    else:
      raise SparseError(f"{file}: route {route!r} holds {list(kinds)}, expected "
                        f"SparseStaticEmbedding or a Transformer (fill-mask) then "
                        f"SpladePooling")
  if splade is None:
    raise SparseError(f"{file}: no route runs a Transformer (fill-mask) then SpladePooling, "
                      f"expected one")
  _, modules, kinds = splade
  return router.with_routes(routes), (kinds, tuple(m.folder for m in modules))


def _read_static(folder: str, files: modules_json.FolderFiles | None = None) -> StaticEmbedding:
  """A SparseStaticEmbedding module's folder: config.json, its weight (model.safetensors or
  pytorch_model.bin) and its tokenizer."""
  file = os.path.join(folder, "config.json")
  config = SparseError.read(file, required=False, files=files) or {}
  if config.get("path") is not None:
    raise SparseError(f"{file}: path={config['path']!r} (weights from an idf JSON file, read "
                      f"through transformers' tokenizer), expected the module's own weight: "
                      f"save it with sentence-transformers first")
  try:
    state = read_hf_weights(folder, files)
    tokenizer = tokenizer_from_directory(folder, files=files)
  except (HFError, TokenizerError) as e:
    raise SparseError(f"{folder}: the SparseStaticEmbedding module's files: {e}") from None
  weight = state.get("weight")
  if weight is None or np.ndim(weight) != 1:
    got = f"shape {np.shape(weight)}" if weight is not None else "missing"
    raise SparseError(f"{folder}: the SparseStaticEmbedding module's weight is {got}, expected "
                      f"one value per token id")
  # transformers cuts a text (truncation=True) at the tokenizer's model_max_length, which is
  # as good as no limit where it was never set (its default is 1e30)
  settings = SparseError.read(os.path.join(folder, "tokenizer_config.json"), required=False,
                              files=files) or {}
  length = settings.get("model_max_length")
  if not isinstance(length, int) or isinstance(length, bool) or not 0 < length < 1 << 31:
    length = None
  return StaticEmbedding(np.asarray(weight, np.float32), tokenizer, length, folder)


# ---------------------------------------------------------------------------------------------
# Writing a folder


def save_splade(path: str | os.PathLike, pooling: str = "max", activation: str = "relu",
                max_seq_length: int | None = None, prompts: dict[str, str] | None = None,
                default_prompt_name: str | None = None, similarity: str = "dot",
                do_lower_case: bool = False) -> None:
  """Writes into `path`, beside the Hugging Face *ForMaskedLM directory there (config.json,
  weights, tokenizer), the files that make sentence-transformers 6 load it as a SparseEncoder
  of SpladePooling(`pooling`, `activation`): modules.json, sentence_bert_config.json
  (transformer_task fill-mask, `max_seq_length` where given, else the tokenizer's),
  1_SpladePooling/config.json and config_sentence_transformers.json (model_type
  SparseEncoder, the prompts). What `SparseEncoder.load` reads back."""
  path = os.fspath(path)
  if pooling not in POOLING_STRATEGIES:
    raise SparseError(f"pooling={pooling!r}, expected one of {POOLING_STRATEGIES}")
  if activation not in SPLADE_ACTIVATIONS:
    raise SparseError(f"activation={activation!r}, expected one of {SPLADE_ACTIVATIONS}")
  if similarity not in embeddings.SIMILARITIES:
    raise SparseError(f"similarity={similarity!r}, expected one of {embeddings.SIMILARITIES}")
  if max_seq_length is not None and (isinstance(max_seq_length, bool) or not isinstance(
      max_seq_length, int) or max_seq_length < 3):
    raise SparseError(f"max_seq_length={max_seq_length!r}, expected an integer >= 3 or None")
  prompts = embeddings.checked_prompts(prompts, default_prompt_name, SparseError)
  try:
    hf = families.read_hf_config(path)
    vocab_size = families.config_from_hf(hf, file=os.path.join(path, "config.json")).vocab_size
  except HFError as e:
    raise SparseError(str(e)) from None
  _check_masked_lm_architecture(path)

  def write(name: str, value) -> None:
    modules_json.write_json(os.path.join(path, name), value)

  write("modules.json", [
      {"idx": 0, "name": "0", "path": "", "type": _WRITTEN_TYPES[0]},
      {"idx": 1, "name": "1", "path": "1_SpladePooling", "type": _WRITTEN_TYPES[1]}])
  write("sentence_bert_config.json", {
      "transformer_task": "fill-mask", "do_lower_case": do_lower_case,
      **({"max_seq_length": max_seq_length} if max_seq_length is not None else {})})
  write(os.path.join("1_SpladePooling", "config.json"), {
      "pooling_strategy": pooling, "activation_function": activation,
      "embedding_dimension": vocab_size})
  write("config_sentence_transformers.json", {
      "model_type": "SparseEncoder", "prompts": {"query": "", "document": "", **prompts},
      "default_prompt_name": default_prompt_name, "similarity_fn_name": similarity})
