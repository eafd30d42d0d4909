"""Multi-vector (ColBERT late-interaction) models of sentence-transformers 6, in JAX: a vector for
each token of a text, and MaxSim scores between a query's and a document's.

    encoder = MultiVectorEncoder.load("colbert-folder")  # MultiVectorEncoder(...).save's folder
    queries = encoder.encode_query(["What is the capital of France?"])  # [float32 [t_i, dim]]
    documents = encoder.encode_document(["Paris is the capital of France.", "Berlin is ..."])
    scores = encoder.similarity(queries, documents)  # float32 [1, 2], by maxsim

The vectors are `MultiVectorEncoder(folder).encode_query(texts)`'s (and encode_document's): the
Transformer's last hidden state, each token's vector through the folder's Dense and Normalize
modules (module_input_name "token_embeddings"), then only the tokens its MultiVectorMask module
scores, in order. The Transformer module's settings (its sentence_bert_config.json) say how each
side is tokenized: queries cut to query_length ids, documents to document_length (the
tokenizer's model_max_length where unset). With query_expansion, queries are ColBERT's: padded
to `length` ids with the [MASK] token, whose vectors are all scored; the encoder attends to them
or not (`attend`), while each of them attends to the query's own ids. MultiVectorMask leaves out
the tokens of skiplist_words on the sides of skiplist_tasks (documents by default) and, outside
queries, keeps only keep_only_token_ids where given. Prompts ("[Q] ", "[D] ") are put before
the texts as text, as sentence-transformers puts them: encode_query takes the "query" prompt,
encode_document the "document" one.

Texts are packed many to a row as `SentenceEncoder` packs them (flax_encoder.embeddings): each
a segment that attends only to itself, an expanded query a segment of its `length` ids; its
token vectors are the ones it has alone.

`maxsim` is ColBERT's score, a pure function to jit: for each scored query token, its largest
dot product with a scored document token, summed (`mean=True`: averaged, "meanmaxsim").

`save_multi_vector` writes, beside a Hugging Face model directory, the files that make
sentence-transformers 6 load it as a MultiVectorEncoder.

Shapes: q = queries, n = documents, s = query tokens, t = document tokens, d = vector width,
r = packed rows, l = ids of a row.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder import modules_json, quantized
from flax_encoder.config import EncoderConfig
from flax_encoder.embeddings import (MODULE_KINDS, Dense, EmbeddingError, Normalize,
                                     SentenceEncoder, _save_dense, apply_steps, checked_prompts,
                                     read_dense, read_max_seq_length, read_normalize,
                                     read_prompts)
from flax_encoder.encoder import Encoder
from flax_encoder.families import HFError, read_hf
from flax_encoder.hf_tokenizer import TokenizerError, tokenizer_from_directory
from flax_encoder.kernels import KERNELS
from flax_encoder.modules_json import (TRANSFORMER_CONFIGS, TRANSFORMERS, ModulesError,
                                       transformer_folder)
from flax_encoder.tokenizer import Tokenizer

MASK_MODULES = ("sentence_transformers.multi_vector_encoder.modules.multi_vector_mask."
                "MultiVectorMask", "sentence_transformers.multi_vector_encoder.modules."
                "MultiVectorMask")
SIMILARITIES = ("maxsim", "meanmaxsim")
TASKS = (None, "query", "document")
EXPANSION_STRATEGIES = ("fixed", "min")
# sentence-transformers' score of a document without a scored token: below every real one
EMPTY_DOCUMENT_SCORE = -1e9
# The id that stands in a packed row for a query's expansion token: `token_vectors` puts the
# token there and keeps the encoder from attending to it where the expansion says so.
EXPANDED = -1
# Elements of the [q, n, s, t] products a `similarity` call computes at once (256 MB float32)
SCORE_ELEMENTS = 1 << 26
# The keys of config_sentence_transformers.json that PyLate or Stanford ColBERT saves carry,
# which sentence-transformers translates into module settings on load (not read here).
LEGACY_KEYS = ("query_prefix", "document_prefix", "query_length", "document_length",
               "query_expansion", "do_query_expansion", "attend_to_expansion_tokens",
               "attend_to_mask_tokens", "skiplist_words")


class MultiVectorError(EmbeddingError):
  """A multi-vector folder, or an argument, that MultiVectorEncoder cannot take."""


@contextlib.contextmanager
def _refusals():
  """The errors of the readers this module shares (SentenceEncoder's, the families', the
  tokenizer's) raised as MultiVectorError, their message kept."""
  try:
    yield
  except MultiVectorError:
    raise
  except (EmbeddingError, HFError, TokenizerError, ModulesError) as e:
    raise MultiVectorError(str(e)) from None


# ---------------------------------------------------------------------------------------------
# What a folder computes


def _length(value, what: str, least: int = 3) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < least:
    raise MultiVectorError(f"{what}={value!r}, expected an integer >= {least}")


@dataclasses.dataclass(frozen=True)
class Expansion:
  """ColBERT's query expansion (the Transformer module's query_expansion): each query padded to
  `length` ids with the expansion token (`token`; where None, the tokenizer's mask token, else
  its eos token), every one of them scored. The encoder attends to them only where `attend`;
  they attend to the query's ids either way. strategy "fixed" cuts queries to `length` ids too;
  "min" only pads them."""
  length: int
  strategy: str = "fixed"
  attend: bool = False
  token: str | None = None

  def __post_init__(self):
    if self.strategy not in EXPANSION_STRATEGIES:
      raise MultiVectorError(f"query_expansion strategy={self.strategy!r}, expected one of "
                             f"{EXPANSION_STRATEGIES}")
    _length(self.length, "query_expansion length")
    if not isinstance(self.attend, bool):
      raise MultiVectorError(f"query_expansion attend={self.attend!r}, expected true or false")
    if self.token is not None and not isinstance(self.token, str):
      raise MultiVectorError(f"query_expansion token={self.token!r}, expected a token or null")

  def to_dict(self) -> dict:
    """As sentence-transformers' Transformer saves it."""
    return {"strategy": self.strategy, "attend": self.attend, "token": self.token,
            "length": self.length}


@dataclasses.dataclass(frozen=True)
class ScoringMask:
  """A MultiVectorMask module: the tokens of `skiplist_words` are not scored on the sides of
  `skiplist_tasks` (a text encoded without a task counts as a document); outside queries, only
  the ids of `keep_only_token_ids` are, where it is given."""
  skiplist_words: tuple[str, ...] = ()
  skiplist_tasks: tuple[str, ...] = ("document",)
  keep_only_token_ids: tuple[int, ...] | None = None

  def __post_init__(self):
    for key in ("skiplist_words", "skiplist_tasks", "keep_only_token_ids"):
      if isinstance(getattr(self, key), list):  # as a file or a caller gives them
        object.__setattr__(self, key, tuple(getattr(self, key)))
    for key in ("skiplist_words", "skiplist_tasks"):
      value = getattr(self, key)
      if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise MultiVectorError(f"{key}={value!r}, expected a list of strings")
    keep = self.keep_only_token_ids
    if keep is not None and not (isinstance(keep, tuple) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in keep)):
      raise MultiVectorError(f"keep_only_token_ids={keep!r}, expected a list of token ids or "
                             f"null")

  def to_dict(self) -> dict:
    """As MultiVectorMask saves its config.json."""
    keep = self.keep_only_token_ids
    return {"skiplist_words": list(self.skiplist_words),
            "skiplist_tasks": list(self.skiplist_tasks),
            "keep_only_token_ids": None if keep is None else list(keep)}


