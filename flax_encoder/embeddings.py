"""Sentence embeddings of a sentence-transformers folder, in JAX, many short texts to a row.

    encoder = SentenceEncoder.load("all-MiniLM-L6-v2")
    vectors = encoder(["A man is eating food.", "Two dogs play."])  # float32 [2, 384]
    vectors = encoder(texts, prompt_name="query")  # a prompt of config_sentence_transformers.json

The vectors are `SentenceTransformer(folder).encode(texts)`'s. The folder's modules
(modules.json) run in order: the Transformer (`load_hf`; its tokenizer, each text cut to
max_seq_length ids as sentence-transformers cuts it), Pooling (1_Pooling/config.json: any of
its modes, several concatenated in the order it lists them), then Dense and Normalize modules.
A prompt is put before each text and tokenized with it; with the pooling's include_prompt off,
the prompt's ids (less the special id after it) are left out of the pooling.

A folder of one Router (an asymmetric model: a query route and a document route, each a
Transformer, Pooling, Dense and Normalize modules, sharing a Transformer or not; then maybe
modules.json's Dense and Normalize after any route) runs the route its task picks, as
sentence-transformers picks it (`flax_encoder.router`), each route a SentenceEncoder of its own:

    queries = encoder.encode_query(texts)      # the "query" prompt (if any), the query route
    documents = encoder.encode_document(texts)
    vectors = encoder(texts, task="query")     # encoder(texts): the Router's default route

sentence-transformers sorts the texts by length and pads each batch to its longest. Here each
text is its own segment of a packed row (`flax_encoder.packing`: it attends only to itself, its
positions count from its first id), many to a row, pooled on its own: a text's vector is the
one it has alone. Rows are of a few lengths (`row_lengths`) and calls of a few row counts, so
that a stream of calls compiles a bounded number of times (`SentenceEncoder.shapes`). The next
chunk of texts is tokenized while the device encodes the one before. Given `devices`, each
call's rows are split evenly over them (`batch_tokens` ids a device), the weights copied to
each: `SentenceEncoder.load(folder, devices=jax.local_devices())`.

In a jitted function of one's own, `embed` (or `encoder.apply`) maps packed rows to vectors:

    rows = encoder.pack(encoder.tokenize(texts))  # PackedRows: int32 [rows, max_seq_length]
    out = jax.jit(encoder.apply)(encoder.params, rows.tokens, rows.segment_ids, rows.positions)
    vectors = out[rows.where[:, 0], rows.where[:, 1]]  # out: [rows, segments, dim]

Shapes: r = rows, s = ids of a row, k = segments of a row, d = widths.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder import activations, packing, quantization, quantized
from flax_encoder.config import EncoderConfig
from flax_encoder.encoder import Encoder
from flax_encoder.families import HFError, read_hf, read_hf_weights
from flax_encoder.families.safetensors_file import write_safetensors
from flax_encoder.hf_tokenizer import TokenizerError, tokenizer_from_directory
from flax_encoder import modules_json
from flax_encoder.modules_json import (TRANSFORMER_CONFIGS, TRANSFORMERS, ModulesError,
                                       transformer_folder)
from flax_encoder.pooling import MODES as POOLING_MODES
from flax_encoder.pooling import one_text_a_row, pool
from flax_encoder.router import ROUTERS, Router, read_router
from flax_encoder.tokenizer import Template, Tokenizer, TokenizerFailure, encode_examples

# modules.json's type of each module this reads -> its kind. sentence-transformers names a
# module by where its class lives: sentence_transformers.models.* up to 5, base.modules and
# sentence_transformer.modules from 6.
MODULE_KINDS = {
    **dict.fromkeys(TRANSFORMERS, "Transformer"),
    "sentence_transformers.models.Pooling": "Pooling",
    "sentence_transformers.sentence_transformer.modules.pooling.Pooling": "Pooling",
    "sentence_transformers.models.Dense": "Dense",
    "sentence_transformers.base.modules.dense.Dense": "Dense",
    "sentence_transformers.models.Normalize": "Normalize",
    "sentence_transformers.base.modules.normalize.Normalize": "Normalize",
    **dict.fromkeys(ROUTERS, "Router"),
}
# Pooling's config.json before sentence-transformers 6: a flag per mode, concatenated in this
# order whichever order the file lists them in.
POOLING_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                 "pooling_mode_mean_tokens": "mean",
                 "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                 "pooling_mode_weightedmean_tokens": "weightedmean",
                 "pooling_mode_lasttoken": "lasttoken"}
# Dense's activation_function: the torch.nn classes (by their last name) it may be.
ACTIVATIONS = tuple(name for name in activations.TORCH if name != "Softmax")
SIMILARITIES = ("cosine", "dot", "euclidean", "manhattan")
ROW_LENGTHS = (64, 128, 256, 512)
BATCH_TOKENS = 2048  # ids a call encodes on a CPU: 32 rows of 64, 16 of 128, 8 of 256, 4 of 512
MAX_BATCH_TOKENS = 1 << 17  # on an accelerator: at most this many ids a device a call
CHUNK_TEXTS = 2048  # texts tokenized and packed together, while the device runs the chunk before


class EmbeddingError(ValueError):
  """A sentence-transformers folder, or an argument, that SentenceEncoder cannot take. Each
  encoder's error is a subclass, which reads a folder's files as its own (`read`)."""

  @classmethod
  def read(cls, file: str, required: bool = True,
           files: modules_json.FolderFiles | None = None) -> dict | None:
    """The JSON object in `file` (None where there is none, unless `required`), through the
    load's `files` where given; this error in one line naming the file where it is no such
    object."""
    return modules_json.read_json(file, cls, dict, required, files)


# ---------------------------------------------------------------------------------------------
# The modules after the Transformer


@dataclasses.dataclass(frozen=True)
class Pooling:
  """Pooling's modes, concatenated in this order, and whether a prompt's ids are pooled."""
  modes: tuple[str, ...] = ("mean",)
  include_prompt: bool = True


@dataclasses.dataclass(frozen=True)
class Dense:
  """A Dense module: activation(x W + b) [+ x, or x R where the widths differ]."""
  in_features: int
  out_features: int
  bias: bool = True
  activation: str = "Tanh"
  residual: bool = False


@dataclasses.dataclass(frozen=True)
class Normalize:
  """x / max(|x|, 1e-12), as torch's F.normalize."""


@dataclasses.dataclass(frozen=True)
class SentenceModel:
  """What a folder's modules compute, apart from their weights: the encoder's config, the
  pooling, then the Dense and Normalize steps in order; `quantize`: the dense layers' products
  in int8 (`flax_encoder.quantized`; the weights are then its form)."""
  config: EncoderConfig
  pooling: Pooling
  steps: tuple[Dense | Normalize, ...] = ()
  quantize: str | None = None

  @property
  def dim(self) -> int:
    dim = len(self.pooling.modes) * self.config.d_model
    for step in self.steps:
      dim = step.out_features if isinstance(step, Dense) else dim
    return dim


def segments_per_row(length: int) -> int:
  """The texts a packed row of `length` ids holds at most: `embed`'s second axis."""
  return packing.segments_per_row(length, "text")


