"""PyTorch weights in and out: state dicts <-> flax variables, checkpoint files, sizes.

The state dict's layouts ("tutorial", "torch_nn") and how the encoder is found inside a larger
one are in `flax_encoder.pytorch.layouts`. torch.nn.Linear stores weight as [out, in]; flax's
Dense kernel is [in, out].
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import numpy as np
import torch

from flax_encoder.config import EncoderConfig
from flax_encoder.embedding import sinusoidal_positions
from flax_encoder.encoder import stack_layers, unstack_layers
from flax_encoder.families.safetensors_file import read_safetensors
from flax_encoder.families.tensors import INDEX_BUFFERS, to_numpy
from flax_encoder.pytorch.layouts import (
    DENSE,
    EMBEDDING_KEY,
    IN_PROJ,
    NORMS,
    PE_KEY,
    check_layout,
    expected_shapes,
    find_encoder,
)

_QKV = (("w_q", 0), ("w_k", 1), ("w_v", 2))  # order of the packed in_proj rows
# The tutorial port computes its table in float32 (off by up to ~max_len * 6e-8 from the exact
# sinusoid) and a bfloat16 copy rounds by up to 2^-9; a table of another formula (other base,
# halves instead of interleaved) is off by O(1).
_PE_ATOL = 1e-2


def _check_keys(state: Mapping[str, Any], config: EncoderConfig, layout: str) -> None:
  expected = expected_shapes(config, layout)
  missing = sorted(set(expected) - set(state))
  unexpected = sorted(set(state) - set(expected) - {PE_KEY})
  wrong = sorted(f"{k}: got {tuple(np.shape(state[k]))}, expected {expected[k]}"
                 for k in set(expected) & set(state)
                 if tuple(np.shape(state[k])) != expected[k])
  problems = []
  if missing:
    problems.append(f"missing keys ({len(missing)}): {', '.join(missing)}")
  if unexpected:
    problems.append(f"unexpected keys ({len(unexpected)}): {', '.join(unexpected)}")
  if wrong:
    problems.append(f"wrong shapes ({len(wrong)}): {'; '.join(wrong)}")
  if problems:
    raise ValueError(
        f"state_dict does not match layout={layout!r} for {config.n_layers} layers, "
        f"d_model={config.d_model}, d_ff={config.d_ff}, vocab_size={config.vocab_size}, "
        f"final_norm={config.final_norm}:\n  " + "\n  ".join(problems))


def _check_positions(pe: np.ndarray, config: EncoderConfig) -> None:
  pe = pe.reshape(pe.shape[-2:]) if pe.ndim == 3 and pe.shape[0] == 1 else pe
  if pe.ndim != 2 or pe.shape[1] != config.d_model:
    raise ValueError(
        f"state_dict[{PE_KEY!r}] has shape {pe.shape}, expected [1, max_len, {config.d_model}]")
  expected = sinusoidal_positions(pe.shape[0], config.d_model, np.float64)
  error = float(np.max(np.abs(pe.astype(np.float64) - expected)))
  if error > _PE_ATOL:
    raise ValueError(
        f"state_dict[{PE_KEY!r}] is not the interleaved sin/cos table of the paper "
        f"(max abs difference {error:.3g} > {_PE_ATOL}); this port cannot reproduce that model")


def from_torch_state_dict(state_dict: Mapping[str, Any], config: EncoderConfig,
                          layout: str | None = None, prefix: str | None = None) -> dict:
  """PyTorch state dict -> flax variables for `Encoder(config).apply(variables, tokens)`.

  Args:
    state_dict: names -> torch tensors or numpy arrays (e.g. from `load_torch_checkpoint`).
    config: the encoder's sizes (`config_from_torch_state_dict` reads them off the shapes);
      `param_dtype` is the dtype of the result, `scan_layers` its layer layout.
    layout: "tutorial" or "torch_nn" (see `flax_encoder.pytorch.layouts`); None detects it.
    prefix: None: `state_dict` is the encoder alone, key for key. A prefix such as
      "model.encoder." or "auto" selects the encoder inside a larger state dict (a model, a
      DistributedDataParallel or torch.compile wrapper); keys outside it are ignored and
      logged. See `layouts.find_encoder`.

  Returns:
    {'params': ...} nested dicts of numpy arrays in config.param_dtype.
  """
  found = find_encoder(state_dict, prefix, layout)
  layout = found.layout
  _check_keys(found.state, config, layout)
  state = {k: to_numpy(k, v) for k, v in found.state.items()}
  if PE_KEY in state:
    _check_positions(state[PE_KEY], config)
  cast = lambda x: np.asarray(x, dtype=config.param_dtype)
  dense = lambda w, b: {"kernel": cast(w.T), "bias": cast(b)}
  norm = lambda name: {"scale": cast(state[name + ".weight"]), "bias": cast(state[name + ".bias"])}

  params: dict = {"embedding": {"embedding": cast(state[EMBEDDING_KEY])}}
  for i in range(config.n_layers):
    at = f"layers.{i}."
    layer: dict = {"self_attn": {}, "feed_forward": {}}
    for (block, flax_name), torch_name in DENSE[layout].items():
      layer[block][flax_name] = dense(state[at + torch_name + ".weight"],
                                      state[at + torch_name + ".bias"])
    if layout == "torch_nn":
      w = np.split(state[at + IN_PROJ[0]], 3, axis=0)
      b = np.split(state[at + IN_PROJ[1]], 3, axis=0)
      for flax_name, row in _QKV:
        layer["self_attn"][flax_name] = dense(w[row], b[row])
    for name in NORMS:
      layer[name] = norm(at + name)
    params[f"layers_{i}"] = layer
  if config.final_norm:
    params["norm"] = norm("norm")
  if config.scan_layers:
    params = stack_layers(params, config.n_layers)
  return {"params": params}


def config_from_torch_state_dict(state_dict: Mapping[str, Any], n_heads: int,
                                 layout: str | None = None, prefix: str | None = None,
                                 **overrides) -> EncoderConfig:
  """The EncoderConfig of a PyTorch state dict, its sizes read off the shapes.

  vocab_size and d_model come from the embedding, d_ff from the first feed-forward layer,
  n_layers from the layer indices, max_len from `pos_encoder.pe` when present, final_norm from
  the presence of `norm.*`. The number of heads is not in the shapes, so it is an argument;
  what the weights cannot show (norm_position, activation, layer_norm_eps, dropout) keeps
  EncoderConfig's defaults, the tutorial port's, unless given in `overrides`.
  `prefix` and `layout` as in `from_torch_state_dict`.
  """
  found = find_encoder(state_dict, prefix, layout)
  state = found.state
  if EMBEDDING_KEY not in state:
    raise ValueError(f"state_dict has no {EMBEDDING_KEY!r}: cannot read vocab_size and d_model")
  vocab_size, d_model = (int(n) for n in np.shape(state[EMBEDDING_KEY]))
  indices = sorted({int(k.split(".")[1]) for k in state if k.startswith("layers.")})
  if not indices or indices != list(range(len(indices))):
    raise ValueError(f"state_dict's layers must be numbered 0, 1, …, got {indices}")
  w_1 = "layers.0." + DENSE[found.layout][("feed_forward", "w_1")] + ".weight"
  if w_1 not in state:
    raise ValueError(f"state_dict has no {w_1!r}: cannot read d_ff")
  sizes = dict(vocab_size=vocab_size, d_model=d_model, n_heads=n_heads,
               d_ff=int(np.shape(state[w_1])[0]), n_layers=len(indices),
               final_norm="norm.weight" in state)
  if PE_KEY in state:
    sizes["max_len"] = int(np.shape(state[PE_KEY])[-2])
  return EncoderConfig(**{**sizes, **overrides})


def _tree_to_numpy(tree):
  if isinstance(tree, Mapping):
    return {k: _tree_to_numpy(v) for k, v in tree.items()}
  return np.asarray(tree)


def to_torch_state_dict(variables: Mapping, config: EncoderConfig,
                        layout: str = "tutorial") -> dict:
  """Flax variables -> PyTorch state dict (torch tensors), the inverse of from_torch_state_dict.

  The tutorial layout includes `pos_encoder.pe` ([1, max_len, d_model] float32), so that the
  tutorial port loads it with `load_state_dict(strict=True)`.
  """
  check_layout(layout)
  if config.shared_layers or config.embedding_size:
    field = "shared_layers" if config.shared_layers else "embedding_size"
    raise ValueError(f"EncoderConfig.{field}: {getattr(config, field)!r}: layout {layout!r} has "
                     f"a table of d_model and a layer of its own at every depth (an ALBERT-style "
                     f"model exports with --layout hf)")
  params = nn.unbox(variables.get("params", variables))  # as `init` returns them, or plain
  if config.scan_layers:
    params = unstack_layers(params, config.n_layers)
  params = _tree_to_numpy(params)

  def tensor(x: np.ndarray):
    if x.dtype.name == "bfloat16":
      return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.array(x))  # a writable copy, owned by the tensor

  state = {EMBEDDING_KEY: tensor(params["embedding"]["embedding"])}
  if layout == "tutorial":
    table = sinusoidal_positions(config.max_len, config.d_model, np.float32)
    state[PE_KEY] = torch.from_numpy(table[None])
  for i in range(config.n_layers):
    layer, at = params[f"layers_{i}"], f"layers.{i}."
    for (block, flax_name), torch_name in DENSE[layout].items():
      state[at + torch_name + ".weight"] = tensor(layer[block][flax_name]["kernel"].T)
      state[at + torch_name + ".bias"] = tensor(layer[block][flax_name]["bias"])
    if layout == "torch_nn":
      attn = layer["self_attn"]
      state[at + IN_PROJ[0]] = tensor(
          np.concatenate([attn[name]["kernel"].T for name, _ in _QKV], axis=0))
      state[at + IN_PROJ[1]] = tensor(
          np.concatenate([attn[name]["bias"] for name, _ in _QKV], axis=0))
    for name in NORMS:
      state[at + name + ".weight"] = tensor(layer[name]["scale"])
      state[at + name + ".bias"] = tensor(layer[name]["bias"])
  if config.final_norm:
    state["norm.weight"] = tensor(params["norm"]["scale"])
    state["norm.bias"] = tensor(params["norm"]["bias"])
  return state


def load_torch_checkpoint(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """Reads a PyTorch state dict from one of CHECKPOINT_FILES: `.safetensors` or `.pt` / `.pth` /
  `.bin`.

  `.pt` files are read with `torch.load(weights_only=True)`, with no fallback: a pickle that
  needs anything beyond tensors and plain containers is refused, never run. A training
  checkpoint that holds its weights as {'model': …}, {'state_dict': …} or
  {'model_state_dict': …} beside other entries (optimizer, epoch) is unwrapped.

  Returns:
    names -> numpy arrays (bfloat16 tensors come back as float32, exactly). Integer buffers
    named `INDEX_BUFFERS` are left out; any other tensor that is not floating-point is a
    ValueError naming it.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"checkpoint path {path!r} does not exist or is not a file")
  return _checkpoint_file(path, None).read(path)


