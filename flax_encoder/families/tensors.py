"""A transformers state dict <-> flax variables, by the names of the family of its model_type.

Reading checks each tensor's shape against the EncoderConfig of config.json, and leaves out
with a warning the encoder's weights config.json does not name (a layer past
num_hidden_layers). torch.nn.Linear stores weight as [out, in]; flax's Dense kernel is
[in, out].
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import numpy as np

from flax_encoder import relative
from flax_encoder.families import registry
from flax_encoder.config import EncoderConfig
from flax_encoder.encoder import stack_layers, unstack_layers
from flax_encoder.families.family import Chunks, Family, HFError

# Integer buffers that transformers' BERT-family checkpoints carry beside the weights (the
# position and token-type ids the embeddings count from): not weights, left out on reading.
INDEX_BUFFERS = ("position_ids", "token_type_ids")
# The names of a LayerNorm's parameters in checkpoints converted from TensorFlow (Google's BERT)
# or saved by transformers 2 and 3, which transformers still renames on loading.
LEGACY_NORM_NAMES = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}


def to_numpy(name: str, value: Any) -> np.ndarray:
  """A state dict's tensor (torch's, without importing torch) or array, as numpy (bfloat16
  tensors as float32, exactly); TypeError naming it where it is not floating-point."""
  if hasattr(value, "detach"):  # a torch.Tensor
    value = value.detach().cpu()
    if str(value.dtype) == "torch.bfloat16":
      value = value.float()  # numpy has no bfloat16; exact, and cast to param_dtype below
    value = value.numpy()
  value = np.asarray(value)
  if not np.issubdtype(value.dtype, np.floating) and value.dtype.name != "bfloat16":
    raise TypeError(f"state_dict[{name!r}] must hold floating-point weights, got {value.dtype}")
  return value


def _kind(path: tuple) -> str:
  """How a module's weights map: 'table' (weight), 'norm' (weight, bias -> scale, bias),
  'dense' (weight [out, in] -> kernel [in, out], bias) or 'vector' (a bare parameter). A path
  ending in an int n is a dense module's n-th part (`Names`)."""
  if isinstance(path[-1], int):
    return "dense"
  if path[-1] in ("embedding", "position_embedding", "token_type_embedding",
                  "relative_attention_bias", "rel_embeddings"):
    return "table"
  if path[-1].startswith("norm") or path[-1] == "embedding_norm":
    return "norm"
  return "vector" if path[-1] == "bias" else "dense"


