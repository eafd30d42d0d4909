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
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import flax.linen as nn
import numpy as np

from flax_encoder.config import EncoderConfig
from flax_encoder.encoder import stack_layers, unstack_layers
from flax_encoder.pytorch.convert import _to_numpy, load_torch_checkpoint

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
  if model_type not in FAMILIES:
    raise HFError(f"{file}: model_type {model_type!r} is not one load_hf takes; it takes "
                  f"{sorted(FAMILIES)}")
  return hf


def config_from_hf(hf: Mapping, **settings) -> EncoderConfig:
  """The EncoderConfig of a config.json's contents (`hf`), run as `settings` say (dtype,
  param_dtype, attention_impl, scan_layers, remat, dropout …). The checkpoint's dropout rates
  are the defaults; attention dropout only with attention_impl='reference', the one
  implementation that has it."""
  model_type = hf["model_type"]
  family = FAMILIES[model_type]
  where = f"config.json ({model_type})"

  def refuse(option, value, expected):
    raise HFError(f"{where}: {option}={value!r} is not supported (expected {expected}); "
                  f"flax-encoder would compute another model")

  get = lambda key, default=None: hf.get(key, default)
  for option, expected in (("is_decoder", False), ("add_cross_attention", False)):
    if get(option, expected) != expected:
      refuse(option, get(option), expected)
  pad_id = get("pad_token_id")
  pad_id = 0 if pad_id is None else pad_id
  if family == "modernbert":
    act, arch, rates = _modernbert(get, refuse)
  else:
    act = get("activation" if family == "distilbert" else "hidden_act", "gelu")
    offset = pad_id + 1 if family == "roberta" else 0
    arch = dict(max_len=get("max_position_embeddings", 512) - offset,
                position_embedding="learned", position_offset=offset, embedding_scale=False,
                embedding_norm=True, final_norm=False, norm_position="post")
  if family == "distilbert":
    arch.update(d_model=get("dim"), n_heads=get("n_heads"), d_ff=get("hidden_dim"),
                n_layers=get("n_layers"), layer_norm_eps=1e-12, type_vocab_size=0)
    rates = dict(dropout=get("dropout", 0.1), attention_dropout=get("attention_dropout", 0.1))
  elif family in ("bert", "roberta"):
    if get("position_embedding_type", "absolute") != "absolute":
      refuse("position_embedding_type", get("position_embedding_type"), "'absolute'")
    if model_type == "electra" and get("embedding_size", get("hidden_size")) != get(
        "hidden_size"):
      refuse("embedding_size", get("embedding_size"), f"hidden_size={get('hidden_size')}")
    arch.update(layer_norm_eps=get("layer_norm_eps", 1e-12),
                type_vocab_size=get("type_vocab_size", 2))
    rates = dict(dropout=get("hidden_dropout_prob", 0.1),
                 attention_dropout=get("attention_probs_dropout_prob", 0.1))
  if family != "distilbert":
    arch.update(d_model=get("hidden_size"), n_heads=get("num_attention_heads"),
                d_ff=get("intermediate_size"), n_layers=get("num_hidden_layers"))
  if act not in ACTIVATIONS:
    refuse({"distilbert": "activation", "modernbert": "hidden_activation"}.get(
        family, "hidden_act"), act, f"one of {sorted(ACTIVATIONS)}")
  if settings.get("attention_impl", "reference") != "reference":
    rates["attention_dropout"] = 0.0  # the fused kernels have none
  settings = {**rates, **settings}
  try:
    return EncoderConfig(vocab_size=get("vocab_size"), pad_id=pad_id,
                         activation=ACTIVATIONS[act], **arch, **settings)
  except ValueError as e:  # ConfigError, or a missing size
    raise HFError(f"{where}: {e}") from None


