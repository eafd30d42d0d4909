"""EncoderConfig: every size and switch of the encoder in one frozen dataclass."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

NORM_POSITIONS = ("post", "pre")
ACTIVATIONS = {
    "relu": jax.nn.relu,
    # PyTorch's nn.GELU default is the exact erf form; jax.nn.gelu defaults to the tanh one.
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
}
ATTENTION_IMPLS = ("reference", "xla", "cudnn")
REMAT_POLICIES = ("none", "full", "save_dots")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _canonical_dtype(field: str, value: Any) -> np.dtype:
  try:
    dtype = jnp.dtype(value)
  except TypeError:
    dtype = None
  if dtype is None or dtype.name not in FLOAT_DTYPES:
    raise ValueError(f"EncoderConfig.{field} must be one of {FLOAT_DTYPES}, got {value!r}")
  return dtype


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """Sizes and options of the Transformer encoder ("Attention Is All You Need", section 3.1)."""

  vocab_size: int
  d_model: int = 512
  n_heads: int = 8
  d_ff: int = 2048
  n_layers: int = 6
  dropout: float = 0.1  # on embeddings + positions and on each sub-layer's output
  attention_dropout: float = 0.0  # on the attention weights (the tutorial port has none)
  max_len: int = 5000
  pad_id: int = 0
  norm_position: str = "post"  # "post": the paper's Add & Norm; "pre": x + f(norm(x))
  final_norm: bool = True
  # PyTorch's LayerNorm uses eps=1e-5; Flax defaults to 1e-6.
  layer_norm_eps: float = 1e-5
  activation: str = "relu"
  dtype: Any = jnp.float32  # compute dtype
  param_dtype: Any = jnp.float32
  attention_impl: str = "reference"
  scan_layers: bool = False  # nn.scan over the layers: compile time independent of depth
  remat: str = "none"  # rematerialise each layer in the backward pass

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"EncoderConfig.{name} must be a positive integer, got {value!r}")
    if self.d_model % self.n_heads:
      raise ValueError(
          f"EncoderConfig.d_model must be divisible by n_heads, got d_model={self.d_model}, "
          f"n_heads={self.n_heads}")
    if self.d_model % 2:
      raise ValueError(
          f"EncoderConfig.d_model must be even (sin/cos pairs of the positional encoding), "
          f"got {self.d_model}")
    if not 0 <= self.pad_id < self.vocab_size:
      raise ValueError(
          f"EncoderConfig.pad_id must lie in [0, vocab_size={self.vocab_size}), got {self.pad_id}")
    for name in ("dropout", "attention_dropout"):
      value = getattr(self, name)
      if not 0.0 <= value < 1.0:
        raise ValueError(f"EncoderConfig.{name} must lie in [0, 1), got {value!r}")
    if not self.layer_norm_eps > 0:
      raise ValueError(f"EncoderConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
    for name, allowed in (("norm_position", NORM_POSITIONS), ("activation", tuple(ACTIVATIONS)),
                          ("attention_impl", ATTENTION_IMPLS), ("remat", REMAT_POLICIES)):
      value = getattr(self, name)
      if value not in allowed:
        raise ValueError(f"EncoderConfig.{name} must be one of {allowed}, got {value!r}")
    object.__setattr__(self, "dtype", _canonical_dtype("dtype", self.dtype))
    object.__setattr__(self, "param_dtype", _canonical_dtype("param_dtype", self.param_dtype))
    if self.attention_impl == "cudnn" and self.dtype.name not in ("bfloat16", "float16"):
      raise ValueError(
          "EncoderConfig.attention_impl='cudnn' (cuDNN flash attention) needs dtype bfloat16 or "
          f"float16, got dtype={self.dtype.name}; use attention_impl='xla' for {self.dtype.name}")
    if self.attention_impl != "reference" and self.attention_dropout > 0:
      raise ValueError(
          f"EncoderConfig.attention_dropout={self.attention_dropout} needs "
          f"attention_impl='reference'; jax.nn.dot_product_attention "
          f"('{self.attention_impl}') has no dropout on the weights")

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads

  @classmethod
  def base(cls, vocab_size: int, **overrides) -> EncoderConfig:
    """The paper's base model: d_model 512, 8 heads, d_ff 2048, 6 layers, dropout 0.1."""
    return cls(vocab_size=vocab_size, **overrides)

  @classmethod
  def big(cls, vocab_size: int, **overrides) -> EncoderConfig:
    """The paper's big model: d_model 1024, 16 heads, d_ff 4096, 6 layers, dropout 0.3."""
    sizes = dict(d_model=1024, n_heads=16, d_ff=4096, n_layers=6, dropout=0.3)
    return cls(vocab_size=vocab_size, **{**sizes, **overrides})
