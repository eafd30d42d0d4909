"""PyTorch checkpoint files (`torch.save`'s .pt, .pth, .bin) read into numpy without running
their pickles: `load_torch_checkpoint`, which flax_encoder.families reads pytorch_model.bin
with and flax_encoder.pytorch offers. torch is imported only when such a file is read."""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from typing import Any

import numpy as np

from flax_encoder.families.safetensors_file import read_safetensors
from flax_encoder.families.tensors import INDEX_BUFFERS, to_numpy

_TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def load_torch_checkpoint(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """Reads a PyTorch state dict from `.safetensors` or `.pt` / `.pth` / `.bin`.

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
  suffix = os.path.splitext(path)[1].lower()
  if suffix == ".safetensors":
    return read_safetensors(path)  # numpy, as below
  if suffix in _TORCH_SUFFIXES:
    with open(path, "rb") as f:
      magic = f.read(4)
    # torch.save writes a zip archive; before PyTorch 1.6 a pickle (protocol >= 2: 0x80).
    if magic != b"PK\x03\x04" and magic[:1] != b"\x80":
      raise ValueError(f"checkpoint {path!r} is not a PyTorch checkpoint: neither a zip archive "
                       f"nor a pickle (it starts with {magic!r})")
    try:
      import torch  # only here: the families read .safetensors without it
      state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
      raise ValueError(
          f"checkpoint {path!r} needs more than tensors to be unpickled, and loading it that way "
          f"could run arbitrary code; it was refused (torch.load weights_only=True). Save a "
          f"plain state_dict or a .safetensors file instead. Details: {e}") from e
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError) as e:
      raise ValueError(f"checkpoint {path!r} could not be read (truncated or corrupt?): "
                       f"{type(e).__name__}: {e}") from e
  else:
    raise ValueError(f"checkpoint {path!r} has suffix {suffix!r}; expected .safetensors, "
                     f"{', '.join(_TORCH_SUFFIXES)}")
  state = _unwrap(state, path)
  weights = {}
  for name, value in state.items():
    if value.is_floating_point():
      weights[name] = to_numpy(name, value)
    elif not name.endswith(INDEX_BUFFERS):
      raise ValueError(f"checkpoint {path!r}: {name!r} holds {value.dtype} values, expected "
                       f"floating-point weights")
  return weights


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
