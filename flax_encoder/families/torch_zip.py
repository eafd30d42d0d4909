"""The state dict `torch.save` writes (its zip format, PyTorch 1.6 and later: what transformers
saves as pytorch_model.bin), read into numpy without torch.

The archive holds `data.pkl`, a pickle of the dict whose tensors refer to storages, and each
storage's raw bytes under `data/`. The pickle is read by an unpickler that knows only what a
state dict of tensors needs (`torch._utils._rebuild_tensor_v2`, the storage types, an
OrderedDict); any other global is refused, never imported or run, as torch.load's
weights_only=True refuses it.
"""

from __future__ import annotations

import collections
import pickle
import zipfile

import ml_dtypes
import numpy as np

# torch's storage types -> the numpy dtype of their bytes
STORAGES = {"FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
            "BFloat16Storage": ml_dtypes.bfloat16, "LongStorage": np.int64,
            "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8,
            "ByteStorage": np.uint8, "BoolStorage": np.bool_}


class TorchZipError(ValueError):
  """A file that is no state dict of tensors in torch.save's zip format."""


def _tensor(storage, offset, size, stride, *_):
  """torch._utils._rebuild_tensor_v2: the view of `storage` (a flat array) a tensor is."""
  view = np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(size),
                                         strides=tuple(s * storage.itemsize for s in stride))
  return np.array(view)


def _parameter(data, *_):
  """torch._utils._rebuild_parameter: a parameter is its tensor."""
  return data


class _Unpickler(pickle.Unpickler):

  def __init__(self, file, archive: zipfile.ZipFile, root: str):
    super().__init__(file)
    self.archive, self.root = archive, root

  def find_class(self, module: str, name: str):
    if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
      return _tensor
    if (module, name) == ("torch._utils", "_rebuild_parameter"):
      return _parameter
    if (module, name) == ("collections", "OrderedDict"):
      return collections.OrderedDict
    if module == "torch" and name in STORAGES:
      return np.dtype(STORAGES[name])
    raise pickle.UnpicklingError(f"{module}.{name} (a state dict holds tensors only)")

  def persistent_load(self, pid):
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
      raise pickle.UnpicklingError(f"persistent id {pid!r}, expected a storage")
    _, dtype, key, _, numel = pid
    data = np.frombuffer(self.archive.read(f"{self.root}/data/{key}"), dtype=dtype)
    if data.size != numel:
      raise pickle.UnpicklingError(f"storage {key} holds {data.size} values, expected {numel}")
    return data


def read_torch_zip(file: str) -> dict[str, np.ndarray]:
  """name -> numpy array of the state dict in `file` (bfloat16 kept as ml_dtypes.bfloat16);
  TorchZipError, one line naming what is wrong, for anything else."""
  try:
    with zipfile.ZipFile(file) as archive:
      pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
      if len(pickles) != 1:
        raise TorchZipError(f"{file}: holds {len(pickles)} data.pkl, expected one (torch.save's "
                            f"zip format)")
      root = pickles[0][:-len("/data.pkl")]
      order = f"{root}/byteorder"
      if order in archive.namelist() and archive.read(order).strip() != b"little":
        raise TorchZipError(f"{file}: big-endian tensors, expected little-endian ones")
      with archive.open(pickles[0]) as f:
        state = _Unpickler(f, archive, root).load()
  except zipfile.BadZipFile:
    raise TorchZipError(f"{file}: not a zip archive (torch.save's format since PyTorch 1.6); "
                        f"read it with torch (flax_encoder.pytorch) or save it as "
                        f".safetensors") from None
  except (pickle.UnpicklingError, EOFError, KeyError, ValueError, TypeError) as e:
    if isinstance(e, TorchZipError):
      raise
    raise TorchZipError(f"{file}: not a state dict of tensors: {str(e).splitlines()[0]}"
                        ) from None
  if not isinstance(state, dict) or not all(isinstance(v, np.ndarray) for v in state.values()):
    raise TorchZipError(f"{file}: holds a {type(state).__name__}, expected a state dict of "
                        f"names to tensors")
  return dict(state)