def save_torch_checkpoint(state_dict: Mapping[str, torch.Tensor], path: str | os.PathLike,
                          suffix: str | None = None) -> None:
  """Writes `state_dict` (`to_torch_state_dict`'s) to `path` as the one of CHECKPOINT_FILES
  `suffix` names, `path`'s own where None, so that `load_torch_checkpoint` and PyTorch read it.
  """
  path = os.fspath(path)
  _checkpoint_file(path, suffix).write(state_dict, path)


def _read_torch_save(path: str) -> dict[str, np.ndarray]:
  with open(path, "rb") as f:
    magic = f.read(4)
  # torch.save writes a zip archive; before PyTorch 1.6 a pickle (protocol >= 2: 0x80).
  if magic != b"PK\x03\x04" and magic[:1] != b"\x80":
    raise ValueError(f"checkpoint {path!r} is not a PyTorch checkpoint: neither a zip archive "
                     f"nor a pickle (it starts with {magic!r})")
  try:
    state = torch.load(path, map_location="cpu", weights_only=True)
  except pickle.UnpicklingError as e:
    raise ValueError(
        f"checkpoint {path!r} needs more than tensors to be unpickled, and loading it that way "
        f"could run arbitrary code; it was refused (torch.load weights_only=True). Save a "
        f"plain state_dict or a .safetensors file instead. Details: {e}") from e
  except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError) as e:
    raise ValueError(f"checkpoint {path!r} could not be read (truncated or corrupt?): "
                     f"{type(e).__name__}: {e}") from e
  state = _unwrap(state, path)
  weights = {}
  for name, value in state.items():
    if value.is_floating_point():
      weights[name] = to_numpy(name, value)
    elif not name.endswith(INDEX_BUFFERS):
      raise ValueError(f"checkpoint {path!r}: {name!r} holds {value.dtype} values, expected "
                       f"floating-point weights")
  return weights