def _expected_shape(config: EncoderConfig, path: tuple, what: str) -> tuple[int, ...]:
  """The shape the module at flax `path` (a head's under its name: ('masked_lm', 'dense')) has
  in the state dict (torch.nn.Linear's weight [out, in]), for its "weight" or "bias"."""
  if isinstance(path[-1], int):  # one of the n parts a dense module's outputs stack
    out, *rest = _expected_shape(config, path[:-1], what)
    return (out // path[-1], *rest)
  d, e, kind, name = config.d_model, config.embedding_width, _kind(path), path[-1]
  if kind == "table":
    if name == "relative_attention_bias":  # a score per bucket and head (MPNet's)
      return (relative.part(config.relative_attention).buckets, config.n_heads)
    if name == "rel_embeddings":  # a relative attention scheme's table (DeBERTa's)
      return (2 * relative.part(config.relative_attention).span, config.d_model)
    rows = {"embedding": config.vocab_size, "token_type_embedding": config.type_vocab_size,
            "position_embedding": config.max_len + config.position_offset}[name]
    return (rows, e)
  if kind == "norm":  # the masked-LM head maps back to the embedding's width (ALBERT's)
    return (e,) if path in (("embedding_norm",), ("masked_lm", "norm")) else (d,)
  if kind == "vector":  # the masked-LM head's output bias
    return (config.vocab_size,)
  kv = config.key_value_heads * config.head_dim  # grouped-query attention's keys and values
  out, inputs = {"qkv": (d + 2 * kv, d), "w_k": (kv, d), "w_v": (kv, d),
                 "decoder": (config.vocab_size, d),
                 "w_1": (config.d_ff * (2 if config.glu else 1), d),
                 "w_2": (d, config.d_ff), "embedding_projection": (d, e)}.get(
                     name, (e, d) if path == ("masked_lm", "dense") else (d, d))
  return (out, inputs) if what == "weight" else (out,)


def _put(tree: dict, path: tuple, value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _base_prefix(state: Mapping, model_type: str, family: Family) -> str:
  """'' for a bare model's state dict, else the encoder's prefix inside a *For… model's."""
  word = family.word_embeddings + ".weight"
  base = family.model_types[model_type]
  for prefix in ("", base):
    if prefix + word in state:
      return prefix
  raise HFError(f"the weights hold no {word!r} nor {base + word!r}: not a "
                f"{family.name} encoder")


def _check_depth(state: Mapping, at: str, family: Family, config: EncoderConfig) -> None:
  """Refuses a config.json of more layers than the weights hold, before anything is built.
  Shared layers are one layer's weights at every depth: their names say if they are held."""
  if config.shared_layers:
    return
  held = len({k[len(at):].split(".")[0] for k in state if k.startswith(at)})
  if config.n_layers > held:
    raise HFError(f"config.json: {family.sizes[3]}={config.n_layers}, but the weights hold "
                  f"{held} layers ({at}{{i}})")


def from_hf_state_dict(state: Mapping[str, Any], hf: Mapping,
                       config: EncoderConfig) -> dict:
  """A transformers state dict (names -> tensors or arrays) of the config.json `hf` ->
  {'params': the encoder's, 'heads': {'pooler': …, 'masked_lm': …} where present}, numpy
  arrays in config.param_dtype (float16 and bfloat16 weights are cast to it). A LayerNorm's
  legacy names (….LayerNorm.gamma and .beta) read as transformers reads them. Each tensor's
  shape is checked against `config`; weights of the encoder that config.json does not name (a
  layer past num_hidden_layers, a bias the config has none of) are left out with a warning."""
  model_type = hf["model_type"]
  family = registry.MODEL_TYPES[model_type]
  state = _current_names(state)
  refused = next((k for k in state for part in family.refused_weights if part in k), None)
  if refused:
    raise HFError(f"the weights hold {refused!r}, which transformers' {family.title} model "
                  f"has not (expected none of {list(family.refused_weights)}): merge or drop "
                  f"them first")
  prefix = _base_prefix(state, model_type, family)
  _check_depth(state, prefix + family.layers, family, config)
  cast = lambda x: np.asarray(to_numpy("", x), dtype=config.param_dtype)
  read: set[str] = set()

  def module(name: str | tuple[str, ...], path: tuple, where: str) -> dict:
    if isinstance(name, tuple):  # one dense module of several, stacked (Names)
      parts = [module(part, path + (len(name),), where) for part in name]
      return {k: np.concatenate([p[k] for p in parts], axis=-1) for k in parts[0]}
    if isinstance(name, Chunks):  # its outputs in another order
      chunks = {k: np.split(v, len(name.order), axis=-1)
                for k, v in module(name.name, path, where).items()}
      return {k: np.concatenate([v[j] for j in name.order], axis=-1) for k, v in chunks.items()}
    kind = _kind(path)
    # q, k and v in one matrix have a bias where w_q has one; a part where its module has.
    dense = path[-2] if isinstance(path[-1], int) else "w_q" if path[-1] == "qkv" else path[-1]
    has_bias = {"dense": config.has_bias(dense), "norm": config.norm_bias}.get(kind, False)
    if kind == "vector":
      keys = {"bias": name}
    else:
      keys = {"weight": name + ".weight"} | ({"bias": name + ".bias"} if has_bias else {})
    out = {}
    for what, key in keys.items():
      key = where + key
      if key not in state:
        raise HFError(f"the weights have no {key!r} (a {family.name} model of "
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
  for path, name in family.names(config):
    _put(params, path, module(name, path, prefix))
  if family.qkv:
    for i in range(config.n_layers):
      params[f"layers_{i}"]["self_attn"].update(_split_qkv(
          module(family.qkv.format(i=i), ("qkv",), prefix), config))
  heads: dict = {}
  if any(k.startswith(prefix + family.pooler + ".") for k in state):
    heads["pooler"] = {"dense": module(family.pooler, ("pooler", "dense"), prefix)}
  head = family.prediction_head
  if head and head[("dense",)] + ".weight" in state:
    heads["prediction_head"] = {}
    for path, name in head.items():
      _put(heads["prediction_head"], path, module(name, ("prediction_head", *path), ""))
  mlm = dict(family.masked_lm)
  if family.untied_decoder:
    held = mlm[("decoder",)] + ".weight"
  else:
    if family.decoder_bias and mlm[("bias",)] not in state:  # its copy, where only it is saved
      mlm[("bias",)] = family.decoder + ".bias"
    held = mlm[("bias",)]
  if held in state:
    heads["masked_lm"] = {}
    for path, name in mlm.items():
      _put(heads["masked_lm"], path, module(name, ("masked_lm", *path), ""))
    if not family.untied_decoder:
      _check_tied(state, hf, family, params["embedding"]["embedding"], cast)
  _warn_unread(state, prefix, read)
  if config.scan_layers:
    params = stack_layers(params, config.n_layers)
  return {"params": params, "heads": heads} if heads else {"params": params}


def _current_names(state: Mapping) -> Mapping:
  """`state` with each LayerNorm's legacy parameter names (`LEGACY_NORM_NAMES`) as transformers
  renames them; HFError where a LayerNorm holds a parameter under both names, either of which
  could be the one meant."""
  renamed = {}
  for key, value in state.items():
    for old, new in LEGACY_NORM_NAMES.items():
      if key.endswith(old):
        current = key[:-len(old)] + new
        if current in state:
          raise HFError(f"the weights hold both {key!r} and {current!r}, expected one of them")
        key = current
    renamed[key] = value
  return renamed


def _prefixed(prefix: str, name: str | tuple[str, ...] | Chunks):
  """`name` (each of its names) under `prefix`."""
  if isinstance(name, tuple):
    return tuple(prefix + part for part in name)
  if isinstance(name, Chunks):
    return Chunks(prefix + name.name, name.order)
  return prefix + name


def _split_qkv(qkv: dict, config: EncoderConfig) -> dict:
  """q, k and v in one matrix (kernel [d, d + 2 kv], stacked) -> w_q, w_k, w_v."""
  kv = config.key_value_heads * config.head_dim
  at = [config.d_model, config.d_model + kv]
  parts = {k: np.split(v, at, axis=-1) for k, v in qkv.items()}
  return {name: {k: v[i] for k, v in parts.items()}
          for i, name in enumerate(("w_q", "w_k", "w_v"))}


def _check_tied(state, hf, family: Family, table, cast) -> None:
  decoder = family.decoder + ".weight"
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


def to_hf_state_dict(variables: Mapping, config: EncoderConfig, family: str,
                     prefix: str = "") -> dict[str, np.ndarray]:
  """The encoder's params (and `variables['heads']`' masked_lm, pooler and prediction_head)
  -> a transformers state dict of the `family` of numpy arrays: the encoder's keys under
  `prefix` ('bert.', 'model.' etc. inside a *For… model, '' for the bare model), the heads'
  at the top (the pooler under `prefix`). A module without biases (dense_bias, norm_bias
  False) has no bias key."""
  family = registry.get(family)
  params = nn.unbox(variables["params"])
  if config.scan_layers:
    params = unstack_layers(params, config.n_layers)
  state: dict[str, np.ndarray] = {}

  def emit(tree: Mapping, path: tuple, name: str | tuple[str, ...] | Chunks) -> None:
    node = tree
    for key in path:
      node = node[key]
    if isinstance(name, (tuple, Chunks)):  # one dense module of several, stacked (Names)
      parts = len(name) if isinstance(name, tuple) else len(name.order)
      split = {k: np.split(np.asarray(v), parts, axis=-1) for k, v in dict(node).items()}
      if isinstance(name, Chunks):  # the file's chunk order[i] is our i-th
        stored = {k: [v[name.order.index(j)] for j in range(parts)] for k, v in split.items()}
        emit({"part": {k: np.concatenate(v, -1) for k, v in stored.items()}}, ("part",),
             name.name)
        return
      for i, part in enumerate(name):
        emit({"part": {k: v[i] for k, v in split.items()}}, ("part",), part)
      return
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

  for path, name in family.names(config):
    emit(params, path, _prefixed(prefix, name))
  if family.qkv:
    for i in range(config.n_layers):
      attention = params[f"layers_{i}"]["self_attn"]
      qkv = {k: np.concatenate([np.asarray(attention[w][k]) for w in ("w_q", "w_k", "w_v")], -1)
             for k in attention["w_q"]}
      emit({"qkv": qkv}, ("qkv",), prefix + family.qkv.format(i=i))
  heads = nn.unbox(variables.get("heads", {}))
  if "pooler" in heads:
    emit(heads["pooler"], ("dense",), prefix + family.pooler)
  if "prediction_head" in heads:
    for path, name in family.prediction_head.items():
      emit(heads["prediction_head"], path, name)
  if "masked_lm" in heads:
    # ModernBERT's masked-LM head and prediction head are one module of the checkpoint.
    shared = {k: state[k] for name in (family.prediction_head or {}).values()
              for k in (name + ".weight", name + ".bias") if k in state}
    for path, name in family.masked_lm.items():
      emit(heads["masked_lm"], path, name)
    if any(not np.array_equal(v, state[k]) for k, v in shared.items()):
      raise HFError(f"heads: the masked-LM head's dense and norm differ from the prediction "
                    f"head's, and {family.title}'s checkpoint holds one 'head' for both")
    if not family.untied_decoder:  # tied: the word embeddings (an untied one is written above)
      state[family.decoder + ".weight"] = state[prefix + family.word_embeddings + ".weight"]
    if family.decoder_bias:
      state[family.decoder + ".bias"] = state[family.masked_lm[("bias",)]]
  return {k: np.ascontiguousarray(v) for k, v in state.items()}