@dataclasses.dataclass(frozen=True)
class MultiVectorModel:
  """What a multi-vector folder computes, apart from its weights: the encoder's config, the
  Dense and Normalize steps each token's vector takes in order, the scoring mask, and the
  Transformer module's per-side settings (ids a query and a document are cut to, where set;
  the query expansion)."""
  config: EncoderConfig
  steps: tuple[Dense | Normalize, ...] = ()
  mask: ScoringMask = ScoringMask()
  query_length: int | None = None
  document_length: int | None = None
  expansion: Expansion | None = None
  quantize: str | None = None  # the dense layers' products in int8 (flax_encoder.quantized)

  def __post_init__(self):
    width = self.config.d_model
    for i, step in enumerate(self.steps):
      if isinstance(step, Dense):
        if step.in_features != width:
          raise MultiVectorError(f"steps[{i}]: a Dense of in_features={step.in_features}, "
                                 f"expected the width before it, {width}")
        width = step.out_features
      elif not isinstance(step, Normalize):
        raise MultiVectorError(f"steps[{i}]: a {type(step).__name__}, expected a Dense or a "
                               f"Normalize")
    for key in ("query_length", "document_length"):
      if getattr(self, key) is not None:
        _length(getattr(self, key), key)
    expansion = self.expansion
    if expansion is not None:
      if expansion.length > self.config.max_len:
        raise MultiVectorError(f"query_expansion length={expansion.length}: longer than the "
                               f"encoder's positions (max_len={self.config.max_len})")
      if self.query_length is not None and self.query_length < expansion.length:
        raise MultiVectorError(f"query_length={self.query_length} is below query_expansion "
                               f"length={expansion.length}, expected at least it (as "
                               f"sentence-transformers requires)")
      if not expansion.attend and KERNELS[self.config.attention_impl].takes_segment_ids:
        raise MultiVectorError(
            f"query_expansion attend=false with attention_impl="
            f"{self.config.attention_impl!r}: the expansion tokens are left out of the keys by "
            f"a mask, which that kernel does not take; use attention_impl='reference'")

  @property
  def dim(self) -> int:
    dim = self.config.d_model
    for step in self.steps:
      dim = step.out_features if isinstance(step, Dense) else dim
    return dim

  def cut_lengths(self, max_seq_length: int) -> dict[str | None, int]:
    """The ids a text of each task (None, "query", "document") is cut to, as
    sentence-transformers' Transformer.preprocess cuts them (`max_seq_length`, the tokenizer's
    model_max_length, where the side sets none), at most the encoder's positions."""
    expansion = self.expansion
    if expansion is not None and expansion.strategy == "fixed":
      query = expansion.length
    elif expansion is not None and self.query_length is not None:
      query = max(self.query_length, expansion.length)
    else:
      query = self.query_length or max_seq_length
    document = self.document_length or max_seq_length
    # a side's length past the positions cuts nothing more that the encoder could take
    # (sentence-transformers fails on such a text)
    cap = self.config.max_len
    return {None: max_seq_length, "query": min(query, cap), "document": min(document, cap)}


