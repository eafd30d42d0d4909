"""Rerankers: a sentence-transformers CrossEncoder folder's pairs -> scores, in JAX, many pairs to
a row.

    reranker = Reranker.load("ms-marco-MiniLM-L6-v2")
    scores = reranker.predict([("How many people live in Berlin?", "Berlin had 3.5 million."),
                               ("How many people live in Berlin?", "Berlin has museums.")])
    reranker.rank("How many people live in Berlin?", documents, top_k=3)  # [(index, score) …]

The scores are `CrossEncoder(folder).predict(pairs)`'s: float32 [n] for a model of one label,
[n, num_labels] otherwise. A folder is what sentence-transformers 6 saves (modules.json with
the Transformer alone, its transformer_task "sequence-classification", model_type
"CrossEncoder" and activation_fn in config_sentence_transformers.json), or a Hugging Face
*ForSequenceClassification directory as rerankers were published before (ms-marco-MiniLM-L6-v2,
bge-reranker-base), its activation in config.json's sentence_transformers entry where
sentence-transformers 3 to 5 saved one. Where none says, one label is scored through a sigmoid
and several are left as logits, as CrossEncoder defaults.

A pair is laid out as its tokenizer lays out two texts ([CLS] q [SEP] d [SEP], RoBERTa's
<s> q </s></s> d </s>), a prompt (config_sentence_transformers.json's) before the query, and
cut to max_length ids as transformers cuts it with truncation="longest_first"
(`flax_encoder.tokenizer.kept`). Its token types are those transformers' tokenizer gives the
model (`gives_token_types`). Each pair is a segment of a packed row
(`flax_encoder.embeddings.SentenceEncoder`'s packing and calls), scored by the family's
*ForSequenceClassification head on its own segment (`flax_encoder.classifier.SequenceClassifier`):
a pair's score is the one it has alone.

In a jitted function of one's own, `score` (or `reranker.apply`) maps packed rows to scores:

    ids, second_starts = reranker.encode_pairs(pairs)
    rows = reranker.pack(ids, second_starts=second_starts)  # int32 [rows, max_length] each
    out = jax.jit(reranker.apply)(reranker.params, rows.tokens, rows.segment_ids,
                                  token_types=rows.token_types)
    scores = out[rows.where[:, 0], rows.where[:, 1]]  # out: [rows, segments, num_labels]

`save_cross_encoder_modules` writes, beside a *ForSequenceClassification directory, the files
that make sentence-transformers load it as a CrossEncoder of a given activation and max length.

Shapes: r = rows, s = ids of a row, k = segments of a row, l = labels.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder import activations, families, modules_json, quantized
from flax_encoder.classifier import SequenceClassifier
from flax_encoder.config import EncoderConfig
from flax_encoder.embeddings import (EmbeddingError,
                                     SentenceEncoder, read_max_seq_length, read_settings,
                                     segments_per_row, torch_activation)
from flax_encoder.families import HFError
from flax_encoder.families.family import Fields
from flax_encoder.families.tensors import to_numpy
from flax_encoder.hf_tokenizer import TokenizerError, tokenizer_from_directory
from flax_encoder.modules_json import TRANSFORMER_CONFIGS, TRANSFORMERS, ModulesError
from flax_encoder.tokenizer import Template, Tokenizer, TokenizerFailure, encode_pairs

# CrossEncoder's activation_fn (a torch.nn class, by its last name) -> the function on the
# logits [..., l]. torch's Softmax() with no dim takes the last of a 2-d input: the labels.
# activation_fn: the torch.nn classes (by their last name) it may be.
ACTIVATIONS = tuple(activations.TORCH)
TASK = "sequence-classification"  # sentence_bert_config.json's transformer_task of a reranker
MODEL_TYPE = "CrossEncoder"  # config_sentence_transformers.json's model_type of one
LOGIT_SCORE = "sentence_transformers.cross_encoder.modules.logit_score.LogitScore"
# sentence_bert_config.json's entries that change what sentence-transformers computes and
# that Reranker does not read: per-call processor options, the tokenizer's and config's
# arguments (num_labels, model_max_length …).
UNREAD_SETTINGS = ("processing_kwargs", "processor_kwargs", "tokenizer_args", "config_kwargs",
                   "config_args")


class RerankerError(EmbeddingError):
  """A CrossEncoder folder, or an argument, that Reranker cannot take."""


@dataclasses.dataclass(frozen=True)
class RerankerModel:
  """What a reranker computes, apart from its weights: the encoder's config, its
  *ForSequenceClassification head (labels, pooling), the id after whose first occurrence in a
  pair tokens are of type 1 (None: all of type 0) and the activation on the logits."""
  config: EncoderConfig
  num_labels: int
  pooling: str
  type_separator: int | None
  activation: str
  quantize: str | None = None  # the dense layers' products in int8 (flax_encoder.quantized)

  def classifier(self, segments: int) -> nn.Module:
    return quantized.quantized(SequenceClassifier(
        self.config, self.num_labels, self.pooling, self.type_separator, max_segments=segments),
        self.quantize)


def score(model: RerankerModel, params: dict, tokens: jax.Array, segment_ids: jax.Array,
          segments: int | None = None, activation: bool = True,
          token_types: jax.Array | None = None) -> jax.Array:
  """Packed rows of pairs -> each pair's scores, a pure function to jit.

  Args:
    model, params: a reranker's, as `Reranker` holds them (`.model`, `.params`).
    tokens: int [r, s], each segment a pair's ids ([CLS] q [SEP] d [SEP]) then padding.
    segment_ids: int [r, s], 1 … `segments` for the pairs of a row, 0 at padding.
    segments: the segments of a row (default `segments_per_row(s)`, as `Reranker.pack`).
    activation: apply the model's activation to the logits (CrossEncoder.predict's scores);
      False: the logits.
    token_types: int [r, s], 1 from each pair's second text on (`PackedRows.token_types`);
      None: from the first separator of each pair (wrong where a query spells it).

  Returns:
    float32 [r, segments, l]: segment j + 1 of row i at [i, j]; where a row has no segment
    j + 1, scores of no pair.
  """
  segments = segments or segments_per_row(tokens.shape[1])
  if model.type_separator is None:  # the model sees type 0 only
    token_types = None
  logits = model.classifier(segments).apply({"params": params}, tokens, segment_ids,
                                            token_types=token_types)
  return activations.torch_class(model.activation)(logits) if activation else logits


def gives_token_types(module: str, hf: dict, files: modules_json.FolderFiles | None = None
                     ) -> bool | None:
  """Whether transformers' tokenizer of the model directory `module` (config.json `hf`) gives
  the model token_type_ids: tokenizer_config.json's model_input_names, else those of its
  tokenizer_class (else config.json's, else the model_type's, `families.tokenizer_class`);
  None for a class no family knows (`families.TOKEN_TYPE_CLASSES`)."""
  file = os.path.join(module, "tokenizer_config.json")
  config = RerankerError.read(file, required=False, files=files) or {}
  names = config.get("model_input_names")
  if names is not None:
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
      raise RerankerError(f"{file}: model_input_names={names!r}, expected a list of names")
    return "token_type_ids" in names
  name = (config.get("tokenizer_class") or hf.get("tokenizer_class")
          or families.tokenizer_class(hf.get("model_type")))
  if not isinstance(name, str):
    return None
  return families.TOKEN_TYPE_CLASSES.get(name.removesuffix("Fast"))


# ---------------------------------------------------------------------------------------------
# Reading a folder


def read_modules(path: str, files: modules_json.FolderFiles | None = None) -> str:
  """The Transformer module's folder of the CrossEncoder folder `path` (sentence-transformers
  6: modules.json), checked to hold the Transformer alone, a sequence classifier, in a folder
  saved as a CrossEncoder. Its files are read through a load's `files`, where given."""
  file = os.path.join(path, "modules.json")
  try:
    modules = modules_json.read_modules(path, files)
    module = modules_json.transformer_folder(path, files)
  except ModulesError as e:
    raise RerankerError(str(e)) from None
  if len(modules) > 1:
    kind = modules[1].get("type")
    what = (" (a causal LM's 'yes' against 'no' logits, which Reranker does not compute)"
            if kind == LOGIT_SCORE else "")
    raise RerankerError(f"{file}: module 1 is of type {kind!r}{what}; expected the "
                        f"Transformer alone (a *ForSequenceClassification model's logits)")
  settings = os.path.join(path, "config_sentence_transformers.json")
  # sentence-transformers reads a folder without a model_type as a SentenceTransformer, and
  # CrossEncoder makes a classifier of its Transformer with a head drawn at random
  model_type = (RerankerError.read(settings, required=False, files=files) or {}).get(
      "model_type", "SentenceTransformer")
  if model_type != MODEL_TYPE:
    raise RerankerError(f"{settings}: model_type={model_type!r}, expected {MODEL_TYPE!r} (a "
                        f"SentenceTransformer folder is flax_encoder.embeddings.SentenceEncoder's)")
  for name in TRANSFORMER_CONFIGS:
    file = os.path.join(module, name)
    config = RerankerError.read(file, required=False, files=files)
    if config is None:
      continue
    task = config.get("transformer_task", "feature-extraction")
    if task != TASK:
      raise RerankerError(f"{file}: transformer_task={task!r}, expected {TASK!r} (a "
                          f"*ForSequenceClassification model's logits)")
    unread = next((key for key in UNREAD_SETTINGS if config.get(key)), None)
    if unread:
      raise RerankerError(f"{file}: {unread}={config[unread]!r}, which Reranker does not "
                          f"read; expected none")
    return module
  raise RerankerError(f"{module}: no {TRANSFORMER_CONFIGS[0]}, expected one whose "
                      f"transformer_task is {TASK!r}")


