"""flax_encoder: the Transformer encoder of "Attention Is All You Need" in Flax linen.

Computes what the PyTorch tutorial port of the encoder computes (Post-LN, -1e9 mask fill,
LayerNorm eps 1e-5, embedding * sqrt(d_model), interleaved sinusoids). Importing it imports no
torch: the PyTorch bridge (weight conversion, the reference port, the parity report) is
`flax_encoder.pytorch`, behind the `torch` extra. Hugging Face directories (`load_hf`) are
`flax_encoder.families`, one module per family.

The names below load with their module on first use, so that a module that needs no JAX
(`flax_encoder.tokenizer`, imported by tokenizing worker processes) does not start it.
"""

import importlib

_MODULES = {
    "MultiHeadAttention": "attention",
    "ConfigError": "config", "EncoderConfig": "config",
    "Dropout": "dropout",
    "PositionalEncoding": "embedding", "sinusoidal_positions": "embedding",
    "Encoder": "encoder", "stack_layers": "encoder", "unstack_layers": "encoder",
    "HFError": "families", "load_hf": "families",
    "PositionwiseFeedForward": "feed_forward",
    "MaskedLMHead": "heads", "Pooler": "heads", "PredictionHead": "heads",
    "check_token_shape": "inputs", "check_token_values": "inputs", "checked_apply": "inputs",
    "EncoderLayer": "layer",
    "padding_mask": "masks",
    "segment_mask": "packing", "segment_positions": "packing",
    "MASK_FILL": "reference_attention", "scaled_dot_product_attention": "reference_attention",
}

__all__ = sorted(_MODULES)


def __getattr__(name):
  module = _MODULES.get(name)
  if module is None:
    raise AttributeError(f"module 'flax_encoder' has no attribute {name!r}")
  value = getattr(importlib.import_module(f"flax_encoder.{module}"), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_MODULES))