class SentenceEmbedding(nn.Module):
  """A folder's computation as a linen module: the encoder ('encoder'), the pooling, then each
  Dense ('dense_i', i its place among the steps) and Normalize in order. `embed` applies it
  to a folder's parameters; `python -m train`'s embed task trains it.

  Attributes:
    model: what it computes.
    check_traced_ids: as `Encoder`'s (False where the ids were checked on the host).
  """

  model: SentenceModel
  check_traced_ids: bool = True

  @nn.compact
  def __call__(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None, pool_from: jax.Array | int = 0,
               segments: int | None = None, *, deterministic: bool = True) -> jax.Array:
    """Packed rows -> each segment's sentence embedding, float32 [r, segments, dim] (see
    `embed`). Without `segment_ids`, padded rows of a text each -> float32 [r, dim], the run of
    config.pad_id that ends a row being padding (as `Encoder` takes such rows)."""
    rows, length = tokens.shape
    hidden = Encoder(self.model.config, self.check_traced_ids, name="encoder")(
        tokens, segment_ids=segment_ids, positions=positions, deterministic=deterministic)
    padded = segment_ids is None
    if padded:
      segment_ids, positions = one_text_a_row(tokens, self.model.config.pad_id)
      segments = 1
    segments = segments or segments_per_row(length)
    x, present = pool(self.model.pooling.modes, hidden, segment_ids, positions, segments,
                      pool_from)
    x = jnp.where(present[:, None], apply_steps(self.model.steps, x), 0)
    return x if padded else x.reshape(rows, segments, -1)


class DenseStep(nn.Module):
  """A Dense module's parameters and computation: activation(x W + b) [+ x, or x R where the
  widths differ]; {'kernel' [in, out], 'bias' [out], 'residual' [in, out]}, as `read_dense`
  reads them. Fresh weights are torch.nn.Linear's (U(+-1/sqrt(in)))."""

  step: Dense

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    step = self.step
    shape = (step.in_features, step.out_features)
    weight = lambda axes, init=_torch_linear: nn.with_logical_partitioning(init, axes)
    y = _matmul(x, self.param("kernel", weight(("embed", "mlp")), shape))
    if step.bias:
      bound = 1 / math.sqrt(step.in_features)
      bias = lambda key, s, dtype=jnp.float32: jax.random.uniform(key, s, dtype, -bound, bound)
      y = y + self.param("bias", weight(("mlp",), bias), shape[1:])
    y = activations.torch_class(step.activation)(y)
    if step.residual:
      y = y + (_matmul(x, self.param("residual", weight(("embed", "mlp")), shape))
               if step.in_features != step.out_features else x)
    return y


def _matmul(x: jax.Array, kernel) -> jax.Array:
  """x [..., in] times kernel [in, out], written as `jax.lax.dot_general` (nn.Dense's product),
  which a quantized module (flax_encoder.quantized) computes in int8 on a quantized kernel."""
  return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


def _torch_linear(key, shape, dtype=jnp.float32):
  """torch.nn.Linear's default weights (kaiming_uniform, a=sqrt(5)): U(+-1/sqrt(in))."""
  bound = 1 / math.sqrt(shape[0])
  return jax.random.uniform(key, shape, dtype, -bound, bound)


def apply_steps(steps: Sequence[Dense | Normalize], x: jax.Array) -> jax.Array:
  """`x` through the Dense ('dense_i') and Normalize steps in order, within a module's call."""
  for i, step in enumerate(steps):
    x = DenseStep(step, name=f"dense_{i}")(x) if isinstance(step, Dense) else normalize(x)
  return x


def embed(model: SentenceModel, params: dict, tokens: jax.Array, segment_ids: jax.Array,
          positions: jax.Array, pool_from: jax.Array | int = 0,
          segments: int | None = None) -> jax.Array:
  """Packed rows -> each segment's sentence embedding, a pure function to jit:
  `SentenceEmbedding(model)` applied to `params`.

  Args:
    model, params: a folder's, as `SentenceEncoder` holds them (`.model`, `.params`).
    tokens: int [r, s], each segment its ids ([CLS] … [SEP]) then padding.
    segment_ids: int [r, s], 1 … `segments` for the texts of a row, 0 at padding.
    positions: int [r, s], each id's position in its text (0 at its first).
    pool_from: ids at positions below it are left out of the pooling (a prompt's, where the
      pooling excludes it); 0 pools every id.
    segments: the segments of a row (default `segments_per_row(s)`).

  Returns:
    float32 [r, segments, dim]: segment j + 1 of row i at [i, j]; zeros where a row has no
    segment j + 1.
  """
  module = quantized.quantized(SentenceEmbedding(model), model.quantize)
  return module.apply({"params": params}, tokens, segment_ids, positions, pool_from, segments)


def normalize(x: jax.Array) -> jax.Array:
  """Rows scaled to length 1, as torch's F.normalize (x / max(|x|, 1e-12)); a row of zeros
  stays 0 with a gradient of 0, where the norm's square root would give NaN."""
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, -1, keepdims=True), 1e-24))


# ---------------------------------------------------------------------------------------------
# Packing


@dataclasses.dataclass(frozen=True)
class PackedRows:
  """Texts packed into rows of one length: `embed`'s inputs (int32 [rows, length] each) and
  where each text lies in its output: text t is [where[t, 0], where[t, 1]]. Pairs packed with
  where their second texts start have `token_types` (0, then 1 from each second text on)."""
  tokens: np.ndarray
  segment_ids: np.ndarray
  positions: np.ndarray
  where: np.ndarray
  token_types: np.ndarray | None = None