def check_classifier(hf: dict, file: str) -> None:
  """RerankerError where config.json (`hf`, of `file`) is not of a *ForSequenceClassification
  model: CrossEncoder scores a causal LM by LogitScore, and gives any other model a
  classifier drawn at random."""
  architecture = (hf.get("architectures") or [None])[0]
  if not (isinstance(architecture, str) and architecture.endswith("ForSequenceClassification")):
    raise RerankerError(f"{file}: architectures={hf.get('architectures')!r}, expected a "
                        f"*ForSequenceClassification model")


def read_num_labels(hf: dict, file: str) -> int:
  """config.json's labels, as transformers counts them: id2label's, else num_labels, else 2."""
  labels = hf.get("id2label")
  if labels is not None:
    if not isinstance(labels, dict) or not labels:
      raise RerankerError(f"{file}: id2label={labels!r}, expected an object of labels")
    return len(labels)
  try:
    return Fields(hf, file).integer("num_labels", 2)
  except HFError as e:
    raise RerankerError(str(e)) from None


def read_activation(hf: dict, hf_file: str, settings: dict, settings_file: str,
                    num_labels: int) -> str:
  """The activation CrossEncoder applies to the logits: config_sentence_transformers.json's
  activation_fn (sentence-transformers 6), else config.json's sentence_transformers
  activation_fn (3 to 5) or sbert_ce_default_activation_function (before), else Sigmoid for
  one label and Identity for several."""
  hf_saved = hf.get("sentence_transformers", {})
  if not isinstance(hf_saved, dict):
    raise RerankerError(f"{hf_file}: sentence_transformers={hf_saved!r}, expected an object")
  if settings.get("activation_fn") is not None:
    file, key, value = settings_file, "activation_fn", settings["activation_fn"]
  elif "activation_fn" in hf_saved:
    file, key, value = hf_file, "sentence_transformers.activation_fn", hf_saved["activation_fn"]
  else:
    key = "sbert_ce_default_activation_function"
    file, value = hf_file, hf.get(key)
  if value is None:
    return "Sigmoid" if num_labels == 1 else "Identity"
  name = value.rsplit(".", 1)[-1] if isinstance(value, str) else None
  # sentence-transformers runs a class outside torch only with trust_remote_code
  if not (isinstance(value, str) and value.startswith("torch.") and name in ACTIVATIONS):
    raise RerankerError(f"{file}: {key}={value!r}, expected one of torch.nn's "
                        f"{', '.join(ACTIVATIONS)}")
  return name