def _modernbert(get, refuse) -> tuple[str, dict, dict]:
  """(activation, architecture fields, dropout rates) of a ModernBERT config.json."""
  n = get("num_hidden_layers")
  every = get("global_attn_every_n_layers", 1)
  kinds = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(n or 0)]
  if get("layer_types", kinds) != kinds:
    refuse("layer_types", get("layer_types"), f"global every {every} layers, from layer 0")
  rope = get("rope_parameters") or {}
  for kind, params in rope.items():
    if (params or {}).get("rope_type", "default") != "default":
      refuse(f"rope_parameters[{kind!r}].rope_type", params["rope_type"], "'default'")
  theta = (rope.get("full_attention") or {}).get("rope_theta", get("global_rope_theta", 160000.0))
  local = (rope.get("sliding_attention") or {}).get("rope_theta", get("local_rope_theta"))
  bias = get("attention_bias", False)
  for option in ("mlp_bias", "classifier_bias"):
    if get(option, False) != bias:
      refuse(option, get(option), f"attention_bias={bias!r} (one switch for every dense layer)")
  if get("decoder_bias", True) is not True:
    refuse("decoder_bias", get("decoder_bias"), "True")
  act = get("hidden_activation", "gelu")
  if get("classifier_activation", act) != act:
    refuse("classifier_activation", get("classifier_activation"), f"{act!r}, the layers'")
  if get("classifier_pooling", "cls") not in ("cls", "mean"):
    refuse("classifier_pooling", get("classifier_pooling"), "'cls' or 'mean'")
  arch = dict(max_len=get("max_position_embeddings", 8192), position_embedding="rotary",
              rope_theta=float(theta), local_rope_theta=float(local or theta),
              local_attention=get("local_attention", 128), global_attention_every=every,
              glu=True, dense_bias=bias, norm_bias=get("norm_bias", False),
              layer_norm_eps=get("norm_eps", 1e-5), first_attention_norm=False,
              embedding_scale=False, embedding_norm=True, final_norm=True, norm_position="pre",
              type_vocab_size=0)
  rates = dict(dropout=get("mlp_dropout", 0.0), attention_dropout=get("attention_dropout", 0.0))
  return act, arch, rates


def read_hf_weights(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """The state dict of the directory `path`: model.safetensors, pytorch_model.bin (read with
  torch.load(weights_only=True)), or either's shards through their index."""
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
      state.update(load_torch_checkpoint(os.path.join(path, shard)))
    return state
  raise HFError(f"{path}: no weights (expected one of {', '.join(WEIGHT_FILES)})")


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


def from_hf_state_dict(state: Mapping[str, Any], hf: Mapping,
                       config: EncoderConfig) -> dict:
  """A transformers state dict (names -> tensors or arrays) of the config.json `hf` ->
  {'params': the encoder's, 'heads': {'pooler': …, 'masked_lm': …} where present}, numpy
  arrays in config.param_dtype."""
  model_type = hf["model_type"]
  family = FAMILIES[model_type]
  prefix = _base_prefix(state, model_type, family)
  cast = lambda x: np.asarray(_to_numpy("", x), dtype=config.param_dtype)
  expected = _expected_shapes(config)

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
      value = cast(state[key])
      if kind == "dense" and what == "weight":
        value = value.T
      want = expected.get((path[-1], what), value.shape)
      if tuple(value.shape) != tuple(want):
        raise HFError(f"{key!r} has shape {tuple(value.shape)}, expected {tuple(want)} from "
                      f"config.json")
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


def _expected_shapes(config: EncoderConfig) -> dict:
  d, f = config.d_model, config.d_ff
  return {("qkv", "weight"): (d, 3 * d), ("qkv", "bias"): (3 * d,),
          ("w_1", "weight"): (d, f * (2 if config.glu else 1)),
          ("w_1", "bias"): (f * (2 if config.glu else 1),),
          ("embedding", "weight"): (config.vocab_size, d),
          ("position_embedding", "weight"): (config.max_len + config.position_offset, d),
          ("token_type_embedding", "weight"): (config.type_vocab_size, d),
          ("w_2", "weight"): (f, d)}


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
  config = config_from_hf(hf, **settings)
  return config, from_hf_state_dict(read_hf_weights(path), hf, config)


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