def assign_rows(lengths: Sequence[int], row_lengths: Sequence[int],
                max_segments: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
  """First-fit decreasing: texts of `lengths` ids, longest first, each into the first open row
  with room for it and a free segment, else into a new row of the shortest of `row_lengths`
  that holds it (`max_segments[i]` texts at most in a row of `row_lengths[i]`). Returns
  (each text's row, each row's index in `row_lengths`)."""
  lengths = np.asarray(lengths, np.int64)
  room = np.zeros(len(lengths), np.int64)  # rows' free ids; there are at most a row per text
  free = np.zeros(len(lengths), np.int64)  # rows' free segments
  kind = np.zeros(len(lengths), np.int64)
  row_of = np.zeros(len(lengths), np.int64)
  rows = 0
  for t in np.argsort(-lengths, kind="stable"):
    n = lengths[t]
    fits = np.flatnonzero((room[:rows] >= n) & (free[:rows] > 0))
    if len(fits):
      row = fits[0]
    else:
      row, rows = rows, rows + 1
      kind[row] = next(i for i, size in enumerate(row_lengths) if n <= size)
      room[row], free[row] = row_lengths[kind[row]], max_segments[kind[row]]
    row_of[t] = row
    room[row] -= n
    free[row] -= 1
  return row_of, kind[:rows]


def fill_rows(ids: Sequence[np.ndarray], texts: Sequence[int], row_of: np.ndarray,
              rows: Sequence[int], length: int, pad_id: int,
              second_starts: Sequence[int] | None = None) -> PackedRows:
  """The rows `rows` (indices of `assign_rows`' rows) of `length` ids, holding the `texts` (of
  `ids`) whose row (`row_of`) is among them, in their order; `where` in the order of `texts`.
  With `second_starts` (of each of `ids`: where its pair's second text begins), token types
  too."""
  at = {row: i for i, row in enumerate(rows)}
  tokens = np.full((len(rows), length), pad_id, np.int32)
  segment_ids = np.zeros((len(rows), length), np.int32)
  positions = np.zeros((len(rows), length), np.int32)
  used = np.zeros(len(rows), np.int64)
  count = np.zeros(len(rows), np.int64)
  where = np.zeros((len(texts), 2), np.int64)
  types = None if second_starts is None else np.zeros((len(rows), length), np.int32)
  for j, t in enumerate(texts):
    i, n = at[row_of[t]], len(ids[t])
    start = used[i]
    tokens[i, start:start + n] = ids[t]
    if types is not None:
      types[i, start + second_starts[t]:start + n] = 1
    segment_ids[i, start:start + n] = count[i] + 1
    positions[i, start:start + n] = np.arange(n)
    where[j] = i, count[i]
    used[i] += n
    count[i] += 1
  return PackedRows(tokens, segment_ids, positions, where, types)


def default_batch_tokens(config: EncoderConfig, device: jax.Device, length: int) -> int:
  """The ids a call encodes on `device` by default: BATCH_TOKENS on a CPU (measured: more gains
  nothing there); on an accelerator, the power of two whose activations take at most a quarter
  of the device's memory, between BATCH_TOKENS and MAX_BATCH_TOKENS. An id's activations are
  estimated as 4-byte values: a few of width d_model and d_ff, plus its row of attention
  scores per head (`length` of them), as an unfused attention keeps them."""
  limit = (device.memory_stats() or {}).get("bytes_limit") if device.platform != "cpu" else None
  if not limit:
    return BATCH_TOKENS
  per_id = 4 * (8 * config.d_model + 2 * config.d_ff + 2 * config.n_heads * length)
  fits = limit // 4 // per_id
  return int(min(MAX_BATCH_TOKENS, max(BATCH_TOKENS, 1 << (max(1, fits).bit_length() - 1))))


def call_rows(rows: int, per_call: int) -> list[int]:
  """The row counts of the calls that encode `rows` rows: `per_call` each, the rest in calls of
  powers of four, largest first (13: 4, 4, 4, 1). No call computes an empty row, and calls
  take log4(per_call) + 2 shapes at most (each shape compiles once)."""
  calls, rest = [per_call] * (rows // per_call), rows % per_call
  while rest:
    size = 1 << (rest.bit_length() - 1) // 2 * 2  # the largest power of four <= rest
    calls += [size] * (rest // size)
    rest %= size
  return calls


# ---------------------------------------------------------------------------------------------
# Reading a folder


def module_kind(module_type, file: str, which: str, kinds: dict[str, str] = MODULE_KINDS,
                error: type[ValueError] = EmbeddingError, reader: str = "SentenceEncoder") -> str:
  """The kind of a module of type `module_type` among the `kinds` the encoder class `reader`
  computes, `which` naming it in `file`; `error` in one line where it is none of them."""
  kind = kinds.get(module_type) if isinstance(module_type, str) else None
  if kind is None:
    raise error(f"{file}: {which} is of type {module_type!r}, which {reader} does not "
                f"compute; it computes {', '.join(sorted(set(kinds.values())))}")
  return kind


def read_modules(path: str, files: modules_json.FolderFiles | None = None) -> list[tuple[str, str]]:
  """(kind, folder) of each module of modules.json after the Transformer (a folder without a
  Router: `read_routes` reads one), read through a load's `files` where given."""
  file = os.path.join(path, "modules.json")
  try:
    modules = modules_json.read_modules(path, files)
  except ModulesError as e:
    raise EmbeddingError(str(e)) from None
  kinds = []
  for i, module in enumerate(modules):
    kind = module_kind(module.get("type"), file, f"module {i}")
    if kind == "Router":
      raise EmbeddingError(f"{file}: module {i} is a Router (modules picked by the task: "
                           f"SentenceEncoder.load computes it, training and export do not), "
                           f"expected a Transformer then a Pooling")
    if (kind == "Transformer") != (i == 0):
      raise EmbeddingError(f"{file}: module {i} is a {kind}, expected the Transformer first "
                           f"and only there")
    kinds.append((kind, os.path.join(path, module["path"])))
  if len(kinds) < 2 or kinds[1][0] != "Pooling":
    raise EmbeddingError(f"{file}: expected a Pooling module after the Transformer (it gives "
                         f"one vector a text), found {[k for k, _ in kinds[1:2]] or 'none'}")
  if any(kind == "Pooling" for kind, _ in kinds[2:]):
    raise EmbeddingError(f"{file}: more than one Pooling module")
  return kinds[1:]


def read_routes(path: str, modules: Sequence[dict], files: modules_json.FolderFiles | None = None
               ) -> Router:
  """The Router of the folder `path`, whose modules.json's `modules` are the Router then
  modules run after any route: each route's (Transformer module's folder, (kind, folder) of
  each module after it: the route's own, then those after the Router)."""
  file = os.path.join(path, "modules.json")
  after = [(module_kind(m.get("type"), file, f"module {i}"), os.path.join(path, m["path"]))
           for i, m in enumerate(modules[1:], 1)]
  router = read_router(os.path.normpath(os.path.join(path, modules[0]["path"])), EmbeddingError,
                       files)
  routes = {}
  for route, route_modules in router.routes.items():
    kinds = [(module_kind(m.type, router.file, f"module {m.name!r} (route {route!r})"),
              m.folder) for m in route_modules] + after
    names = [kind for kind, _ in kinds]
    if names[:2] != ["Transformer", "Pooling"] or not set(names[2:]) <= {"Dense", "Normalize"}:
      then = " (its own, then modules.json's after the Router)" if after else ""
      raise EmbeddingError(f"{router.file}: route {route!r} runs {names}{then}, expected a "
                           f"Transformer, a Pooling, then Dense and Normalize modules")
    routes[route] = (kinds[0][1], kinds[1:])
  return router.with_routes(routes)


def read_pooling(folder: str, width: int | None = None,
                 files: modules_json.FolderFiles | None = None
                ) -> Pooling:
  """Pooling's config.json: pooling_mode (a mode or a list of them; sentence-transformers 6) or
  the pooling_mode_* flags (earlier), include_prompt; its width checked to be `width` (where
  given)."""
  file = os.path.join(folder, "config.json")
  config = EmbeddingError.read(file, files=files)
  bad = lambda key, expected: EmbeddingError(
      f"{file}: {key}={config.get(key)!r}, expected {expected}")
  dim = config.get("embedding_dimension", config.get("word_embedding_dimension", width))
  if width is not None and dim != width:
    key = "embedding_dimension" if "embedding_dimension" in config else "word_embedding_dimension"
    raise bad(key, f"the Transformer's hidden size {width}")
  if "pooling_mode" in config:
    modes = config["pooling_mode"]
    modes = [modes] if isinstance(modes, str) else modes
    if not isinstance(modes, list) or not modes or not all(m in POOLING_MODES for m in modes):
      raise bad("pooling_mode", f"one of {POOLING_MODES} or a list of them")
  else:
    for key in POOLING_FLAGS:
      if not isinstance(config.get(key, False), bool):
        raise bad(key, "true or false")
    # sentence-transformers 6 pools the mean where the file sets no flag
    modes = [mode for key, mode in POOLING_FLAGS.items() if config.get(key)] or ["mean"]
  if not isinstance(config.get("include_prompt", True), bool):
    raise bad("include_prompt", "true or false")
  return Pooling(tuple(modes), config.get("include_prompt", True))


# The features a Dense or Normalize module may run on (read_dense's and read_normalize's
# `on`), and which vectors they are.
_RUNS_ON = {"sentence_embedding": "SentenceEncoder runs it on the pooled vector",
            "token_embeddings": "a multi-vector model runs it on each token's vector"}


def read_dense(folder: str, width: int, on: str = "sentence_embedding",
               files: modules_json.FolderFiles | None = None) -> tuple[Dense, dict]:
  """A Dense module's config.json and weights (model.safetensors, or pytorch_model.bin as
  `read_hf_weights` reads it), checked against the `width` before it and to read and write
  the feature `on` (module_input_name, module_output_name; where unset, `on`: the pooled
  vector, or "token_embeddings", each token's, which a multi-vector model's Dense reads where
  its file names none)."""
  file = os.path.join(folder, "config.json")
  config = EmbeddingError.read(file, files=files)
  bad = lambda key, expected: EmbeddingError(
      f"{file}: {key}={config.get(key)!r}, expected {expected}")
  for key in ("in_features", "out_features"):
    if isinstance(config.get(key), bool) or not isinstance(config.get(key), int) or (
        config[key] < 1):
      raise bad(key, "an integer >= 1")
  if config["in_features"] != width:
    raise bad("in_features", f"the width of the module before it, {width}")
  for key in ("bias", "use_residual"):
    if not isinstance(config.get(key, key == "bias"), bool):
      raise bad(key, "true or false")
  for key in ("module_input_name", "module_output_name"):
    if config.get(key, on) not in (on, None):
      raise bad(key, f"{on!r} ({_RUNS_ON[on]})")
  activation = config.get("activation_function", "torch.nn.modules.activation.Tanh")
  name = activation.rsplit(".", 1)[-1] if isinstance(activation, str) else None
  if not (isinstance(activation, str) and activation.startswith("torch.") and name in ACTIVATIONS):
    raise bad("activation_function", f"one of torch.nn's {', '.join(ACTIVATIONS)}")
  step = Dense(config["in_features"], config["out_features"], config.get("bias", True), name,
               config.get("use_residual", False))
  try:
    state = read_hf_weights(folder, files)
  except HFError as e:
    raise EmbeddingError(f"{folder}: the Dense module's weights: {e}") from None
  shapes = {"linear.weight": (step.out_features, step.in_features)}
  if step.bias:
    shapes["linear.bias"] = (step.out_features,)
  if step.residual and step.in_features != step.out_features:
    shapes["residual.weight"] = (step.out_features, step.in_features)
  for key, shape in shapes.items():
    if key not in state or tuple(state[key].shape) != shape:
      got = f"shape {tuple(state[key].shape)}" if key in state else "missing"
      raise EmbeddingError(f"{folder}: the Dense module's {key} is {got}, expected {shape} "
                           f"(config.json's in_features and out_features)")
  params = {"kernel": np.asarray(state["linear.weight"], np.float32).T}
  if step.bias:
    params["bias"] = np.asarray(state["linear.bias"], np.float32)
  if "residual.weight" in shapes:
    params["residual"] = np.asarray(state["residual.weight"], np.float32).T
  return step, params


def read_normalize(folder: str, on: str = "sentence_embedding",
                   files: modules_json.FolderFiles | None = None) -> Normalize:
  """A Normalize module (its folder may be absent: it has nothing to save), checked to
  normalize the feature `on`. sentence-transformers' Normalize reads "sentence_embedding"
  where its file names none, and writes what it read where the file names no output."""
  file = os.path.join(folder, "config.json")
  config = EmbeddingError.read(file, required=False, files=files) or {}
  given = config.get("module_input_name")
  names = {"module_input_name": "sentence_embedding" if given is None else given}
  output = config.get("module_output_name")
  names["module_output_name"] = names["module_input_name"] if output is None else output
  for key, name in names.items():
    if name != on:
      raise EmbeddingError(f"{file}: {key}={config.get(key)!r}, expected {on!r} "
                           f"({_RUNS_ON[on]})")
  return Normalize()


def read_settings(path: str, files: modules_json.FolderFiles | None = None
                  ) -> tuple[dict[str, str], str | None, str]:
  """config_sentence_transformers.json's prompts, default_prompt_name and similarity_fn_name
  (cosine where it names none, as sentence-transformers defaults)."""
  file = os.path.join(path, "config_sentence_transformers.json")
  config = EmbeddingError.read(file, required=False, files=files) or {}
  prompts, default = read_prompts(config, file)
  similarity = config.get("similarity_fn_name") or "cosine"
  if similarity not in SIMILARITIES:
    raise EmbeddingError(f"{file}: similarity_fn_name={similarity!r}, expected one of "
                         f"{SIMILARITIES}")
  return prompts, default, similarity


def read_prompts(config: dict, file: str, error: type[ValueError] = EmbeddingError,
                 nulls: bool = False) -> tuple[dict[str, str], str | None]:
  """config_sentence_transformers.json's (`config`, of `file`) prompts and
  default_prompt_name, checked; `nulls`: a prompt may be null, read as "" (as a
  MultiVectorEncoder reads it). `error` in one line naming the file where they are wrong."""
  prompts = config.get("prompts") or {}
  texts = (str, type(None)) if nulls else str
  if not isinstance(prompts, dict) or not all(
      isinstance(k, str) and isinstance(v, texts) for k, v in prompts.items()):
    raise error(f"{file}: prompts={prompts!r}, expected an object of names to texts")
  default = config.get("default_prompt_name")
  if default is not None and default not in prompts:
    raise error(f"{file}: default_prompt_name={default!r}, expected one of the prompts' names "
                f"{sorted(prompts)} or null")
  return {k: v or "" for k, v in prompts.items()}, default


def checked_prompts(prompts: dict[str, str] | None, default_prompt_name: str | None,
                    error: type[ValueError] = EmbeddingError) -> dict[str, str]:
  """`prompts` (None: none) as a writer of a folder takes them: names to texts, and
  `default_prompt_name` one of them or None; `error` (the caller's type) in one line
  otherwise."""
  prompts = dict(prompts or {})
  if not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
    raise error(f"prompts={prompts!r}, expected names to texts")
  if default_prompt_name is not None and default_prompt_name not in prompts:
    raise error(f"default_prompt_name={default_prompt_name!r}, expected one of the prompts' "
                f"names {sorted(prompts)} or None")
  return prompts


def read_max_seq_length(module: str, max_len: int, files: modules_json.FolderFiles | None = None
                       ) -> int:
  """The ids a text is cut to: the Transformer module's (folder `module`'s)
  sentence_*_config.json max_seq_length, else its tokenizer's model_max_length (where
  sentence-transformers 6 saves it), at most the encoder's `max_len` (the positions it has),
  as sentence-transformers caps the tokenizer's."""
  key = "max_seq_length"
  file, config = _transformer_config(module, files)
  value = config.get(key)
  if value is None:  # the tokenizer's, read where its tokenizer is (tokenizer_from_directory)
    key, file = "model_max_length", os.path.join(module, "tokenizer_config.json")
    value = (EmbeddingError.read(file, required=False, files=files) or {}).get(key)
  if value is None:
    return max_len
  # JSON's NaN and Infinity read as floats: no length
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
      math.isfinite(value) and value >= 3):
    raise EmbeddingError(f"{file}: {key}={value!r}, expected an integer >= 3")
  return int(min(value, max_len))


def _transformer_config(module: str, files: modules_json.FolderFiles | None = None
                       ) -> tuple[str, dict]:
  """(file, its object) of the Transformer module's (folder `module`'s) settings: the first
  sentence_*_config.json there is ({} where there is none)."""
  for name in TRANSFORMER_CONFIGS:
    file = os.path.join(module, name)
    config = EmbeddingError.read(file, required=False, files=files)
    if config is not None:
      return file, config
  return os.path.join(module, TRANSFORMER_CONFIGS[0]), {}


# The Transformer module's settings that tokenize a task's texts otherwise (a multi-vector
# model's), which SentenceEncoder does not apply -> the task.
_TASK_SETTINGS = {"query_length": "query", "document_length": "document",
                  "query_expansion": "query"}


def read_task_settings(module: str, files: modules_json.FolderFiles | None = None
                      ) -> dict[str, str]:
  """{task: 'FILE: key=value'} of the Transformer module's (folder `module`'s) settings that
  sentence-transformers applies to that task's texts alone (_TASK_SETTINGS), where set."""
  file, config = _transformer_config(module, files)
  return {task: f"{file}: {key}={config[key]!r}" for key, task in _TASK_SETTINGS.items()
          if config.get(key) is not None}


# ---------------------------------------------------------------------------------------------
# The encoder


# ---------------------------------------------------------------------------------------------
# Writing a folder

# The module types written: sentence-transformers' names before 6, which every version reads.
_WRITTEN_TYPES = {"Transformer": TRANSFORMERS[0], "Pooling": "sentence_transformers.models.Pooling",
                  "Dense": "sentence_transformers.models.Dense",
                  "Normalize": "sentence_transformers.models.Normalize"}


def torch_activation(name: str) -> str:
  """The torch.nn activation class `name` where torch keeps it, as a Dense module's config.json
  (and a CrossEncoder's activation_fn) names it."""
  return f"torch.nn.modules.{'linear' if name == 'Identity' else 'activation'}.{name}"


def save_modules(path: str, model: SentenceModel, params: dict, max_seq_length: int,
                 similarity: str = "cosine", prompts: dict[str, str] | None = None,
                 default_prompt_name: str | None = None, do_lower_case: bool = False) -> None:
  """Writes into `path`, beside a Hugging Face model directory of `model.config` (the
  Transformer module: config.json, weights, tokenizer.json), the files that make it a
  sentence-transformers folder of `model`: modules.json, sentence_bert_config.json,
  config_sentence_transformers.json and a folder per module after the Transformer (Dense's
  weights as model.safetensors: `params['dense_i']`). What `load` reads back; in the layout
  sentence-transformers 2 to 6 read (Pooling's mode flags where they give the modes' order).
  `do_lower_case`: sentence-transformers lower-cases texts before the tokenizer reads them
  (say so where the tokenizer.json beside it does not lower-case them itself)."""
  write = modules_json.write_json
  modules = [("Transformer", "")]
  width = model.config.d_model
  pooling = {"word_embedding_dimension": width}
  flagged = [mode for mode in POOLING_FLAGS.values() if mode in model.pooling.modes]
  if tuple(flagged) == model.pooling.modes:
    pooling.update({key: mode in flagged for key, mode in POOLING_FLAGS.items()})
  else:  # an order the flags cannot say: sentence-transformers 6's list
    pooling["pooling_mode"] = list(model.pooling.modes)
  if not model.pooling.include_prompt:
    pooling["include_prompt"] = False
  modules.append(("Pooling", "1_Pooling"))
  write(os.path.join(path, "1_Pooling", "config.json"), pooling)
  width *= len(model.pooling.modes)
  for step in model.steps:
    folder = f"{len(modules)}_{type(step).__name__}"
    modules.append((type(step).__name__, folder))
    os.makedirs(os.path.join(path, folder), exist_ok=True)
    if isinstance(step, Dense):
      _save_dense(os.path.join(path, folder), step, params[f"dense_{len(modules) - 3}"])
  write(os.path.join(path, "modules.json"), [
      {"idx": i, "name": str(i), "path": folder, "type": _WRITTEN_TYPES[kind]}
      for i, (kind, folder) in enumerate(modules)])
  write(os.path.join(path, "sentence_bert_config.json"),
        {"max_seq_length": max_seq_length, "do_lower_case": do_lower_case})
  write(os.path.join(path, "config_sentence_transformers.json"),
        {"prompts": dict(prompts or {}), "default_prompt_name": default_prompt_name,
         "similarity_fn_name": similarity})


def _save_dense(folder: str, step: Dense, params: dict, on: str = "sentence_embedding") -> None:
  config = {"in_features": step.in_features, "out_features": step.out_features,
            "bias": step.bias, "activation_function": torch_activation(step.activation)}
  if on != "sentence_embedding":  # the feature it reads and writes (read_dense's `on`)
    config["module_input_name"] = config["module_output_name"] = on
  state = {"linear.weight": np.asarray(params["kernel"], np.float32).T}
  if step.bias:
    state["linear.bias"] = np.asarray(params["bias"], np.float32)
  if step.residual:
    config["use_residual"] = True
    if "residual" in params:
      state["residual.weight"] = np.asarray(params["residual"], np.float32).T
  with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
    json.dump(config, f, indent=2)
  write_safetensors(os.path.join(folder, "model.safetensors"), state)


class SentenceEncoder:
  """A sentence-transformers folder's texts -> vectors function (`load`); called on texts it
  returns `SentenceTransformer(folder).encode(texts)`'s float32 [n, dim].

  A Router folder's is its default route's encoder (model, params, tokenizer, `apply`: that
  route's) whose calls run the route their task picks: `router.routes` holds a SentenceEncoder
  a route, each recording its own `shapes`."""

  def __init__(self, model: SentenceModel, params: dict, tokenizer: Tokenizer,
               max_seq_length: int, prompts: dict[str, str] | None = None,
               default_prompt_name: str | None = None, similarity: str = "cosine",
               row_lengths: Sequence[int] | None = None, max_segments: int | None = None,
               template: Template | None = None, tokenizer_file: str = "the tokenizer",
               devices: Sequence[jax.Device] | None = None, truncate_dim: int | None = None,
               quantize: str | None = None):
    if quantized.check(quantize) is not None:
      model, params = self._quantized(model, params, quantize, max_seq_length)
    self.model, self.tokenizer = model, tokenizer
    if truncate_dim is not None and type(self).dim is not SentenceEncoder.dim:
      raise EmbeddingError(f"truncate_dim={truncate_dim!r}: {type(self).__name__}'s vectors are "
                           f"not truncated, expected None")
    # the vectors' first dimensions kept (a Matryoshka model's), as sentence-transformers'
    self.truncate_dim = None if truncate_dim is None else quantization.check_truncate_dim(
        truncate_dim, model.dim, EmbeddingError)
    self.tokenizer_file = tokenizer_file  # what an error of the tokenizer's names
    self._place(params, devices or jax.local_devices()[:1])
    self.max_seq_length = max_seq_length
    self.prompts, self.default_prompt_name = dict(prompts or {}), default_prompt_name
    self.similarity = similarity
    # the special ids around a text: the tokenizer's own unless the caller knows better (a
    # training run's, recorded with its data)
    self.template = template if template is not None else self._tokenizers(
        lambda: tokenizer.template() or Template())
    if row_lengths is None:
      row_lengths = [n for n in ROW_LENGTHS if n < max_seq_length] + [max_seq_length]
    self.row_lengths = tuple(sorted(set(row_lengths)))
    if not self.row_lengths or self.row_lengths[0] < 1 or self.row_lengths[-1] < max_seq_length:
      raise EmbeddingError(f"row_lengths={row_lengths!r}, expected lengths >= 1, the longest "
                           f"at least max_seq_length={max_seq_length}")
    # max_segments=1: a text a row, padded (what packing saves, measured)
    self.max_segments = tuple(max_segments or segments_per_row(n) for n in self.row_lengths)
    self.shapes: set[tuple[int, int]] = set()  # the (rows, length) shapes called so far
    self.router: Router | None = None  # a Router folder's routes (`load`)
    # {task: its setting} of what the Transformer module tokenizes otherwise for a task
    # (read_task_settings), refused where that task is asked for
    self.task_settings: dict[str, str] = {}

  @classmethod
  def load(cls, path: str | os.PathLike, dtype="float32", attention_impl: str | None = None,
           **options) -> SentenceEncoder:
    """The sentence-transformers folder `path` (or a Hugging Face model directory, mean
    pooled as sentence-transformers makes one of it), computed in `dtype` (vectors are float32
    either way) by `attention_impl` (load_hf's default where None). `options`: row_lengths,
    max_segments, devices (SentenceEncoder's). A folder of a Router: its default route's
    encoder, calls routed by their task (`router`). Raises EmbeddingError in one line naming
    the file."""
    path, files = os.fspath(path), modules_json.FolderFiles()
    settings = {"dtype": dtype} | ({"attention_impl": attention_impl} if attention_impl else {})
    try:
      entries = modules_json.read_modules(path, files)
    except ModulesError as e:
      raise EmbeddingError(str(e)) from None
    if entries and entries[0].get("type") in ROUTERS:
      return cls._load_router(path, entries, settings, files, options)
    try:
      module = transformer_folder(path, files)
    except ModulesError as e:
      raise EmbeddingError(str(e)) from None
    if module is None and not os.path.isfile(os.path.join(path, "config.json")):
      raise EmbeddingError(f"{path}: neither modules.json nor config.json, expected a "
                           f"sentence-transformers folder or a Hugging Face model directory")
    # a Hugging Face model directory: mean pooled, as sentence-transformers makes one of it
    modules = read_modules(path, files) if module is not None else []
    return cls._read(path, module or path, modules, settings, read_settings(path, files), files,
                     **options)

  @classmethod
  def _load_router(cls, path: str, entries: list[dict], settings: dict,
                   files: modules_json.FolderFiles, options: dict) -> SentenceEncoder:
    """The encoder of the Router folder `path` (modules.json's `entries`): a SentenceEncoder a
    route, those of one Transformer folder sharing its weights; the folder's prompts (each
    route's tokenizer and pooling say what a prompt's ids are) are the routing encoder's."""
    router = read_routes(path, entries, files)
    prompts, default, similarity = read_settings(path, files)
    encoders, transformers = {}, {}
    for route, (module, modules) in router.routes.items():
      key = os.path.realpath(module)
      encoders[route] = cls._read(module, module, modules, settings, ({}, None, similarity),
                                  files, transformers.get(key), **options)
      route_encoder = encoders[route]
      transformers.setdefault(key, (route_encoder.model.config,
                                    route_encoder.params["encoder"], route_encoder.tokenizer))
    encoder = copy.copy(encoders[router.default_route or next(iter(encoders))])
    encoder.shapes = set()
    encoder.router = router.with_routes(encoders)
    encoder.prompts, encoder.default_prompt_name = prompts, default
    return encoder

  @classmethod
  def _read(cls, source: str, module: str, modules: Sequence[tuple[str, str]], settings: dict,
            folder_settings: tuple[dict[str, str], str | None, str],
            files: modules_json.FolderFiles,
            transformer: tuple[EncoderConfig, dict, Tokenizer] | None = None,
            **options) -> SentenceEncoder:
    """The encoder of the Transformer that `source` reads as (its module's folder `module`)
    and the (kind, folder) `modules` after it, their files read through the load's `files`;
    `folder_settings`: read_settings'. Given `transformer` (config, encoder params,
    tokenizer), its weights are not read again."""
    if transformer is None:
      try:
        hf = read_hf(source, files=files, **settings)
        tokenizer = tokenizer_from_directory(source, files=files)
      except (HFError, TokenizerError) as e:
        raise EmbeddingError(str(e)) from None
      transformer = hf.config, hf.variables["params"], tokenizer
    config, encoder_params, tokenizer = transformer
    params = {"encoder": encoder_params}
    pooling, steps, width = Pooling(), [], config.d_model
    for kind, folder in modules:
      if kind == "Pooling":
        pooling = read_pooling(folder, width, files)
        width *= len(pooling.modes)
      elif kind == "Dense":
        step, params[f"dense_{len(steps)}"] = read_dense(folder, width, files=files)
        steps.append(step)
        width = step.out_features
      else:
        steps.append(read_normalize(folder, files=files))
    # a panic inside `tokenizers` comes of a tokenizer.json's own parts (a Split's regex):
    # those built from vocabulary files are this library's
    tokenizer_file = os.path.join(module, "tokenizer.json")
    encoder = cls(SentenceModel(config, pooling, tuple(steps)), params, tokenizer,
                  read_max_seq_length(module, config.max_len, files), *folder_settings, **options,
                  tokenizer_file=tokenizer_file if os.path.isfile(tokenizer_file) else module)
    encoder.task_settings = read_task_settings(module, files)
    return encoder

  def _place(self, params: dict, devices: Sequence[jax.Device]) -> None:
    """The rows of a call split over `devices` (one mesh axis), the weights copied to each."""
    self.devices = tuple(devices)
    mesh = jax.sharding.Mesh(np.array(self.devices), ("rows",))
    self._rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("rows"))
    self.params = jax.device_put(params, jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec()))

  def on_devices(self, devices: Sequence[jax.Device]) -> SentenceEncoder:
    """This encoder with each call's rows split over `devices` (its weights copied to each)."""
    encoder = copy.copy(self)
    encoder.shapes = set()
    encoder._place(self.params, devices)
    if self.router is not None:  # a sparse Router's static routes run on the host
      encoder.router = self.router.with_routes({
          name: route.on_devices(devices) if isinstance(route, SentenceEncoder) else route
          for name, route in self.router.routes.items()})
    return encoder

  def quantized(self, quantize: str) -> SentenceEncoder:
    """This encoder with its dense layers' products in `quantize` ("int8":
    `flax_encoder.quantized`), as `load(..., quantize=)` gives it; its routes' too."""
    if quantized.check(quantize) is None or self.model.quantize is not None:
      raise EmbeddingError(f"quantize={quantize!r}: expected one of {quantized.QUANTIZATIONS} "
                           f"of an encoder of float weights")
    encoder = copy.copy(self)
    encoder.model, params = self._quantized(self.model, self.params, quantize,
                                            self.max_seq_length)
    encoder.shapes = set()
    encoder._place(params, self.devices)
    if self.router is not None:
      encoder.router = self.router.with_routes({
          name: route.quantized(quantize) if isinstance(route, SentenceEncoder) else route
          for name, route in self.router.routes.items()})
    return encoder

  @classmethod
  def _quantized(cls, model, params: dict, quantize: str, length: int) -> tuple[object, dict]:
    """`model` (its `quantize` field set) and its float `params` in the form of the module that
    computes the dense layers' products in `quantize`."""
    model = dataclasses.replace(model, quantize=quantize)
    module = quantized.quantized(cls.module(model), quantize)
    rows = jnp.zeros((1, length), jnp.int32)
    return model, quantized.quantized_params(module, params, *cls._example_call(rows))

  @staticmethod
  def module(model: SentenceModel) -> nn.Module:
    """The linen module computing `model`, as `embed` applies it (each type's own)."""
    return SentenceEmbedding(model)

  @staticmethod
  def _example_call(rows: jax.Array) -> tuple:
    """The arguments of a call of `module(model)` on `rows` (one row of ids), as
    `quantized_params` traces it."""
    return rows, rows, rows, 0, 1

  @property
  def dim(self) -> int:
    """The width of a vector: the model's, or truncate_dim."""
    return self.truncate_dim or self.model.dim

  def apply(self, params: dict, tokens, segment_ids, positions, pool_from=0,
            segments: int | None = None) -> jax.Array:
    """`embed` with this encoder's model: packed rows -> float32 [r, segments, dim]."""
    return embed(self.model, params, tokens, segment_ids, positions, pool_from, segments)

  def prompt_text(self, prompt: str | None = None, prompt_name: str | None = None) -> str:
    """The prompt put before each text: `prompt`, the prompt named `prompt_name`, else the
    default prompt ('' where there is none)."""
    if prompt is not None and prompt_name is not None:
      raise EmbeddingError(f"prompt={prompt!r} and prompt_name={prompt_name!r}: expected one "
                           f"of them")
    if prompt_name is not None and prompt_name not in self.prompts:
      raise EmbeddingError(f"prompt_name={prompt_name!r}, expected one of the folder's "
                           f"prompts {sorted(self.prompts)}")
    if prompt is None:
      prompt = self.prompts.get(prompt_name or self.default_prompt_name or "", "")
    if not isinstance(prompt, str):
      raise EmbeddingError(f"prompt={prompt!r}, expected a text")
    return prompt

  def prompt_length(self, prompt: str) -> int:
    """The ids of `prompt` that the pooling leaves out where it excludes the prompt: the
    prompt tokenized alone with its special ids, less the one after it."""
    if not prompt:
      return 0
    ids = self.tokenize([prompt])[0]
    return len(ids) - (1 if self.template.end else 0)

  def tokenize(self, texts: Sequence[str], prompt: str = "") -> list[np.ndarray]:
    """Each text's ids, the prompt before it, with the special ids around ([CLS] … [SEP]),
    cut to max_seq_length as sentence-transformers cuts them."""
    ids = self._tokenizers(lambda: encode_examples(
        self.tokenizer, [prompt + t for t in texts], None, self.max_seq_length, 0,
        self.template))
    vocab = self.model.config.vocab_size
    if ids and max(int(i.max(initial=0)) for i in ids) >= vocab:
      raise EmbeddingError(f"the tokenizer gives ids past the model's vocabulary "
                           f"(vocab_size={vocab}): not this model's tokenizer")
    return ids

  def _tokenizers(self, run):
    """run(), a call into `tokenizers`; EmbeddingError naming the tokenizer's file where
    `tokenizers` panics (a Split regex past Oniguruma's backtracking limit, say)."""
    try:
      return run()
    except TokenizerFailure as e:
      raise EmbeddingError(f"{self.tokenizer_file}: {e}") from None

  def pack(self, ids: Sequence[np.ndarray], length: int | None = None,
           second_starts: Sequence[int] | None = None) -> PackedRows:
    """Texts' ids (`tokenize`) packed into rows of `length` ids (default max_seq_length),
    first-fit, for `embed` (pairs' with `second_starts`: their token types too)."""
    length = length or self.max_seq_length
    if any(len(i) > length for i in ids):
      raise EmbeddingError(f"length={length}: shorter than a text's ids "
                           f"({max(map(len, ids))})")
    row_of, kinds = assign_rows([len(i) for i in ids], [length], [segments_per_row(length)])
    return fill_rows(ids, range(len(ids)), row_of, range(len(kinds)), length,
                     self.model.config.pad_id, second_starts)

  def default_batch_tokens(self) -> int:
    """The ids a call encodes on each device where `__call__` is not told
    (`default_batch_tokens` of the first device, for the longest rows)."""
    return default_batch_tokens(self.model.config, self.devices[0], self.row_lengths[-1])

  def __call__(self, texts: Sequence[str] | str, prompt: str | None = None,
               prompt_name: str | None = None, batch_tokens: int | None = None,
               task: str | None = None, progress: Callable[[int], None] | None = None, *,
               precision: str = "float32", ranges: np.ndarray | None = None) -> np.ndarray:
    """float32 [len(texts), dim] (a text alone: [dim]): each text's vector, the prompt
    (`prompt_text`) before it. `task` ("query", "document"; None: encode's) picks a Router's
    route; without a Router it changes nothing, as in sentence-transformers. A call encodes
    `batch_tokens` ids on each device at most (default: `default_batch_tokens()`), in rows of
    `row_lengths`; `progress(n)`, where given, is told of the n texts of each such call as its
    vectors are back (a progress bar's update). `precision` (int8, uint8, binary, ubinary:
    `quantization.quantize`, `ranges` those of int8 and uint8, else the call's own vectors')
    gives them as sentence-transformers' encode(precision=...) does."""
    quantization.check_precision(precision)
    if precision != "float32":
      vectors = self(texts, prompt, prompt_name, batch_tokens, task, progress)
      try:
        return quantization.quantize(vectors, precision, ranges)
      except quantization.QuantizationError as e:
        raise EmbeddingError(str(e)) from None
    if isinstance(texts, str):
      return self([texts], prompt, prompt_name, batch_tokens, task)[0]
    if task is not None and not isinstance(task, str):
      raise EmbeddingError(f"task={task!r}, expected a str such as 'query' or 'document'")
    if self.router is not None:
      route = self.router.routes[self.router.resolve(task)]
      return route(texts, self.prompt_text(prompt, prompt_name), None, batch_tokens, task,
                   progress)
    if task in self.task_settings:
      raise EmbeddingError(f"task={task!r}: {self.task_settings[task]}, which "
                           f"sentence-transformers applies to that task's texts and "
                           f"SentenceEncoder does not")
    texts = list(texts)
    for i, text in enumerate(texts):
      if not isinstance(text, str):
        raise EmbeddingError(f"texts[{i}]: a {type(text).__name__}, expected a str")
    batch_tokens = self._batch_tokens(batch_tokens)
    prompt = self.prompt_text(prompt, prompt_name)
    pool_from = 0 if self.model.pooling.include_prompt else self.prompt_length(prompt)
    out = np.zeros((len(texts), self.dim), np.float32)
    self._encode_chunks(texts, lambda chunk: self.tokenize(chunk, prompt), batch_tokens,
                        pool_from, out, progress)
    return out

  def _batch_tokens(self, batch_tokens: int | None, error: type[ValueError] = EmbeddingError
                    ) -> int:
    """`batch_tokens` as a call takes it: `default_batch_tokens()` where None; `error` (the
    caller's type) in one line where it is no integer >= 1."""
    if batch_tokens is None:
      return self.default_batch_tokens()
    if isinstance(batch_tokens, bool) or not isinstance(batch_tokens, int) or batch_tokens < 1:
      raise error(f"batch_tokens={batch_tokens!r}, expected an integer >= 1")
    return batch_tokens

  def _encode_chunks(self, items: Sequence, tokenize, batch_tokens: int, pool_from: int,
                     out, progress: Callable[[int], None] | None = None) -> None:
    """Encodes `items` (texts, pairs) CHUNK_TEXTS at a time, each chunk's ids
    `tokenize(chunk)` (pairs': ids and where each one's second text starts), its outputs read
    back into `out` (`_collect`) while the device runs the chunk after it: the next chunk is
    tokenized as the one before is encoded. `progress(n)` is told of each call's n items as
    they are read back."""
    pending = []  # chunks dispatched, not yet read back
    for start in range(0, len(items), CHUNK_TEXTS):
      ids = tokenize(items[start:start + CHUNK_TEXTS])
      ids, second_starts = ids if isinstance(ids, tuple) else (ids, None)
      pending.append(self._dispatch(ids, start, batch_tokens, pool_from, second_starts))
      if len(pending) > 1:
        self._collect_calls(pending.pop(0), out, progress)
    for chunk in pending:
      self._collect_calls(chunk, out, progress)

  def _collect_calls(self, calls, out, progress) -> None:
    if progress is None:
      self._collect(calls, out)
      return
    for call in calls:  # one at a time, each said as it is back
      self._collect([call], out)
      progress(len(call[2]))

  def encode_query(self, texts: Sequence[str] | str, prompt: str | None = None,
                   prompt_name: str | None = None, batch_tokens: int | None = None,
                   **options) -> np.ndarray:
    """Queries' vectors, as sentence-transformers' encode_query: the folder's "query" prompt
    unless another is given (none where it has none, never the default prompt), task "query"
    (a Router's query route). `options`: `__call__`'s progress, precision and ranges."""
    if prompt is None and prompt_name is None:
      prompt = self.prompts.get("query", "")
    return self(texts, prompt, prompt_name, batch_tokens, task="query", **options)

  def encode_document(self, texts: Sequence[str] | str, prompt: str | None = None,
                      prompt_name: str | None = None, batch_tokens: int | None = None,
                      **options) -> np.ndarray:
    """Documents' vectors, as sentence-transformers' encode_document: the folder's "document"
    prompt unless another is given (none where it has none), task "document". (Its fall-backs
    "passage" and "corpus" are never reached: sentence-transformers 6 gives every model a
    "document" prompt, '' by default.)"""
    if prompt is None and prompt_name is None:
      prompt = self.prompts.get("document", "")
    return self(texts, prompt, prompt_name, batch_tokens, task="document", **options)

  def _dispatch(self, ids: list[np.ndarray], start: int, batch_tokens: int, pool_from: int,
                second_starts: Sequence[int] | None = None
                ) -> list[tuple[jax.Array, np.ndarray, np.ndarray]]:
    """Packs a chunk's texts (numbered from `start`) and starts their calls; returns each
    call's (output, where its texts lie in it, which texts). Over several devices a call's
    rows are a multiple of their number, the last call's filled up with empty rows."""
    row_of, kinds = assign_rows([len(i) for i in ids], self.row_lengths, self.max_segments)
    calls, n = [], len(self.devices)
    for k, length in enumerate(self.row_lengths):
      rows = np.flatnonzero(kinds == k)
      if not len(rows):
        continue
      texts = np.flatnonzero(np.isin(row_of, rows))
      packed = fill_rows(ids, texts, row_of, rows, length, self.model.config.pad_id,
                         second_starts)
      per_device = call_rows(-(-len(rows) // n), max(1, batch_tokens // length))
      row_starts = np.cumsum([0] + [c * n for c in per_device])
      pad = self.model.config.pad_id
      arrays = [_rows_to(a, row_starts[-1], fill) for a, fill in
                ((packed.tokens, pad), (packed.segment_ids, 0), (packed.positions, 0),
                 (packed.token_types, 0)) if a is not None]
      for first, end in zip(row_starts[:-1], row_starts[1:]):
        mine = (packed.where[:, 0] >= first) & (packed.where[:, 0] < end)
        self.shapes.add((int(end - first), length))
        tokens, segment_ids, positions, *types = (jax.device_put(a[first:end], self._rows)
                                                  for a in arrays)
        output = self._encode(tokens, segment_ids, positions, pool_from, self.max_segments[k],
                              *types)
        calls.append((output, packed.where[mine] - [first, 0], start + texts[mine]))
    return calls

  def save_modules(self, path: str) -> None:
    """Writes beside the Hugging Face model directory in `path` (this encoder's Transformer
    module) the files that make it this encoder's sentence-transformers folder
    (`save_modules`)."""
    if self.router is not None:
      raise EmbeddingError(f"{path}: a Router's encoder, whose routes save_modules does not "
                           f"write; expected an encoder of one route (router.routes)")
    save_modules(path, self.model, self.params, self.max_seq_length, self.similarity,
                 self.prompts, self.default_prompt_name)

  def _encode(self, tokens: jax.Array, segment_ids: jax.Array, positions: jax.Array,
              pool_from: int, segments: int, token_types: jax.Array | None = None
              ) -> jax.Array:
    """One call's packed rows -> its output, started on the devices (not waited for): `embed`,
    jitted. A model type of its own (sparse, multi-vector, reranker: the pairs' token types)
    computes its own here."""
    return _jitted_embed(self.model, self.params, tokens, segment_ids, positions, pool_from,
                         segments)

  def _collect(self, calls, out: np.ndarray) -> None:
    """Each call's texts' outputs read back into `out`, by text."""
    for output, where, texts in calls:
      out[texts] = np.asarray(output)[where[:, 0], where[:, 1], :out.shape[-1]]


def _rows_to(array: np.ndarray, rows: int, fill: int) -> np.ndarray:
  """`array` with rows of `fill` added to make `rows` (empty rows: padding, segment 0)."""
  if rows == len(array):
    return array
  return np.concatenate([array, np.full((rows - len(array), *array.shape[1:]), fill,
                                        array.dtype)])


# One jit for every encoder: two of the same model (`SentenceModel` is hashable) share compiles.
_jitted_embed = jax.jit(embed, static_argnames=("model", "segments"))