def read_type_separator(module: str, hf: dict, config: EncoderConfig, template: Template,
                        tokenizer_file: str, files: modules_json.FolderFiles | None = None
                        ) -> int | None:
  """The id after whose first occurrence in a pair tokens are of type 1, as transformers'
  tokenizer types them ([CLS] q [SEP] of 0, d [SEP] of 1); None where the model sees types of
  0 only (it has one type, or its tokenizer gives none, or gives the second text type 0)."""
  if config.type_vocab_size <= 1:
    return None
  gives = gives_token_types(module, hf, files)
  if gives is None:
    file = os.path.join(module, "tokenizer_config.json")
    raise RerankerError(f"{file}: a tokenizer_class whose token types Reranker does not know, "
                        f"expected one of {sorted(families.TOKEN_TYPE_CLASSES)} (or "
                        f"model_input_names)")
  if not gives or template.second_type == 0:
    return None
  if template.second_type != 1 or len(template.between) != 1 or (
      template.between[0] in template.start):
    raise RerankerError(f"{tokenizer_file}: a pair template of {template}, expected one id "
                        f"between the texts ([SEP]), typed 0 before it and 1 after it")
  return template.between[0]


def read_classifier(directory: families.HFDirectory, state: dict, config: EncoderConfig,
                    variables: dict) -> tuple[int, str, dict]:
  """(labels, pooling, the head's parameters) of the *ForSequenceClassification `directory`
  (`families.open_hf`'s) whose weights `state` read as `config` and `variables` (load_hf's):
  its head pooled as its family's classifier pools."""
  check_classifier(directory.hf, directory.config_file)
  num_labels = read_num_labels(directory.hf, directory.config_file)
  family = families.of_config(directory.hf)
  pooling = family.pooling(directory.hf)
  classifier = SequenceClassifier(config, num_labels, pooling, max_segments=1)
  expected = nn.unbox(jax.eval_shape(lambda: classifier.init(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))["params"])
  return num_labels, pooling, read_head(family, state, expected, variables, directory.module)


