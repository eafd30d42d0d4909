"""The PyTorch bridge: weights in and out, the reference PyTorch port, the parity report.

Needs the `torch` extra (`pip install 'flax-encoder[torch]'`).

    from flax_encoder.pytorch import (config_from_torch_state_dict, from_torch_state_dict,
                                      load_torch_checkpoint)
    state_dict = load_torch_checkpoint("model.pt")   # a state dict, or a training checkpoint
    config = config_from_torch_state_dict(state_dict, n_heads=8, prefix="auto")
    variables = from_torch_state_dict(state_dict, config, prefix="auto")

State-dict layouts ("tutorial": the PyTorch tutorial port's names; "torch_nn":
torch.nn.TransformerEncoderLayer's) and how the encoder is found inside a larger model are
described in `flax_encoder.pytorch.layouts`. The reference port is
`flax_encoder.pytorch.reference` (imports torch); the parity report, against that port, against
your own module or against transformers, is `python -m flax_encoder.pytorch.parity`. Hugging
Face directories are `flax_encoder.families`.

The names below load with their module on first use, so that importing the package imports no
torch.
"""

import importlib

_MODULES = {
    "config_from_torch_state_dict": "convert", "from_torch_state_dict": "convert",
    "load_torch_checkpoint": "convert", "save_torch_checkpoint": "convert",
    "to_torch_state_dict": "convert",
    "LAYOUTS": "layouts", "EncoderKeys": "layouts", "expected_shapes": "layouts",
    "find_encoder": "layouts",
}

__all__ = sorted(_MODULES)


def __getattr__(name):
  module = _MODULES.get(name)
  if module is None:
    raise AttributeError(f"module 'flax_encoder.pytorch' has no attribute {name!r}")
  value = getattr(importlib.import_module(f"flax_encoder.pytorch.{module}"), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_MODULES))