class TokenVectors(nn.Module):
  """A multi-vector folder's computation as a linen module: the encoder ('encoder'), then each
  token's vector through the Dense ('dense_i') and Normalize steps in order, in float32.
  `token_vectors` applies it to a folder's parameters; `python -m train`'s multi_vector task
  trains it.

  Attributes:
    model: what it computes (its steps; the scoring mask and the task settings are
      `token_vectors`' and the encoder's callers').
    check_traced_ids: as `Encoder`'s (False where the ids were checked on the host).
  """

  model: MultiVectorModel
  check_traced_ids: bool = True

  @property
  def dim(self) -> int:
    return self.model.dim

  @nn.compact
  def __call__(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None, mask: jax.Array | None = None, *,
               deterministic: bool = True) -> jax.Array:
    """int [r, l] packed rows (`segment_ids`, `positions` as
    flax_encoder.embeddings.embed takes them; none: a text a row) and the encoder's attention
    `mask` where given -> float32 [r, l, dim], each text's tokens as if it were alone."""
    hidden = Encoder(self.model.config, self.check_traced_ids, name="encoder")(
        tokens, mask, segment_ids=segment_ids, positions=positions,
        deterministic=deterministic)
    return apply_steps(self.model.steps, hidden.astype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class TaskCall:
  """What the calls of one task compute beyond the encoder: the id put in place of EXPANDED
  (None: no expansion), whether the encoder attends to those tokens, and the ids the scoring
  mask leaves out (`skip_ids`) or only keeps (`keep_ids`, where not None)."""
  expansion_id: int | None = None
  attend: bool = True
  skip_ids: tuple[int, ...] = ()
  keep_ids: tuple[int, ...] | None = None


def token_vectors(model: MultiVectorModel, call: TaskCall, params: dict, tokens: jax.Array,
                  segment_ids: jax.Array, positions: jax.Array
                  ) -> tuple[jax.Array, jax.Array]:
  """Packed rows -> each token's vector and whether it is scored, a pure function to jit.

  Args:
    model, params: a folder's, as `MultiVectorEncoder` holds them (`.model`, `.params`).
    call: the task's (`MultiVectorEncoder.task_calls[task]`).
    tokens: int [r, l], each segment its ids ([CLS] … [SEP], then EXPANDED for each expansion
      token of a query), then padding.
    segment_ids: int [r, l], 1 … for the texts of a row, 0 at padding.
    positions: int [r, l], each id's position in its text (0 at its first).

  Returns:
    (float32 [r, l, dim], bool [r, l]): a text's vectors are those of its segment's scored ids.
  """
  expanded = tokens == EXPANDED
  ids = tokens if call.expansion_id is None else jnp.where(expanded, call.expansion_id, tokens)
  # ColBERT's queries: no id attends to an expansion token, which attends to the query's ids
  mask = None if call.attend else ~expanded[:, None, None, :]
  module = quantized.quantized(TokenVectors(model), model.quantize)
  x = module.apply({"params": params}, ids, segment_ids, positions, mask)
  scored = segment_ids > 0
  if call.skip_ids:
    scored &= ~jnp.isin(ids, jnp.asarray(call.skip_ids, ids.dtype))
  if call.keep_ids is not None:
    scored &= jnp.isin(ids, jnp.asarray(call.keep_ids, ids.dtype))
  return x, scored


# ---------------------------------------------------------------------------------------------
# MaxSim


def maxsim(queries: jax.Array, query_mask: jax.Array, documents: jax.Array,
           document_mask: jax.Array, mean: bool = False) -> jax.Array:
  """ColBERT's late-interaction score of every query against every document, as
  sentence-transformers' `maxsim` computes it.

  Args:
    queries: [q, s, d] token vectors; query_mask: [q, s], the tokens scored (a float mask
      weighs them).
    documents: [n, t, d]; document_mask: bool [n, t], the tokens a query token may match.
    mean: divide each score by the query's scored tokens (at least 1): "meanmaxsim".

  Returns:
    float32 [q, n]: for each scored query token its largest dot product with a scored token of
    the document, summed; EMPTY_DOCUMENT_SCORE for a document without a scored token.
  """
  products = jnp.einsum("qsd,ntd->qnst", queries, documents,
                        precision=jax.lax.Precision.HIGHEST)
  return _scores(products, query_mask[:, None, :], document_mask[None, :, None, :], mean)


def maxsim_pairwise(queries: jax.Array, query_mask: jax.Array, documents: jax.Array,
                    document_mask: jax.Array, mean: bool = False) -> jax.Array:
  """`maxsim` of query i against document i only: [n, s, d], [n, s], [n, t, d], [n, t] ->
  float32 [n]."""
  products = jnp.einsum("nsd,ntd->nst", queries, documents, precision=jax.lax.Precision.HIGHEST)
  return _scores(products, query_mask, document_mask[:, None, :], mean)


def _scores(products: jax.Array, query_mask: jax.Array, document_mask: jax.Array,
            mean: bool) -> jax.Array:
  """[..., s, t] products -> [...] scores: the max over the document's scored tokens (its mask
  [..., 1, t]), summed over the query's (weighed by its mask [..., s])."""
  # a masked token is filled with the dtype's minimum, not multiplied by 0: a 0 would win the
  # max over a document's negative products
  best = jnp.where(document_mask, products, jnp.finfo(products.dtype).min).max(-1)
  scores = (best.astype(jnp.float32) * query_mask.astype(jnp.float32)).sum(-1)
  scores = jnp.where(document_mask.any((-2, -1)), scores, EMPTY_DOCUMENT_SCORE)
  if mean:  # after the empty documents' fill, as sentence-transformers divides
    scores = scores / jnp.maximum((query_mask != 0).sum(-1), 1).astype(jnp.float32)
  return scores


def pad_vectors(vectors, what: str = "vectors") -> tuple[np.ndarray, np.ndarray]:
  """Texts' token vectors (a list of [t_i, d] arrays, or one [t, d] array: one text) ->
  (float32 [texts, t, d] zero-padded to the longest, bool [texts, t]: its real rows)."""
  ndim = getattr(vectors, "ndim", None)
  if ndim == 3:  # whose rows are padding, sentence-transformers guesses (rows of zeros)
    raise MultiVectorError(f"{what}: an array of shape {tuple(vectors.shape)}, expected a list "
                           f"of [tokens, dim] arrays (a padded array's padding would be scored)")
  items = [np.asarray(v, np.float32) for v in ([vectors] if ndim == 2 else vectors)]
  dim = items[0].shape[-1] if items else 0
  for i, item in enumerate(items):
    if item.ndim != 2 or item.shape[1] != dim:
      raise MultiVectorError(f"{what}[{i}]: shape {item.shape}, expected [tokens, {dim}]")
  width = max([len(i) for i in items], default=0)
  out = np.zeros((len(items), width, dim), np.float32)
  mask = np.zeros((len(items), width), bool)
  for i, item in enumerate(items):
    out[i, :len(item)], mask[i, :len(item)] = item, True
  return out, mask


def _bucket(n: int) -> int:
  """n rounded up to a power of two (at least 8): the widths and counts `scores` compiles
  for."""
  return max(8, 1 << (max(n, 1) - 1).bit_length())


_jitted_maxsim = jax.jit(maxsim, static_argnames="mean")
_jitted_maxsim_pairwise = jax.jit(maxsim_pairwise, static_argnames="mean")


# ---------------------------------------------------------------------------------------------
# Reading a folder


def _read_modules(path: str, files: modules_json.FolderFiles | None = None
                 ) -> list[tuple[str, str]]:
  """(kind, folder) of each module after the Transformer: Dense, Normalize and one
  MultiVectorMask."""
  file = os.path.join(path, "modules.json")
  kinds = []
  for i, module in enumerate(modules_json.read_modules(path, files)[1:], 1):
    kind = "MultiVectorMask" if module.get("type") in MASK_MODULES else MODULE_KINDS.get(
        module.get("type"))
    if kind not in ("Dense", "Normalize", "MultiVectorMask"):
      raise MultiVectorError(f"{file}: module {i} is of type {module.get('type')!r}, which "
                             f"MultiVectorEncoder does not compute; it computes Dense and "
                             f"Normalize of each token's vector and one MultiVectorMask")
    kinds.append((kind, os.path.join(path, module["path"])))
  masks = sum(kind == "MultiVectorMask" for kind, _ in kinds)
  if masks != 1:
    raise MultiVectorError(f"{file}: {masks} MultiVectorMask modules, expected one (it says "
                           f"which tokens are scored)")
  return kinds


def _read_mask(folder: str, files: modules_json.FolderFiles | None = None) -> ScoringMask:
  """A MultiVectorMask module's config.json."""
  file = os.path.join(folder, "config.json")
  config = MultiVectorError.read(file, files=files)
  known = ("skiplist_words", "skiplist_tasks", "keep_only_token_ids")
  if set(config) - set(known):
    raise MultiVectorError(f"{file}: keys {sorted(set(config) - set(known))}, expected only "
                           f"{', '.join(known)}")
  tasks = config.get("skiplist_tasks")
  values = {"skiplist_words": config.get("skiplist_words") or [],
            "skiplist_tasks": ["document"] if tasks is None else
            [tasks] if isinstance(tasks, str) else tasks,
            "keep_only_token_ids": config.get("keep_only_token_ids")}
  try:
    return ScoringMask(**values)
  except MultiVectorError as e:
    raise MultiVectorError(f"{file}: {e}") from None


def _read_transformer(module: str, files: modules_json.FolderFiles | None = None
                      ) -> tuple[str, int | None, int | None, Expansion | None]:
  """The Transformer module's settings file (sentence_bert_config.json in
  sentence-transformers 6), its query_length, document_length and query_expansion."""
  file = next((os.path.join(module, name) for name in TRANSFORMER_CONFIGS
               if os.path.exists(os.path.join(module, name))),
              os.path.join(module, TRANSFORMER_CONFIGS[0]))
  config = MultiVectorError.read(file, required=False, files=files) or {}
  task = config.get("transformer_task", "feature-extraction")
  if task != "feature-extraction":
    raise MultiVectorError(f"{file}: transformer_task={task!r}, expected 'feature-extraction' "
                           f"(the encoder's last hidden state)")
  if config.get("processing_kwargs"):
    raise MultiVectorError(f"{file}: processing_kwargs={config['processing_kwargs']!r}, "
                           f"expected none (they change how texts are tokenized)")
  expansion = config.get("query_expansion")
  try:
    for key in ("query_length", "document_length"):
      if config.get(key) is not None:
        _length(config[key], key)
    if expansion is not None:
      keys = ("strategy", "attend", "token", "length")
      if not isinstance(expansion, dict) or set(expansion) - set(keys):
        raise MultiVectorError(f"query_expansion={expansion!r}, expected an object of "
                               f"{', '.join(keys)}")
      expansion = Expansion(expansion.get("length"), expansion.get("strategy"),
                            expansion.get("attend", False), expansion.get("token"))
  except MultiVectorError as e:
    raise MultiVectorError(f"{file}: {e}") from None
  return file, config.get("query_length"), config.get("document_length"), expansion


def _read_settings(path: str, files: modules_json.FolderFiles | None = None
                   ) -> tuple[dict[str, str], str | None, str]:
  """config_sentence_transformers.json's prompts, default_prompt_name and similarity_fn_name
  (maxsim where it names neither maxsim nor meanmaxsim, as sentence-transformers reads it);
  refused unless it is a MultiVectorEncoder's."""
  file = os.path.join(path, "config_sentence_transformers.json")
  config = MultiVectorError.read(file, required=False, files=files) or {}
  kind = config.get("model_type")
  if kind == "ColBERT":
    raise MultiVectorError(f"{file}: model_type='ColBERT', a PyLate 3 save, which "
                           f"sentence-transformers converts on load; expected a "
                           f"MultiVectorEncoder's folder (load it there and save it again)")
  if kind != "MultiVectorEncoder":
    raise MultiVectorError(f"{file}: model_type={kind!r}, expected 'MultiVectorEncoder' "
                           f"(sentence-transformers converts other folders, adding a random "
                           f"projection where they have none)")
  legacy = [key for key in LEGACY_KEYS if key in config]
  if legacy:
    raise MultiVectorError(f"{file}: {', '.join(legacy)}: PyLate's settings, which "
                           f"sentence-transformers translates on load; expected them in the "
                           f"modules' files (load it there and save it again)")
  prompts, default = read_prompts(config, file, MultiVectorError, nulls=True)
  similarity = config.get("similarity_fn_name")
  return prompts, default, similarity if similarity in SIMILARITIES else "maxsim"


def _vocabulary(tokenizer: Tokenizer) -> dict[str, int]:
  """The tokenizer's tokens (added ones too) -> their ids, as transformers'
  convert_tokens_to_ids finds them."""
  from tokenizers import Tokenizer as HFTokenizer
  vocab = HFTokenizer.from_str(tokenizer.model.decode("utf-8")).get_vocab(with_added_tokens=True)
  return {token: i + tokenizer.offset for token, i in vocab.items()}


def _special_token(module: str, key: str, files: modules_json.FolderFiles | None = None
                  ) -> str | None:
  """The special token `key` (mask_token, eos_token) of the tokenizer in `module`, as
  transformers reads it: special_tokens_map.json's, else tokenizer_config.json's."""
  for name in ("special_tokens_map.json", "tokenizer_config.json"):
    file = os.path.join(module, name)
    value = (MultiVectorError.read(file, required=False, files=files) or {}).get(key)
    if isinstance(value, dict):
      value = value.get("content")
    if value is not None:
      if not isinstance(value, str):
        raise MultiVectorError(f"{file}: {key}={value!r}, expected a token")
      return value
  return None


def _expansion_id(expansion: Expansion, vocab: dict[str, int], module: str,
                  files: modules_json.FolderFiles | None = None) -> int:
  """The id of the expansion token: its `token`, else the tokenizer's mask token, else its
  eos token (sentence-transformers' order)."""
  if expansion.token is not None:
    if expansion.token not in vocab:
      raise MultiVectorError(f"{module}: query_expansion token={expansion.token!r} is not in "
                             f"the tokenizer's vocabulary")
    return vocab[expansion.token]
  for key in ("mask_token", "eos_token"):
    token = _special_token(module, key, files)
    if token is not None:
      if token not in vocab:
        raise MultiVectorError(f"{module}: the tokenizer's {key} {token!r} is not in its "
                               f"vocabulary (the query expansion token)")
      return vocab[token]
  raise MultiVectorError(f"{module}: the tokenizer names no mask_token or eos_token, expected "
                         f"one (the query expansion token), or query_expansion's token")


# ---------------------------------------------------------------------------------------------
# The encoder


class MultiVectorEncoder(SentenceEncoder):
  """A sentence-transformers 6 MultiVectorEncoder folder's texts -> token vectors (`load`):
  `encode_query` and `encode_document` return `MultiVectorEncoder(folder)`'s, a float32
  [t_i, dim] array per text; `similarity` scores them."""

  def __init__(self, model: MultiVectorModel, params: dict, tokenizer: Tokenizer,
               max_seq_length: int, prompts: dict[str, str] | None = None,
               default_prompt_name: str | None = None, similarity: str = "maxsim",
               skip_ids: Sequence[int] = (), expansion_id: int | None = None, **options):
    """`skip_ids`: the ids of the mask's skiplist_words; `expansion_id`: the query expansion
    token's (`load` finds both with the tokenizer). `options`: SentenceEncoder's (row_lengths,
    max_segments, template, tokenizer_file, devices). Rows hold the longest text of any side;
    `max_seq_length` is what a text without a task is cut to."""
    if model.expansion is not None and expansion_id is None:
      raise MultiVectorError("expansion_id=None, expected the query expansion token's id")
    self.lengths = model.cut_lengths(max_seq_length)
    longest = max([*self.lengths.values(), model.expansion.length if model.expansion else 0])
    super().__init__(model, params, tokenizer, longest, prompts, default_prompt_name,
                     similarity, **options)
    self.max_seq_length = max_seq_length
    self.longest = longest
    self.task_calls = {task: self._task_call(task, tuple(skip_ids), expansion_id)
                       for task in TASKS}
    self._call = self.task_calls[None]  # what _encode computes; `encode` sets its task's

  def _task_call(self, task: str | None, skip_ids: tuple[int, ...],
                 expansion_id: int | None) -> TaskCall:
    mask, expansion = self.model.mask, self.model.expansion
    # sentence-transformers' MultiVectorMask counts a text without a task as a document's
    skips = (task or "document") in mask.skiplist_tasks
    keep = mask.keep_only_token_ids if task != "query" and mask.keep_only_token_ids else None
    expands = task == "query" and expansion is not None
    return TaskCall(expansion_id if expands else None, expansion.attend if expands else True,
                    skip_ids if skips else (), keep)

  @classmethod
  def load(cls, path: str | os.PathLike, dtype="float32", attention_impl: str | None = None,
           **options) -> MultiVectorEncoder:
    """The MultiVectorEncoder folder `path` (as sentence-transformers 6 saves one), computed in
    `dtype` (vectors are float32 either way) by `attention_impl` (load_hf's default where
    None). `options`: row_lengths, max_segments, devices. Raises MultiVectorError in one line
    naming the file; refuses the folders sentence-transformers converts on load (PyLate's,
    Stanford ColBERT's, a SentenceTransformer's, a bare Hugging Face model)."""
    path, files = os.fspath(path), modules_json.FolderFiles()
    with _refusals():
      module = transformer_folder(path, files)
      if module is None:
        raise MultiVectorError(f"{path}: no modules.json, expected a MultiVectorEncoder's folder "
                               f"(sentence-transformers makes one of a Hugging Face model with "
                               f"a random projection)")
      modules = _read_modules(path, files)
      prompts, default, similarity = _read_settings(path, files)
      settings = {"dtype": dtype} | ({"attention_impl": attention_impl} if attention_impl else {})
      hf = read_hf(path, files=files, **settings)
      tokenizer = tokenizer_from_directory(path, files=files)
      config, params = hf.config, {"encoder": hf.variables["params"]}
      steps, mask, width = [], None, config.d_model
      for kind, folder in modules:
        if kind == "Dense":
          step, params[f"dense_{len(steps)}"] = read_dense(folder, width, "token_embeddings",
                                                           files)
          steps.append(step)
          width = step.out_features
        elif kind == "Normalize":
          steps.append(read_normalize(folder, "token_embeddings", files))
        else:
          mask = _read_mask(folder, files)
      file, query_length, document_length, expansion = _read_transformer(module, files)
      try:
        model = MultiVectorModel(config, tuple(steps), mask, query_length, document_length,
                                 expansion)
      except MultiVectorError as e:
        raise MultiVectorError(f"{file}: {e}") from None
      vocab = _vocabulary(tokenizer)
      # sentence-transformers drops a skiplist word that is no token of the vocabulary (it
      # would read as [UNK] and leave out every unknown token)
      skip_ids = sorted({vocab[w] for w in mask.skiplist_words if w in vocab})
      expansion_id = _expansion_id(expansion, vocab, module, files) if expansion else None
      tokenizer_file = os.path.join(module, "tokenizer.json")
      length = read_max_seq_length(module, config.max_len, files)
      return cls(model, params, tokenizer, length, prompts, default, similarity, skip_ids,
                 expansion_id, **options,
                 tokenizer_file=tokenizer_file if os.path.isfile(tokenizer_file) else module)

  @property
  def dim(self) -> int:
    return self.model.dim

  @staticmethod
  def module(model: MultiVectorModel) -> nn.Module:
    return TokenVectors(model)

  @staticmethod
  def _example_call(rows: jax.Array) -> tuple:
    return rows, rows, rows, None

  def apply(self, params: dict, tokens, segment_ids, positions, task: str | None = None
            ) -> tuple[jax.Array, jax.Array]:
    """`token_vectors` of this encoder's model for `task`: packed rows -> (float32
    [r, l, dim], bool [r, l] scored)."""
    return token_vectors(self.model, self.task_calls[self._task(task)], params, tokens,
                         segment_ids, positions)

  def encode_query(self, texts: Sequence[str] | str, prompt: str | None = None,
                   prompt_name: str | None = None, batch_tokens: int | None = None):
    """Each query's scored token vectors (`encode`), the folder's "query" prompt before it
    unless told another."""
    if prompt is None and prompt_name is None:
      prompt = self.prompts.get("query", "")
    return self.encode(texts, "query", prompt, prompt_name, batch_tokens)

  def encode_document(self, texts: Sequence[str] | str, prompt: str | None = None,
                      prompt_name: str | None = None, batch_tokens: int | None = None):
    """Each document's scored token vectors (`encode`), the folder's "document" prompt before
    it unless told another."""
    if prompt is None and prompt_name is None:
      prompt = self.prompts.get("document", "")
    return self.encode(texts, "document", prompt, prompt_name, batch_tokens)

  def __call__(self, texts: Sequence[str] | str, prompt: str | None = None,
               prompt_name: str | None = None, batch_tokens: int | None = None):
    """`encode` without a task (the default prompt, documents' scoring mask)."""
    return self.encode(texts, None, prompt, prompt_name, batch_tokens)

  def encode(self, texts: Sequence[str] | str, task: str | None = None,
             prompt: str | None = None, prompt_name: str | None = None,
             batch_tokens: int | None = None) -> list[np.ndarray] | np.ndarray:
    """A float32 [t_i, dim] array per text (a text alone: its array): the vectors of the
    tokens the scoring mask keeps, in order, the prompt (`prompt_text`) before the text, cut
    and expanded as `task` ("query", "document" or None) says. A call encodes `batch_tokens`
    ids on each device at most (default: `default_batch_tokens()`)."""
    if isinstance(texts, str):
      return self.encode([texts], task, prompt, prompt_name, batch_tokens)[0]
    with _refusals():
      task = self._task(task)
      texts = list(texts)
      for i, text in enumerate(texts):
        if not isinstance(text, str):
          raise MultiVectorError(f"texts[{i}]: a {type(text).__name__}, expected a str")
      batch_tokens = self._batch_tokens(batch_tokens, MultiVectorError)
      prompt = self.prompt_text(prompt, prompt_name)
      # the task's calls: its cut, its TaskCall (read by _encode); rows and shapes are shared
      side = copy.copy(self)
      side.max_seq_length, side._call = self.lengths[task], self.task_calls[task]
      out: list[np.ndarray] = [None] * len(texts)
      side._encode_chunks(texts, lambda chunk: self._expanded(side.tokenize(chunk, prompt), task),
                          batch_tokens, 0, out)
    return out

  def _task(self, task):
    if task not in TASKS:
      raise MultiVectorError(f"task={task!r}, expected one of {TASKS}")
    return task

  def _expanded(self, ids: list[np.ndarray], task: str | None) -> list[np.ndarray]:
    """A query's ids followed by EXPANDED up to the expansion's length (none past it)."""
    expansion = self.model.expansion
    if task != "query" or expansion is None:
      return ids
    return [np.concatenate([i, np.full(max(0, expansion.length - len(i)), EXPANDED, i.dtype)])
            for i in ids]

  def _encode(self, tokens, segment_ids, positions, pool_from, segments):
    """One call's rows -> (vectors, scored, segment ids), started on the devices."""
    vectors, scored = _jitted_token_vectors(self.model, self._call, self.params, tokens,
                                            segment_ids, positions)
    return vectors, scored, segment_ids

  def _collect(self, calls, out: list) -> None:
    """Each call's texts' scored vectors read back into `out`, by text."""
    for output, where, texts in calls:
      vectors, scored, segment_ids = (np.asarray(a) for a in output)
      for (row, segment), text in zip(where, texts):
        out[text] = vectors[row][scored[row] & (segment_ids[row] == segment + 1)]

  def save_modules(self, path: str) -> None:
    """Writes beside the Hugging Face model directory in `path` (this encoder's Transformer
    module) the files that make it this encoder's MultiVectorEncoder folder
    (`save_multi_vector`)."""
    prompts = {k: v for k, v in self.prompts.items() if v or k not in ("query", "document")}
    save_multi_vector(path, self.model, self.params, prompts, self.default_prompt_name,
                      self.similarity_fn_name, self.max_seq_length)

  # SentenceEncoder.__init__ sets `similarity` to the folder's similarity_fn_name; here it is
  # sentence-transformers' MultiVectorEncoder.similarity, and the name is `similarity_fn_name`
  # (as flax_encoder.sparse has it).
  @property
  def similarity(self):
    """similarity(queries, documents) -> float32 [len(queries), len(documents)]: `scores`."""
    return self.scores

  @similarity.setter
  def similarity(self, name: str) -> None:
    if name not in SIMILARITIES:
      raise MultiVectorError(f"similarity={name!r}, expected one of {SIMILARITIES}")
    self.similarity_fn_name = name

  def scores(self, queries, documents) -> np.ndarray:
    """float32 [len(queries), len(documents)]: the folder's similarity_fn_name (maxsim or
    meanmaxsim) of each query's token vectors (a list of [s_i, dim] arrays; one [s, dim]
    array: one query) against each document's. Computed in chunks of a few shapes
    (SCORE_ELEMENTS products at most, where a pair allows)."""
    with _refusals():
      queries, query_mask = pad_vectors(queries, "queries")
      documents, document_mask = pad_vectors(documents, "documents")
      self._check_widths(queries, documents)
    mean = self.similarity_fn_name == "meanmaxsim"
    q, s = len(queries), _bucket(queries.shape[1])
    n, t = len(documents), _bucket(documents.shape[1])
    queries, query_mask = _widen(queries, s), _widen(query_mask, s)
    documents, document_mask = _widen(documents, t), _widen(document_mask, t)
    per_query = max(1, min(_bucket(q), SCORE_ELEMENTS // (s * t)))
    per_query = 1 << (per_query.bit_length() - 1)
    per_document = max(1, min(_bucket(n), SCORE_ELEMENTS // (per_query * s * t)))
    per_document = 1 << (per_document.bit_length() - 1)
    out = np.zeros((q, n), np.float32)
    for i in range(0, q, per_query):
      chunk_q = [_rows(a[i:i + per_query], per_query) for a in (queries, query_mask)]
      for j in range(0, n, per_document):
        chunk_d = [_rows(a[j:j + per_document], per_document) for a in (documents, document_mask)]
        scores = _jitted_maxsim(*chunk_q, *chunk_d, mean=mean)
        out[i:i + per_query, j:j + per_document] = np.asarray(scores)[:min(per_query, q - i),
                                                                      :min(per_document, n - j)]
    return out

  def similarity_pairwise(self, queries, documents) -> np.ndarray:
    """float32 [n]: the folder's similarity of query i against document i."""
    with _refusals():
      queries, query_mask = pad_vectors(queries, "queries")
      documents, document_mask = pad_vectors(documents, "documents")
      if len(queries) != len(documents):
        raise MultiVectorError(f"{len(queries)} queries and {len(documents)} documents, "
                               f"expected as many of each (a pair each)")
      self._check_widths(queries, documents)
    s, t = _bucket(queries.shape[1]), _bucket(documents.shape[1])
    n = len(queries)
    rows = _bucket(n)
    arrays = [_rows(_widen(a, w), rows) for a, w in ((queries, s), (query_mask, s),
                                                       (documents, t), (document_mask, t))]
    scores = _jitted_maxsim_pairwise(*arrays, mean=self.similarity_fn_name == "meanmaxsim")
    return np.asarray(scores)[:n]

  @staticmethod
  def _check_widths(queries: np.ndarray, documents: np.ndarray) -> None:
    if len(queries) and len(documents) and queries.shape[2] != documents.shape[2]:
      raise MultiVectorError(f"query vectors of width {queries.shape[2]} and document vectors "
                             f"of width {documents.shape[2]}, expected one width")


def _widen(array: np.ndarray, width: int) -> np.ndarray:
  """`array` [n, w, …] zero-padded to [n, width, …]."""
  pad = [(0, 0), (0, width - array.shape[1])] + [(0, 0)] * (array.ndim - 2)
  return np.pad(array, pad)


def _rows(array: np.ndarray, rows: int) -> np.ndarray:
  """`array` zero-padded to `rows` rows (an empty query or document: nothing scored)."""
  return np.pad(array, [(0, rows - len(array))] + [(0, 0)] * (array.ndim - 1))


_jitted_token_vectors = jax.jit(token_vectors, static_argnames=("model", "call"))


# ---------------------------------------------------------------------------------------------
# Writing a folder

# The module types written: sentence-transformers 6's, the first with a MultiVectorEncoder.
_WRITTEN_TYPES = {"Transformer": TRANSFORMERS[2],
                  "Dense": "sentence_transformers.base.modules.dense.Dense",
                  "Normalize": "sentence_transformers.base.modules.normalize.Normalize",
                  "MultiVectorMask": MASK_MODULES[0]}


def save_multi_vector(path: str | os.PathLike, model: MultiVectorModel, params: dict,
                      prompts: dict[str, str] | None = None,
                      default_prompt_name: str | None = None, similarity: str = "maxsim",
                      max_seq_length: int | None = None) -> None:
  """Writes into `path`, beside a Hugging Face model directory of `model.config` (config.json,
  weights, tokenizer), the files that make sentence-transformers 6 load it as a
  MultiVectorEncoder of `model`: modules.json, the Transformer's sentence_bert_config.json
  (query_length, document_length, query_expansion; `max_seq_length`, the ids a text is cut to
  where a side sets none, where given), config_sentence_transformers.json (`prompts`, such as
  {"query": "[Q] ", "document": "[D] "}, the default prompt, `similarity`), a folder per Dense
  (its weights `params['dense_i']`, i its index in model.steps) and Normalize, and the
  MultiVectorMask's, before a last Normalize as sentence-transformers places it. What `load`
  reads back."""
  path = os.fspath(path)
  if similarity not in SIMILARITIES:
    raise MultiVectorError(f"similarity={similarity!r}, expected one of {SIMILARITIES}")
  prompts = checked_prompts(prompts, default_prompt_name, MultiVectorError)
  if max_seq_length is not None:
    _length(max_seq_length, "max_seq_length")
  if not os.path.isfile(os.path.join(path, "config.json")):
    raise MultiVectorError(f"{path}: no config.json, expected a Hugging Face model directory "
                           f"to write the modules beside")
  for i, step in enumerate(model.steps):
    if isinstance(step, Dense) and f"dense_{i}" not in params:
      raise MultiVectorError(f"params: no 'dense_{i}', expected the weights of model.steps[{i}]")

  write = modules_json.write_json
  steps = [type(step).__name__ for step in model.steps]
  at = len(steps) - 1 if steps and steps[-1] == "Normalize" else len(steps)
  kinds = ["Transformer"] + steps[:at] + ["MultiVectorMask"] + steps[at:]
  modules = []
  for i, kind in enumerate(kinds):
    folder = f"{i}_{kind}" if i else ""
    modules.append({"idx": i, "name": str(i), "path": folder, "type": _WRITTEN_TYPES[kind]})
    if not i:
      continue
    os.makedirs(os.path.join(path, folder), exist_ok=True)
    step = i - 1 - (i - 1 > at)  # its index in model.steps
    if kind == "MultiVectorMask":
      write(os.path.join(path, folder, "config.json"), model.mask.to_dict())
    elif kind == "Dense":
      _save_dense(os.path.join(path, folder), model.steps[step], params[f"dense_{step}"],
                  on="token_embeddings")
    else:
      write(os.path.join(path, folder, "config.json"),
            {"module_input_name": "token_embeddings", "module_output_name": "token_embeddings"})
  write(os.path.join(path, "modules.json"), modules)
  transformer = {"transformer_task": "feature-extraction",
                 "modality_config": {"text": {"method": "forward",
                                              "method_output_name": "last_hidden_state"}},
                 "module_output_name": "token_embeddings",
                 "query_length": model.query_length, "document_length": model.document_length,
                 "query_expansion": model.expansion.to_dict() if model.expansion else None}
  if max_seq_length is not None:
    transformer["max_seq_length"] = max_seq_length
  write(os.path.join(path, "sentence_bert_config.json"), transformer)
  write(os.path.join(path, "config_sentence_transformers.json"),
        {"model_type": "MultiVectorEncoder", "prompts": prompts,
         "default_prompt_name": default_prompt_name, "similarity_fn_name": similarity})