def read_head(family, state: dict, expected: dict, variables: dict, where: str) -> dict:
  """The *ForSequenceClassification head's parameters of the state dict `state`: the dense
  layers the family's classifier names, and ModernBERT's prediction head, each checked against
  the `expected` shapes (the SequenceClassifier's, boxes unboxed)."""
  params = {}
  if "head" in expected:  # ModernBERT's prediction head, which load_hf reads
    head = variables.get("heads", {}).get("prediction_head")
    if head is None:
      raise RerankerError(f"{where}: no prediction head ('head.dense'), expected "
                          f"{family.stem}ForSequenceClassification's")
    params["head"] = head
  for name, path in family.classifier.denses:
    want = expected
    for part in path:
      want = want[part]
    dense = {}
    for part, key in (("kernel", name + ".weight"), ("bias", name + ".bias")):
      if part not in want:
        if key in state:
          raise RerankerError(f"{where}: the weights hold {key!r}, which "
                              f"{family.stem}ForSequenceClassification has not")
        continue
      if key not in state:
        raise RerankerError(f"{where}: the weights have no {key!r}, expected "
                            f"{family.stem}ForSequenceClassification's head")
      value = to_numpy(key, state[key])
      shape = tuple(want[part].shape)[::-1]  # torch's [out, in]; a bias's alike
      if value.shape != shape:
        raise RerankerError(f"{where}: {key!r} has shape {value.shape}, expected {shape} (of "
                            f"config.json's hidden size and labels)")
      dense[part] = (value.T if part == "kernel" else value).astype(want[part].dtype)
    node = params
    for part in path[:-1]:
      node = node.setdefault(part, {})
    node[path[-1]] = dense
  return params


# ---------------------------------------------------------------------------------------------
# The reranker


