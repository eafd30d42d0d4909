"""Hugging Face BERT-family and ModernBERT directories in and out: `config.json` + weights <->
(EncoderConfig, flax variables).

    config, variables = load_hf("bert-dir")              # bert, roberta, distilbert, modernbert …
    hidden = Encoder(config).apply(variables, input_ids)  # transformers' last_hidden_state
    variables["heads"]["masked_lm"], variables["heads"]["pooler"]   # where the checkpoint has them

The BERT families share one encoder (post-LN, learned positions, a LayerNorm on the
embeddings, no final LayerNorm) and differ in names, token types and positions:

  bert        bert, electra (discriminator, embedding_size = hidden_size)
  roberta     roberta, xlm-roberta, camembert: positions start after the padding id
  distilbert  distilbert: other names, no token types, no pooler
  modernbert  modernbert: Pre-LN, rotary, GeGLU, local attention (`_modernbert`); q, k and v
              in one matrix, and a prediction head its masked-LM head and classifiers share

`to_hf_state_dict` and `hf_config` go the other way, for `save_pretrained`-style directories
(train.export --layout hf). A `model_type` or an option these do not compute the way
transformers does is refused, naming it: never a silently different model.

Reading checks what a directory holds before building anything from it: each config.json
field it reads is of the kind transformers' config class takes, with transformers' default
where it is absent (else an HFError naming the field and the file); each tensor has the shape
config.json gives it; a shard index names files of the directory only; and weights of the
encoder that config.json does not name (a layer past num_hidden_layers) are left out with a
warning.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import flax.linen as nn
import numpy as np

from flax_encoder.config import EncoderConfig
from flax_encoder.encoder import stack_layers, unstack_layers
from flax_encoder.pytorch.convert import INDEX_BUFFERS, _to_numpy, load_torch_checkpoint

# model_type -> family
FAMILIES = {"bert": "bert", "electra": "bert", "roberta": "roberta",
            "xlm-roberta": "roberta", "camembert": "roberta", "distilbert": "distilbert",
            "modernbert": "modernbert"}
# The families hf_config and to_hf_state_dict write.
_EXPORTED = ("bert", "roberta", "distilbert", "modernbert")
# transformers' hidden_act -> EncoderConfig.activation
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "relu": "relu"}
# The weights files a directory may hold, in the order transformers prefers them.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


class HFError(ValueError):
  """A directory, or an option in its config.json, that load_hf cannot take."""


def _bert_layer(i: int) -> dict:
  at = f"encoder.layer.{i}."
  return {("self_attn", "w_q"): at + "attention.self.query",
          ("self_attn", "w_k"): at + "attention.self.key",
          ("self_attn", "w_v"): at + "attention.self.value",
          ("self_attn", "w_o"): at + "attention.output.dense",
          ("norm1",): at + "attention.output.LayerNorm",
          ("feed_forward", "w_1"): at + "intermediate.dense",
          ("feed_forward", "w_2"): at + "output.dense",
          ("norm2",): at + "output.LayerNorm"}


def _distilbert_layer(i: int) -> dict:
  at = f"transformer.layer.{i}."
  return {("self_attn", "w_q"): at + "attention.q_lin",
          ("self_attn", "w_k"): at + "attention.k_lin",
          ("self_attn", "w_v"): at + "attention.v_lin",
          ("self_attn", "w_o"): at + "attention.out_lin",
          ("norm1",): at + "sa_layer_norm",
          ("feed_forward", "w_1"): at + "ffn.lin1",
          ("feed_forward", "w_2"): at + "ffn.lin2",
          ("norm2",): at + "output_layer_norm"}


def _modernbert_layer(i: int) -> dict:
  at = f"layers.{i}."  # and attn.Wqkv: w_q, w_k, w_v stacked (`_QKV`)
  names = {("self_attn", "w_o"): at + "attn.Wo", ("norm2",): at + "mlp_norm",
           ("feed_forward", "w_1"): at + "mlp.Wi", ("feed_forward", "w_2"): at + "mlp.Wo"}
  return {("norm1",): at + "attn_norm", **names} if i else names  # layer 0 has no attn_norm


_QKV = "attn.Wqkv"
_MODERNBERT = {("embedding",): "embeddings.tok_embeddings", ("embedding_norm",): "embeddings.norm",
               ("norm",): "final_norm"}
_EMBEDDINGS = {("embedding",): "embeddings.word_embeddings",
               ("position_embedding",): "embeddings.position_embeddings",
               ("token_type_embedding",): "embeddings.token_type_embeddings",
               ("embedding_norm",): "embeddings.LayerNorm"}
# Heads (flax path under variables["heads"] -> module name at the top of the state dict).
_MASKED_LM = {
    "bert": {("dense",): "cls.predictions.transform.dense",
             ("norm",): "cls.predictions.transform.LayerNorm", ("bias",): "cls.predictions.bias"},
    "roberta": {("dense",): "lm_head.dense", ("norm",): "lm_head.layer_norm",
                ("bias",): "lm_head.bias"},
    "distilbert": {("dense",): "vocab_transform", ("norm",): "vocab_layer_norm",
                   ("bias",): "vocab_projector.bias"},
    "modernbert": {("dense",): "head.dense", ("norm",): "head.norm", ("bias",): "decoder.bias"},
}
_DECODER = {"bert": "cls.predictions.decoder", "roberta": "lm_head.decoder",
            "distilbert": "vocab_projector", "modernbert": "decoder"}
_POOLER = {("dense",): "pooler.dense"}
# ModernBERT's prediction head ("prediction_head" under variables["heads"]): the masked-LM
# head's dense and norm, which its *ForSequenceClassification and *ForTokenClassification read
# by the same names.
_PREDICTION_HEAD = {("dense",): "head.dense", ("norm",): "head.norm"}


def _names(family: str, config: EncoderConfig) -> Iterator[tuple[tuple, str]]:
  """(flax path under params, module name within the encoder) for each of the encoder's
  modules (ModernBERT's stacked q, k, v apart: `_QKV`)."""
  if family == "modernbert":
    yield from _MODERNBERT.items()
  for path, name in _EMBEDDINGS.items() if family != "modernbert" else ():
    if path == ("token_type_embedding",) and not config.type_vocab_size:
      continue
    yield path, name
  layer = {"distilbert": _distilbert_layer, "modernbert": _modernbert_layer}.get(family,
                                                                                 _bert_layer)
  for i in range(config.n_layers):
    for path, name in layer(i).items():
      yield (f"layers_{i}", *path), name


def _kind(path: tuple) -> str:
  """How a module's weights map: 'table' (weight), 'norm' (weight, bias -> scale, bias),
  'dense' (weight [out, in] -> kernel [in, out], bias) or 'vector' (a bare parameter)."""
  if path[-1] in ("embedding", "position_embedding", "token_type_embedding"):
    return "table"
  if path[-1].startswith("norm") or path[-1] == "embedding_norm":
    return "norm"
  return "vector" if path[-1] == "bias" else "dense"


def read_hf_config(path: str | os.PathLike) -> dict:
  """config.json of the directory `path`, checked to be a family load_hf takes."""
  path = os.fspath(path)
  file = os.path.join(path, "config.json")
  if not os.path.isdir(path):
    raise HFError(f"{path}: not a directory (expected a Hugging Face model directory with "
                  f"config.json and its weights)")
  try:
    with open(file, encoding="utf-8") as f:
      hf = json.load(f)
  except FileNotFoundError:
    raise HFError(f"{file}: no such file (a Hugging Face model directory has one)") from None
  except (OSError, ValueError) as e:
    raise HFError(f"{file}: not readable JSON ({e})") from None
  if not isinstance(hf, dict):
    raise HFError(f"{file}: holds a {type(hf).__name__}, expected a JSON object")
  model_type = hf.get("model_type")
  if not isinstance(model_type, str) or model_type not in FAMILIES:
    raise HFError(f"{file}: model_type {model_type!r} is not one load_hf takes; it takes "
                  f"{sorted(FAMILIES)}")
  return hf


class _Fields:
  """The fields of a config.json (or of one object in it, `within`), each read as the kind of
  value transformers' config class holds there: anything else is an HFError naming the field
  and the file, never a value transformers would read differently."""

  def __init__(self, hf: Mapping, file: str, within: str = ""):
    self.hf, self.file, self.within = hf, file, within

  def error(self, key: str, expected: str) -> HFError:
    got = f"={self.hf[key]!r}" if key in self.hf else " missing"
    return HFError(f"{self.file}: {self.within}{key}{got}, expected {expected}")

  def get(self, key: str, default=None):
    return self.hf.get(key, default)

  def integer(self, key: str, default=None, expected: str = "an integer >= 1",
              ok=lambda n: n >= 1) -> int:
    value = self.hf.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not ok(value):
      raise self.error(key, expected)
    return value

  def number(self, key: str, default, expected: str = "a number > 0",
             ok=lambda x: x > 0) -> float:
    value = self.hf.get(key, default)
    if (isinstance(value, bool) or not isinstance(value, (int, float))
        or not abs(value) <= sys.float_info.max or not ok(value)):  # NaN and inf fail too
      raise self.error(key, expected)
    return float(value)

  def rate(self, key: str, default: float) -> float:
    return self.number(key, default, "a number in [0, 1)", lambda x: 0 <= x < 1)

  def flag(self, key: str, default: bool) -> bool:
    value = self.hf.get(key, default)
    if not isinstance(value, bool):
      raise self.error(key, "true or false")
    return value

  def choice(self, key: str, default, allowed) -> str:
    value = self.hf.get(key, default)
    if not isinstance(value, str) or value not in allowed:
      raise self.error(key, f"one of {sorted(allowed)}")
    return value


# The config.json names of (d_model, n_heads, d_ff, n_layers), per family.
_SIZES = {"distilbert": ("dim", "n_heads", "hidden_dim", "n_layers")}
_BERT_SIZES = ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers")
# transformers' pad_token_id where config.json has none.
_PAD_IDS = {"bert": 0, "roberta": 1, "distilbert": 0, "modernbert": 50283}


def config_from_hf(hf: Mapping, *, file: str = "config.json", **settings) -> EncoderConfig:
  """The EncoderConfig of a config.json's contents (`hf`, read from `file`, which errors
  name), run as `settings` say (dtype, param_dtype, attention_impl, scan_layers, remat,
  dropout …). The checkpoint's dropout rates are the defaults; attention dropout only with
  attention_impl='reference', the one implementation that has it."""
  fields = _Fields(hf, file)
  model_type = fields.choice("model_type", None, FAMILIES)
  family = FAMILIES[model_type]
  where = f"{file} ({model_type})"

  def refuse(option, value, expected):
    raise HFError(f"{where}: {option}={value!r} is not supported (expected {expected}); "
                  f"flax-encoder would compute another model")

  for option in ("is_decoder", "add_cross_attention"):
    if fields.flag(option, False):
      refuse(option, True, False)
  if family in ("bert", "roberta"):  # transformers 4's relative positions: another model
    fields.choice("position_embedding_type", "absolute", ("absolute",))
  fields.flag("tie_word_embeddings", True)  # read with the masked-LM head (`_check_tied`)
  names = _SIZES.get(family, _BERT_SIZES)
  d_model, n_heads, d_ff, n_layers = (fields.integer(name) for name in names)
  if d_model % n_heads:
    raise fields.error(names[0], f"a multiple of {names[1]}={n_heads}")
  sizes = dict(vocab_size=fields.integer("vocab_size"), d_model=d_model, n_heads=n_heads,
               d_ff=d_ff, n_layers=n_layers)
  sizes["pad_id"] = _pad_id(fields, family, sizes["vocab_size"])
  if family == "modernbert":
    act, arch, rates = _modernbert(fields, refuse, sizes)
  else:
    act, arch, rates = _bert(fields, refuse, model_type, sizes)
  if settings.get("attention_impl", "reference") != "reference":
    rates["attention_dropout"] = 0.0  # the fused kernels have none
  settings = {**rates, **settings}
  try:
    return EncoderConfig(activation=ACTIVATIONS[act], **sizes, **arch, **settings)
  except ValueError as e:  # ConfigError: a combination of fields, or a setting
    raise HFError(f"{where}: {e}") from None


def _pad_id(fields: _Fields, family: str, vocab_size: int) -> int:
  """The padding id: config.json's pad_token_id, transformers' default where it has none, 0
  where it is null (transformers then has no padding row; the caller's mask decides)."""
  if "pad_token_id" in fields.hf and fields.get("pad_token_id") is None and family != "roberta":
    return 0
  return fields.integer("pad_token_id", _PAD_IDS[family],
                        f"an id in [0, vocab_size={vocab_size})", lambda i: 0 <= i < vocab_size)


def _bert(fields: _Fields, refuse, model_type: str, sizes: dict) -> tuple[str, dict, dict]:
  """(activation, architecture fields, dropout rates) of a BERT, RoBERTa or DistilBERT
  config.json."""
  family = FAMILIES[model_type]
  offset = sizes["pad_id"] + 1 if family == "roberta" else 0
  if offset:
    max_positions = fields.integer(
        "max_position_embeddings", 512, f"an integer > pad_token_id + 1 = {offset} (RoBERTa's "
        f"positions start after the padding id)", lambda n: n > offset)
  else:
    max_positions = fields.integer("max_position_embeddings", 512)
  arch = dict(max_len=max_positions - offset, position_embedding="learned",
              position_offset=offset, embedding_scale=False, embedding_norm=True,
              final_norm=False, norm_position="post")
  if family == "distilbert":
    act = fields.choice("activation", "gelu", ACTIVATIONS)
    arch.update(layer_norm_eps=1e-12, type_vocab_size=0)
    return act, arch, dict(dropout=fields.rate("dropout", 0.1),
                           attention_dropout=fields.rate("attention_dropout", 0.1))
  act = fields.choice("hidden_act", "gelu", ACTIVATIONS)
  if model_type == "electra" and fields.integer("embedding_size", 128) != sizes["d_model"]:
    refuse("embedding_size", fields.get("embedding_size", 128),
           f"hidden_size={sizes['d_model']}")
  arch.update(layer_norm_eps=fields.number("layer_norm_eps", 1e-12),
              type_vocab_size=fields.integer("type_vocab_size", 2))
  return act, arch, dict(dropout=fields.rate("hidden_dropout_prob", 0.1),
                         attention_dropout=fields.rate("attention_probs_dropout_prob", 0.1))


_LAYER_TYPES = ("full_attention", "sliding_attention")


def _modernbert(fields: _Fields, refuse, sizes: dict) -> tuple[str, dict, dict]:
  """(activation, architecture fields, dropout rates) of a ModernBERT config.json."""
  head_dim = fields.get("head_dim")
  if head_dim and head_dim != sizes["d_model"] // sizes["n_heads"]:  # its rotary reads it
    refuse("head_dim", head_dim, f"hidden_size // num_attention_heads = "
                                 f"{sizes['d_model'] // sizes['n_heads']}")
  if fields.get("rope_scaling") is not None:
    refuse("rope_scaling", fields.get("rope_scaling"), "null")
  theta, local_theta = _rope_thetas(fields, refuse)
  bias = fields.flag("attention_bias", False)
  for option in ("mlp_bias", "classifier_bias"):
    if fields.flag(option, False) != bias:
      refuse(option, fields.get(option), f"attention_bias={bias!r} (one switch for every dense "
                                         f"layer)")
  if not fields.flag("decoder_bias", True):
    refuse("decoder_bias", False, "True")
  act = fields.choice("hidden_activation", "gelu", ACTIVATIONS)
  if fields.choice("classifier_activation", act, ACTIVATIONS) != act:
    refuse("classifier_activation", fields.get("classifier_activation"), f"{act!r}, the layers'")
  fields.choice("classifier_pooling", "cls", ("cls", "mean"))
  # transformers' window is local_attention // 2 either way, so 0 and 1 both let a token see
  # itself alone; EncoderConfig's 1 is that window, its 0 none at all.
  window = fields.integer("local_attention", 128, "an integer >= 0", lambda n: n >= 0)
  arch = dict(max_len=fields.integer("max_position_embeddings", 8192),
              position_embedding="rotary", rope_theta=theta, local_rope_theta=local_theta,
              local_attention=max(window, 1),
              global_attention_every=_global_every(fields, refuse, sizes["n_layers"]),
              glu=True, dense_bias=bias, norm_bias=fields.flag("norm_bias", False),
              layer_norm_eps=fields.number("norm_eps", 1e-5), first_attention_norm=False,
              embedding_scale=False, embedding_norm=True, final_norm=True, norm_position="pre",
              type_vocab_size=0)
  rates = dict(dropout=fields.rate("mlp_dropout", 0.0),
               attention_dropout=fields.rate("attention_dropout", 0.0))
  return act, arch, rates


def _global_every(fields: _Fields, refuse, n_layers: int) -> int:
  """Every how many layers, from layer 0, transformers' ModernBERT attends globally: as its
  layer_types say where given, else every global_attn_every_n_layers (3 by default)."""
  every = (fields.integer("global_attn_every_n_layers")
           if "global_attn_every_n_layers" in fields.hf else None)
  kinds = fields.get("layer_types")
  if kinds is None:
    return every or 3
  if (not isinstance(kinds, list) or len(kinds) != n_layers
      or not all(isinstance(k, str) and k in _LAYER_TYPES for k in kinds)):
    raise fields.error("layer_types", f"a list of num_hidden_layers={n_layers} of "
                                      f"{list(_LAYER_TYPES)}")
  full = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
  every = every or (full[1] if len(full) > 1 else n_layers)
  if kinds != ["sliding_attention" if i % every else "full_attention" for i in range(n_layers)]:
    refuse("layer_types", kinds, f"global every {every} layers, from layer 0")
  return every


def _rope_thetas(fields: _Fields, refuse) -> tuple[float, float]:
  """The rotary bases of the global and the local layers as transformers' ModernBertConfig
  sets them: rope_parameters' rope_theta of each, else global_rope_theta and
  local_rope_theta, else 160000 and 10000."""
  rope = fields.get("rope_parameters", {})
  rope = {} if rope is None else rope
  if not isinstance(rope, dict) or not set(rope) <= set(_LAYER_TYPES):
    raise fields.error("rope_parameters", f"an object of {list(_LAYER_TYPES)}")
  thetas = []
  for kind, old, default in (("full_attention", "global_rope_theta", 160000.0),
                             ("sliding_attention", "local_rope_theta", 10000.0)):
    params = rope.get(kind, {})
    if not isinstance(params, dict):
      raise _Fields(rope, fields.file, "rope_parameters.").error(kind, "an object")
    kind_fields = _Fields(params, fields.file, f"rope_parameters.{kind}.")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
      refuse(f"rope_parameters[{kind!r}].rope_type", rope_type, "'default'")
    thetas.append(kind_fields.number("rope_theta", fields.number(old, default)))
  return thetas[0], thetas[1]


def read_hf_weights(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """The state dict of the directory `path`: model.safetensors, pytorch_model.bin (read with
  torch.load(weights_only=True)), or either's shards through their index, each shard a file
  of the directory (`_shard`)."""
  path = os.fspath(path)
  for name in WEIGHT_FILES:
    file = os.path.join(path, name)
    if not os.path.isfile(file):
      continue
    if not name.endswith(".index.json"):
      return load_torch_checkpoint(file)
    try:
      with open(file, encoding="utf-8") as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      raise HFError(f"{file}: not an index of shards ({type(e).__name__}: {e})") from None
    state = {}
    for shard in shards:
      state.update(load_torch_checkpoint(_shard(path, shard, file)))
    return state
  raise HFError(f"{path}: no weights (expected one of {', '.join(WEIGHT_FILES)})")


def _shard(directory: str, name: Any, index: str) -> str:
  """The file of the shard `name` that `index` names, refused where it is not a file within
  `directory` once resolved: an absolute path, `..` or a link out would load another model's
  weights."""
  if not isinstance(name, str):
    raise HFError(f"{index}: shard {name!r}, expected a file name")
  file = os.path.realpath(os.path.join(directory, name))
  root = os.path.realpath(directory)
  roots = [root]
  parts = root.split(os.sep)
  if "snapshots" in parts[:-1]:  # huggingface_hub's cache: each file links to ../../blobs/<hash>
    at = len(parts) - 1 - parts[::-1].index("snapshots")
    roots.append(os.sep.join(parts[:at] + ["blobs"]))
  if not any(os.path.commonpath([r, file]) == r for r in roots):
    raise HFError(f"{index}: shard {name!r} leads out of {directory} (to {file}), expected a "
                  f"file of the model directory")
  if not os.path.isfile(file):
    raise HFError(f"{index}: shard {name!r}: no such file in {directory}")
  return file


def _base_prefix(state: Mapping, model_type: str, family: str) -> str:
  word = (_MODERNBERT if family == "modernbert" else _EMBEDDINGS)[("embedding",)] + ".weight"
  base = {"bert": "bert.", "electra": "electra.", "roberta": "roberta.",
          "xlm-roberta": "roberta.", "camembert": "roberta.", "distilbert": "distilbert.",
          "modernbert": "model."}
  for prefix in ("", base[model_type]):
    if prefix + word in state:
      return prefix
  raise HFError(f"the weights hold no {word!r} nor {base[model_type] + word!r}: not a "
                f"{family} encoder")


# Where each family's layers are, within the encoder.
_LAYERS = {"bert": "encoder.layer.", "roberta": "encoder.layer.",
           "distilbert": "transformer.layer.", "modernbert": "layers."}


def _check_depth(state: Mapping, at: str, family: str, config: EncoderConfig) -> None:
  """Refuses a config.json of more layers than the weights hold, before anything is built."""
  held = len({k[len(at):].split(".")[0] for k in state if k.startswith(at)})
  if config.n_layers > held:
    field = _SIZES.get(family, _BERT_SIZES)[3]
    raise HFError(f"config.json: {field}={config.n_layers}, but the weights hold {held} layers "
                  f"({at}{{i}})")


def from_hf_state_dict(state: Mapping[str, Any], hf: Mapping,
                       config: EncoderConfig) -> dict:
  """A transformers state dict (names -> tensors or arrays) of the config.json `hf` ->
  {'params': the encoder's, 'heads': {'pooler': …, 'masked_lm': …} where present}, numpy
  arrays in config.param_dtype. Each tensor's shape is checked against `config`; weights of
  the encoder that config.json does not name (a layer past num_hidden_layers, a bias the
  config has none of) are left out with a warning."""
  model_type = hf["model_type"]
  family = FAMILIES[model_type]
  prefix = _base_prefix(state, model_type, family)
  _check_depth(state, prefix + _LAYERS[family], family, config)
  cast = lambda x: np.asarray(_to_numpy("", x), dtype=config.param_dtype)
  read: set[str] = set()

  def module(name: str, path: tuple, where: str) -> dict:
    kind = _kind(path)
    has_bias = {"dense": config.dense_bias, "norm": config.norm_bias}.get(kind, False)
    if kind == "vector":
      keys = {"bias": name}
    else:
      keys = {"weight": name + ".weight"} | ({"bias": name + ".bias"} if has_bias else {})
    out = {}
    for what, key in keys.items():
      key = where + key
      if key not in state:
        raise HFError(f"the weights have no {key!r} (a {family} model of "
                      f"{config.n_layers} layers has one)")
      shape, want = tuple(np.shape(state[key])), _expected_shape(config, path, what)
      if shape != want:
        raise HFError(f"{key!r} has shape {shape}, expected {want} from config.json")
      read.add(key)
      value = cast(state[key])
      if kind == "dense" and what == "weight":
        value = value.T
      out[{"weight": "kernel" if kind == "dense" else "scale" if kind == "norm" else
           "embedding", "bias": "bias"}[what]] = value
    return out["bias"] if kind == "vector" else out

  params: dict = {}
  for path, name in _names(family, config):
    _put(params, path, module(name, path, prefix))
  if family == "modernbert":
    for i in range(config.n_layers):
      params[f"layers_{i}"]["self_attn"].update(_split_qkv(
          module(f"layers.{i}.{_QKV}", ("qkv",), prefix)))
  heads: dict = {}
  if any(k.startswith(prefix + "pooler.") for k in state):
    heads["pooler"] = {"dense": module("pooler.dense", ("dense",), prefix)}
  if family == "modernbert" and _PREDICTION_HEAD[("dense",)] + ".weight" in state:
    heads["prediction_head"] = {}
    for path, name in _PREDICTION_HEAD.items():
      _put(heads["prediction_head"], path, module(name, path, ""))
  mlm = _MASKED_LM[family]
  if mlm[("bias",)] in state or (family == "bert" and "cls.predictions.decoder.bias" in state):
    if family == "bert" and mlm[("bias",)] not in state:
      mlm = {**mlm, ("bias",): "cls.predictions.decoder.bias"}
    heads["masked_lm"] = {}
    for path, name in mlm.items():
      _put(heads["masked_lm"], path, module(name, path, ""))
    _check_tied(state, hf, family, params["embedding"]["embedding"], cast)
  _warn_unread(state, prefix, read)
  if config.scan_layers:
    params = stack_layers(params, config.n_layers)
  return {"params": params, "heads": heads} if heads else {"params": params}


def _split_qkv(qkv: dict) -> dict:
  """ModernBERT's Wqkv (kernel [d, 3 d], q k v stacked) -> w_q, w_k, w_v."""
  parts = {k: np.split(v, 3, axis=-1) for k, v in qkv.items()}
  return {name: {k: v[i] for k, v in parts.items()}
          for i, name in enumerate(("w_q", "w_k", "w_v"))}


def _check_tied(state, hf, family, table, cast) -> None:
  decoder = _DECODER[family] + ".weight"
  untied = hf.get("tie_word_embeddings", True) is False
  if untied or (decoder in state and not np.array_equal(cast(state[decoder]), table)):
    raise HFError(f"the masked-LM decoder {decoder!r} is not tied to the word embeddings "
                  f"(tie_word_embeddings=false): flax-encoder's head is tied")


def _warn_unread(state: Mapping, prefix: str, read: set) -> None:
  """Warns of the encoder's weights (those under its prefix) that nothing read: config.json
  names fewer layers or modules than the weights hold. The index buffers transformers
  recomputes are not weights."""
  unread = [k for k in state if k.startswith(prefix) and k not in read
            and not k.endswith(INDEX_BUFFERS)]
  if unread:
    more = ", …" if len(unread) > 4 else ""
    warnings.warn(f"load_hf left out {len(unread)} of the encoder's weights, which its "
                  f"config.json does not name: {', '.join(unread[:4])}{more}", stacklevel=3)


def _expected_shape(config: EncoderConfig, path: tuple, what: str) -> tuple[int, ...]:
  """The shape the module at flax `path` has in the state dict (torch.nn.Linear's weight
  [out, in]), for its "weight" or "bias"."""
  d, kind, name = config.d_model, _kind(path), path[-1]
  if kind == "table":
    rows = {"embedding": config.vocab_size, "token_type_embedding": config.type_vocab_size,
            "position_embedding": config.max_len + config.position_offset}[name]
    return (rows, d)
  if kind == "norm":
    return (d,)
  if kind == "vector":  # the masked-LM head's output bias
    return (config.vocab_size,)
  out, inputs = {"qkv": (3 * d, d), "w_1": (config.d_ff * (2 if config.glu else 1), d),
                 "w_2": (d, config.d_ff)}.get(name, (d, d))
  return (out, inputs) if what == "weight" else (out,)


def _put(tree: dict, path: tuple, value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def load_hf(path: str | os.PathLike, **settings) -> tuple[EncoderConfig, dict]:
  """A Hugging Face BERT, RoBERTa, DistilBERT or ModernBERT directory -> (EncoderConfig,
  variables).

  `Encoder(config).apply(variables, input_ids)` returns transformers' last_hidden_state
  (padding is the model's own pad_token_id; `token_types=` as its token_type_ids, zeros by
  default). `variables["heads"]` holds the masked-LM head ("masked_lm", for
  `flax_encoder.heads.MaskedLMHead`), the pooler ("pooler", for `heads.Pooler`) and ModernBERT's
  prediction head ("prediction_head", for `heads.PredictionHead`: the masked-LM head's dense and
  norm, or a classifier's) where the checkpoint has them. `settings` choose how it runs (dtype,
  param_dtype, attention_impl, scan_layers, remat, dropout): see `config_from_hf`.
  """
  hf = read_hf_config(path)
  config = config_from_hf(hf, file=os.path.join(path, "config.json"), **settings)
  state = read_hf_weights(path)
  try:
    return config, from_hf_state_dict(state, hf, config)
  except HFError as e:
    raise HFError(f"{os.fspath(path)}: {e}") from None


def hf_config(config: EncoderConfig, family: str, **extra) -> dict:
  """The config.json contents of `config` as a transformers `family` model ('bert',
  'roberta', 'distilbert', 'modernbert'); `extra` entries (architectures, id2label …) are
  added. HFError naming the fields that differ where `config` is not such a model."""
  if family not in _EXPORTED:
    raise HFError(f"family {family!r}: expected one of {_EXPORTED}")
  if family == "modernbert":
    want = dict(position_embedding="rotary", position_offset=0, type_vocab_size=0,
                embedding_scale=False, embedding_norm=True, final_norm=True, norm_position="pre",
                first_attention_norm=False, glu=True)
  else:
    want = dict(position_embedding="learned", embedding_scale=False, embedding_norm=True,
                final_norm=False, norm_position="post", glu=False, dense_bias=True,
                norm_bias=True, local_attention=0,
                position_offset=config.pad_id + 1 if family == "roberta" else 0)
  if family == "distilbert":
    want["type_vocab_size"] = 0
    want["layer_norm_eps"] = 1e-12
  elif family != "modernbert" and config.type_vocab_size < 1:
    raise HFError(f"this model is not a {family} model: it has type_vocab_size=0, a {family} "
                  f"model at least 1")
  wrong = {k: getattr(config, k) for k, v in want.items() if getattr(config, k) != v}
  if wrong:
    raise HFError(f"this model is not a {family} model: it has "
                  f"{', '.join(f'{k}={v!r}' for k, v in wrong.items())}, a {family} model "
                  f"{', '.join(f'{k}={want[k]!r}' for k in wrong)}")
  act = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}[config.activation]
  max_positions = config.max_len + config.position_offset
  if family == "modernbert":
    out = _modernbert_config(config, act)
  elif family == "distilbert":
    out = dict(model_type="distilbert", vocab_size=config.vocab_size, dim=config.d_model,
               n_heads=config.n_heads, hidden_dim=config.d_ff, n_layers=config.n_layers,
               activation=act, max_position_embeddings=max_positions,
               dropout=config.dropout, attention_dropout=config.attention_dropout,
               pad_token_id=config.pad_id, sinusoidal_pos_embds=False)
  else:
    out = dict(model_type=family, vocab_size=config.vocab_size, hidden_size=config.d_model,
               num_attention_heads=config.n_heads, intermediate_size=config.d_ff,
               num_hidden_layers=config.n_layers, hidden_act=act,
               max_position_embeddings=max_positions, type_vocab_size=config.type_vocab_size,
               layer_norm_eps=config.layer_norm_eps, hidden_dropout_prob=config.dropout,
               attention_probs_dropout_prob=config.attention_dropout,
               pad_token_id=config.pad_id, position_embedding_type="absolute")
  return {**out, "tie_word_embeddings": True, **extra}


def _modernbert_config(config: EncoderConfig, act: str) -> dict:
  """ModernBertConfig's fields of `config` (a ModernBERT architecture), as transformers 5
  writes them: the window's layers as layer_types, both rotary bases in rope_parameters. The
  special ids are None: `hf_config`'s caller may give a tokenizer's."""
  every = config.global_attention_every if config.local_attention else 1
  kinds = ["full_attention" if config.is_global(i) else "sliding_attention"
           for i in range(config.n_layers)]
  rope = {"full_attention": {"rope_type": "default", "rope_theta": config.rope_theta},
          "sliding_attention": {"rope_type": "default", "rope_theta": config.local_rope_theta}}
  return dict(model_type="modernbert", vocab_size=config.vocab_size, hidden_size=config.d_model,
              intermediate_size=config.d_ff, num_hidden_layers=config.n_layers,
              num_attention_heads=config.n_heads, hidden_activation=act,
              classifier_activation=act, max_position_embeddings=config.max_len,
              norm_eps=config.layer_norm_eps, norm_bias=config.norm_bias,
              attention_bias=config.dense_bias, mlp_bias=config.dense_bias,
              classifier_bias=config.dense_bias, decoder_bias=True,
              local_attention=config.local_attention, global_attn_every_n_layers=every,
              layer_types=kinds, rope_parameters=rope, embedding_dropout=config.dropout,
              mlp_dropout=config.dropout, classifier_dropout=config.dropout,
              attention_dropout=config.attention_dropout, pad_token_id=config.pad_id,
              bos_token_id=None, eos_token_id=None, cls_token_id=None, sep_token_id=None)


def to_hf_state_dict(variables: Mapping, config: EncoderConfig, family: str,
                     prefix: str = "") -> dict[str, np.ndarray]:
  """The encoder's params (and `variables['heads']`' masked_lm, pooler and prediction_head)
  -> a transformers state dict of numpy arrays: the encoder's keys under `prefix` ('bert.',
  'model.' etc. inside a *For… model, '' for the bare model), the heads' at the top (the
  pooler under `prefix`). A module without biases (dense_bias, norm_bias False) has no bias
  key."""
  params = nn.unbox(variables["params"])
  if config.scan_layers:
    params = unstack_layers(params, config.n_layers)
  state: dict[str, np.ndarray] = {}

  def emit(tree: Mapping, path: tuple, name: str) -> None:
    node = tree
    for key in path:
      node = node[key]
    kind = _kind(path)
    node = node if kind == "vector" else dict(node)
    if kind == "vector":
      state[name] = np.asarray(node)
    elif kind == "table":
      state[name + ".weight"] = np.asarray(node["embedding"])
    elif kind == "norm":
      state[name + ".weight"] = np.asarray(node["scale"])
    else:
      state[name + ".weight"] = np.asarray(node["kernel"]).T
    if kind in ("norm", "dense") and "bias" in node:
      state[name + ".bias"] = np.asarray(node["bias"])

  for path, name in _names(family, config):
    emit(params, path, prefix + name)
  if family == "modernbert":
    for i in range(config.n_layers):
      attention = params[f"layers_{i}"]["self_attn"]
      qkv = {k: np.concatenate([np.asarray(attention[w][k]) for w in ("w_q", "w_k", "w_v")], -1)
             for k in attention["w_q"]}
      emit({"qkv": qkv}, ("qkv",), f"{prefix}layers.{i}.{_QKV}")
  heads = nn.unbox(variables.get("heads", {}))
  if "pooler" in heads:
    emit(heads["pooler"], ("dense",), prefix + "pooler.dense")
  if "prediction_head" in heads:
    for path, name in _PREDICTION_HEAD.items():
      emit(heads["prediction_head"], path, name)
  if "masked_lm" in heads:
    shared = {k: state[k] for k in state if k.startswith("head.")}
    for path, name in _MASKED_LM[family].items():
      emit(heads["masked_lm"], path, name)
    if any(not np.array_equal(v, state[k]) for k, v in shared.items()):
      raise HFError("heads: the masked-LM head's dense and norm differ from the prediction "
                    "head's, and ModernBERT's checkpoint holds one 'head' for both")
    decoder = _DECODER[family]
    table = (_MODERNBERT if family == "modernbert" else _EMBEDDINGS)[("embedding",)]
    state[decoder + ".weight"] = state[prefix + table + ".weight"]
    if family == "bert":
      state[decoder + ".bias"] = state["cls.predictions.bias"]
  return {k: np.ascontiguousarray(v) for k, v in state.items()}
