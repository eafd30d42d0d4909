"""A .safetensors file as numpy arrays, read (`read_safetensors`) and written
(`write_safetensors`) without torch; `read_safetensors` gives what
`flax_encoder.families.load_hf` and `flax_encoder.pytorch.load_torch_checkpoint` return for
one. safetensors comes with the `hf` extra (and the `torch` one); it is imported on the first
read, so that importing the library imports neither it nor torch."""

from __future__ import annotations

import os

import numpy as np

from flax_encoder.families.tensors import INDEX_BUFFERS


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """names -> numpy arrays of the .safetensors file `path`; float16 as it is, bfloat16 (and
  float8) as float32, exactly. Integer buffers named `INDEX_BUFFERS` are left out; any other
  tensor that is not floating-point is a ValueError naming it."""
  import safetensors
  import safetensors.numpy

  path = os.fspath(path)
  try:
    state = safetensors.numpy.load_file(path)
  except (safetensors.SafetensorError, OSError, RuntimeError) as e:
    raise ValueError(f"checkpoint {path!r} is not a readable safetensors file (truncated or "
                     f"corrupt?): {e}") from e
  return floating_weights(state, path)


def floating_weights(state: dict[str, np.ndarray], path: str) -> dict[str, np.ndarray]:
  """The weights of the state dict read from `path`: float16 as it is, bfloat16 (and float8)
  as float32, exactly; integer buffers named `INDEX_BUFFERS` left out; any other tensor that
  is not floating-point a ValueError naming it."""
  weights = {}
  for name, value in state.items():
    if np.issubdtype(value.dtype, np.floating):
      weights[name] = value
    elif value.dtype.name.startswith(("bfloat", "float")):  # ml_dtypes': numpy has none
      weights[name] = value.astype(np.float32)
    elif not name.endswith(INDEX_BUFFERS):
      # The dtype as torch names it, as the reader of .bin files says it.
      raise ValueError(f"checkpoint {path!r}: {name!r} holds torch.{value.dtype.name} values, "
                       f"expected floating-point weights")
  return weights


def write_safetensors(path: str | os.PathLike, state: dict[str, np.ndarray]) -> None:
  """Writes names -> numpy arrays to the .safetensors file `path` as torch reads them back."""
  import safetensors.numpy

  # contiguous: safetensors writes an array's buffer as it lies (a transposed view's too)
  safetensors.numpy.save_file({k: np.ascontiguousarray(v) for k, v in state.items()},
                              os.fspath(path), metadata={"format": "pt"})