class Reranker(SentenceEncoder):
  """A CrossEncoder folder's pairs -> scores function (`load`): `predict(pairs)` returns
  `CrossEncoder(folder).predict(pairs)`'s, `rank(query, documents)` its `rank`'s."""

  def __init__(self, model: RerankerModel, params: dict, tokenizer: Tokenizer,
               max_seq_length: int, prompts: dict[str, str] | None = None,
               default_prompt_name: str | None = None, **options):
    """`options`: SentenceEncoder's (row_lengths, max_segments, template, tokenizer_file,
    devices)."""
    try:
      super().__init__(model, params, tokenizer, max_seq_length, prompts, default_prompt_name,
                       **options)
    except EmbeddingError as e:
      raise RerankerError(str(e)) from None
    specials = len(self.template.start) + len(self.template.between) + len(self.template.end)
    if max_seq_length < specials:
      raise RerankerError(f"max_seq_length={max_seq_length}: fewer than the {specials} special "
                          f"ids around a pair")

  @classmethod
  def load(cls, path: str | os.PathLike, dtype="float32", attention_impl: str | None = None,
           **options) -> Reranker:
    """The CrossEncoder folder `path` (sentence-transformers 6's, or a Hugging Face
    *ForSequenceClassification directory), computed in `dtype` (scores are float32 either way)
    by `attention_impl` (load_hf's default where None). `options`: row_lengths, max_segments,
    devices (SentenceEncoder's). Raises RerankerError in one line naming the file."""
    path, files = os.fspath(path), modules_json.FolderFiles()
    st_folder = os.path.lexists(os.path.join(path, "modules.json"))
    if not st_folder and not os.path.isfile(os.path.join(path, "config.json")):
      raise RerankerError(f"{path}: neither modules.json nor config.json, expected a "
                          f"CrossEncoder folder or a Hugging Face *ForSequenceClassification "
                          f"directory")
    module = read_modules(path, files) if st_folder else path
    hf_file = os.path.join(module, "config.json")
    settings = {"dtype": dtype} | ({"attention_impl": attention_impl} if attention_impl else {})
    hf = RerankerError.read(hf_file, required=False, files=files)
    if hf is not None:  # else open_hf says what is wrong
      check_classifier(hf, hf_file)
    try:
      directory = families.open_hf(module, hf, files)
      state = families.read_hf_weights(directory)
      config, variables = families.read_hf(directory, state, **settings)[1:]
      tokenizer = tokenizer_from_directory(path, files=files)
    except (HFError, TokenizerError) as e:
      raise RerankerError(str(e)) from None
    hf = directory.hf
    num_labels, pooling, head = read_classifier(directory, state, config, variables)
    settings_file = os.path.join(path, "config_sentence_transformers.json")
    st_settings = ((RerankerError.read(settings_file, required=False, files=files) or {})
                   if st_folder else {})
    activation = read_activation(hf, hf_file, st_settings, settings_file, num_labels)
    tokenizer_file = os.path.join(module, "tokenizer.json")
    tokenizer_file = tokenizer_file if os.path.isfile(tokenizer_file) else module
    try:
      template = tokenizer.template() or Template()
    except (TokenizerFailure, ValueError) as e:
      raise RerankerError(f"{tokenizer_file}: {e}") from None
    model = RerankerModel(config, num_labels, pooling,
                          read_type_separator(module, hf, config, template, tokenizer_file,
                                              files),
                          activation)
    params = {"encoder": variables["params"], **head}
    try:
      prompts, default, _ = read_settings(path, files) if st_folder else ({}, None, None)
      max_length = read_max_seq_length(module, config.max_len, files)
    except EmbeddingError as e:
      raise RerankerError(str(e)) from None
    return cls(model, params, tokenizer, max_length, prompts, default, template=template,
               tokenizer_file=tokenizer_file, **options)

  @property
  def num_labels(self) -> int:
    return self.model.num_labels

  @property
  def dim(self) -> int:
    return self.model.num_labels

  @staticmethod
  def module(model: RerankerModel) -> nn.Module:
    return dataclasses.replace(model, quantize=None).classifier(1)

  @staticmethod
  def _example_call(rows: jax.Array) -> tuple:
    return rows, rows

  def apply(self, params: dict, tokens, segment_ids, segments: int | None = None,
            activation: bool = True, token_types=None) -> jax.Array:
    """`score` with this reranker's model: packed rows -> float32 [r, segments, l]."""
    return score(self.model, params, tokens, segment_ids, segments, activation, token_types)

  def tokenize(self, pairs: Sequence[tuple[str, str]], prompt: str = "") -> list[np.ndarray]:
    """Each pair's ids (`encode_pairs`)."""
    return self.encode_pairs(pairs, prompt)[0]

  def encode_pairs(self, pairs: Sequence[tuple[str, str]], prompt: str = ""
                   ) -> tuple[list[np.ndarray], list[int]]:
    """Each pair's ids, the prompt before its query, laid out by the tokenizer's pair template
    ([CLS] q [SEP] d [SEP]) and cut to max_seq_length as transformers cuts them
    (`flax_encoder.tokenizer.kept`); and where each one's document starts (its token types,
    as the tokenizer gives them, whatever special tokens the query spells)."""
    queries = [prompt + q for q, _ in pairs]
    documents = [d for _, d in pairs]
    laid = self._tokenizers(lambda: encode_pairs(self.tokenizer, queries, documents,
                                                 self.max_seq_length, 0, self.template))
    ids = [i for i, _ in laid]
    vocab = self.model.config.vocab_size
    if ids and max(int(i.max(initial=0)) for i in ids) >= vocab:
      raise RerankerError(f"the tokenizer gives ids past the model's vocabulary "
                          f"(vocab_size={vocab}): not this model's tokenizer")
    return ids, [start for _, start in laid]

  def pack(self, ids: Sequence[np.ndarray], length: int | None = None,
           second_starts: Sequence[int] | None = None):
    """Pairs' ids (`tokenize`) packed into rows of `length` ids (default max_seq_length),
    first-fit, for `score`, with their token types where `second_starts` (`encode_pairs`)
    are given: a PackedRows."""
    try:
      return super().pack(ids, length, second_starts)
    except EmbeddingError as e:
      raise RerankerError(str(e)) from None

  def _tokenizers(self, run):
    try:
      return super()._tokenizers(run)
    except EmbeddingError as e:  # a panic inside `tokenizers`, naming the tokenizer's file
      raise RerankerError(str(e)) from None

  def predict(self, pairs: Sequence[tuple[str, str]], apply_activation: bool = True,
              batch_tokens: int | None = None, prompt: str | None = None,
              prompt_name: str | None = None) -> np.ndarray:
    """float32 [len(pairs)] (one label) or [len(pairs), num_labels]: each (query, document)
    pair's score, the model's activation applied to its logits (`apply_activation`), the
    prompt (`prompt_text`) before its query. A call scores `batch_tokens` ids on each device
    at most (default: `default_batch_tokens()`), in rows of `row_lengths`."""
    pairs = _checked_pairs(pairs)
    batch_tokens = self._batch_tokens(batch_tokens, RerankerError)
    try:
      prompt = self.prompt_text(prompt, prompt_name)
    except EmbeddingError as e:
      raise RerankerError(str(e)) from None
    out = np.zeros((len(pairs), self.num_labels), np.float32)
    self._encode_chunks(pairs, lambda chunk: self.encode_pairs(chunk, prompt), batch_tokens, 0,
                        out)
    if apply_activation:
      out = np.asarray(activations.torch_class(self.model.activation)(out), np.float32)
    return out[:, 0] if self.num_labels == 1 else out

  __call__ = predict

  def rank(self, query: str, documents: Sequence[str], top_k: int | None = None,
           apply_activation: bool = True, batch_tokens: int | None = None,
           prompt: str | None = None, prompt_name: str | None = None) -> list[tuple[int, float]]:
    """(index, score) of each document for `query`, the highest score first (documents of
    equal scores in their order), the first `top_k` of them: CrossEncoder.rank's corpus_id and
    score. A model of one label only."""
    if self.num_labels != 1:
      raise RerankerError(f"rank: the model has {self.num_labels} labels, expected 1 (predict "
                          f"scores pairs of a model of several)")
    if not isinstance(query, str):
      raise RerankerError(f"query: a {type(query).__name__}, expected a str")
    if isinstance(documents, str) or not isinstance(documents, Sequence):
      raise RerankerError(f"documents: a {type(documents).__name__}, expected a list of str")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                              or top_k < 0):
      raise RerankerError(f"top_k={top_k!r}, expected an integer >= 0 or None")
    scores = self.predict([(query, d) for d in documents], apply_activation, batch_tokens,
                          prompt, prompt_name)
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    return [(i, float(scores[i])) for i in order[:top_k]]

  def _encode(self, tokens: jax.Array, segment_ids: jax.Array, positions: jax.Array,
              pool_from: int, segments: int, token_types: jax.Array | None = None
              ) -> jax.Array:
    """One call's packed rows -> their logits [r, segments, l], started on the devices: `score`,
    jitted (the positions, each pair's from its first id, are those it derives)."""
    return _jitted_score(self.model, self.params, tokens, segment_ids, segments, False,
                         token_types)