def _write_safetensors(state_dict: Mapping[str, torch.Tensor], path: str) -> None:
  import safetensors.torch
  safetensors.torch.save_file({k: v.contiguous() for k, v in state_dict.items()}, path)


def _write_torch_save(state_dict: Mapping[str, torch.Tensor], path: str) -> None:
  torch.save(state_dict, path)


@dataclasses.dataclass(frozen=True)
class CheckpointFile:
  """A file of PyTorch weights: `read(path)` -> names -> numpy arrays, as
  `load_torch_checkpoint` returns them; `write(state_dict, path)`."""
  read: Callable[[str], dict[str, np.ndarray]]
  write: Callable[[Mapping[str, torch.Tensor], str], None]


# A file's suffix (lowercase) -> how its weights are read and written: a new one is an entry here.
CHECKPOINT_FILES = {
    ".safetensors": CheckpointFile(read_safetensors, _write_safetensors),  # numpy, as below
    ".pt": CheckpointFile(_read_torch_save, _write_torch_save),
    ".pth": CheckpointFile(_read_torch_save, _write_torch_save),
    ".bin": CheckpointFile(_read_torch_save, _write_torch_save),
}


def _checkpoint_file(path: str, suffix: str | None) -> CheckpointFile:
  suffix = (suffix or os.path.splitext(path)[1]).lower()
  if suffix not in CHECKPOINT_FILES:
    raise ValueError(f"checkpoint {path!r} has suffix {suffix!r}; expected "
                     f"{', '.join(CHECKPOINT_FILES)}")
  return CHECKPOINT_FILES[suffix]


def _unwrap(state: Any, path: str) -> Mapping[str, Any]:
  if isinstance(state, Mapping):
    for key in ("model", "state_dict", "model_state_dict"):
      if isinstance(state.get(key), Mapping):
        state = state[key]
        break
  if not isinstance(state, Mapping):
    raise ValueError(f"checkpoint {path!r} holds a {type(state).__name__}, expected a state "
                     f"dict of names to tensors")
  bad = [k for k, v in state.items() if not hasattr(v, "detach")]
  if bad:
    raise ValueError(f"checkpoint {path!r} holds non-tensor entries {bad[:10]}; expected a state "
                     f"dict of names to tensors")
  return state