def _checked_pairs(pairs) -> list[tuple[str, str]]:
  if isinstance(pairs, str) or not isinstance(pairs, Sequence):
    raise RerankerError(f"pairs: a {type(pairs).__name__}, expected a list of (query, "
                        f"document) pairs")
  out = []
  for i, pair in enumerate(pairs):
    if isinstance(pair, str) or not isinstance(pair, Sequence) or len(pair) != 2 or not all(
        isinstance(t, str) for t in pair):
      raise RerankerError(f"pairs[{i}]: {str(pair)[:60]!r}, expected a (query, document) pair "
                          f"of str (one pair: [(query, document)])")
    out.append((pair[0], pair[1]))
  return out


# One jit for every reranker: two of the same model (`RerankerModel` is hashable) share compiles.
_jitted_score = jax.jit(score, static_argnames=("model", "segments", "activation"))


# ---------------------------------------------------------------------------------------------
# Writing a folder

# The Transformer's type written: the name before sentence-transformers 6, which every 6.x
# reads (a CrossEncoder's modules.json is read by 6 only: 3 to 5 load the directory as it is).
_TRANSFORMER_TYPE = TRANSFORMERS[0]


def save_cross_encoder_modules(path: str | os.PathLike, max_length: int,
                               activation: str = "Sigmoid") -> None:
  """Writes into `path`, beside a Hugging Face *ForSequenceClassification directory (its
  config.json, weights and tokenizer), the files that make sentence-transformers load it as a
  CrossEncoder scoring pairs cut to `max_length` ids through `activation` (a torch.nn
  activation's name: ACTIVATIONS), as CrossEncoder.save (6) writes them: modules.json (the
  Transformer alone), sentence_bert_config.json (transformer_task, max_seq_length) and
  config_sentence_transformers.json (model_type, activation_fn). Where sentence-transformers 3
  to 5 read the same (they load the directory as it is), it sets them too: config.json's
  sentence_transformers activation_fn, and tokenizer_config.json's model_max_length where the
  directory has that file."""
  path = os.fspath(path)
  if activation not in ACTIVATIONS:
    raise RerankerError(f"activation={activation!r}, expected one of {ACTIVATIONS}")
  if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 3:
    raise RerankerError(f"max_length={max_length!r}, expected an integer >= 3")
  try:
    hf = families.read_hf_config(path)
  except HFError as e:
    raise RerankerError(str(e)) from None
  check_classifier(hf, os.path.join(path, "config.json"))
  torch_name = torch_activation(activation)

  def write(name: str, value) -> None:
    modules_json.write_json(os.path.join(path, name), value)

  write("modules.json", [{"idx": 0, "name": "0", "path": "", "type": _TRANSFORMER_TYPE}])
  write("sentence_bert_config.json", {
      "transformer_task": TASK, "max_seq_length": max_length,
      "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
      "module_output_name": "scores"})
  write("config_sentence_transformers.json", {
      "model_type": MODEL_TYPE, "activation_fn": torch_name, "prompts": {},
      "default_prompt_name": None})
  saved = hf.get("sentence_transformers")
  hf["sentence_transformers"] = {**(saved if isinstance(saved, dict) else {}),
                                 "activation_fn": torch_name}
  write("config.json", hf)
  tokenizer_config = RerankerError.read(os.path.join(path, "tokenizer_config.json"),
                                        required=False)
  if tokenizer_config is not None:
    write("tokenizer_config.json", {**tokenizer_config, "model_max_length": max_length})
