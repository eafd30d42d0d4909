"""Positions: the paper's sinusoidal encoding (section 3.5) and a learned table of positions.
A bias by relative position is a part a family brings (flax_encoder.relative).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def sinusoidal_positions(max_len: int, d_model: int, dtype=np.float32) -> np.ndarray:
  """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...), interleaved.

  Computed in float64 and rounded once to `dtype`, so the table is exact to `dtype`'s precision
  even at large positions (a float32 computation is off by up to ~pos * 6e-8).

  Returns:
    [max_len, d_model] numpy array.
  """
  if d_model % 2:
    raise ValueError(f"d_model must be even for sin/cos pairs, got {d_model}")
  position = np.arange(max_len, dtype=np.float64)[:, None]
  inv_freq = np.exp(np.arange(0, d_model, 2, dtype=np.float64) * (-math.log(10000.0) / d_model))
  table = np.empty((max_len, d_model), dtype=np.float64)
  table[:, 0::2] = np.sin(position * inv_freq)
  table[:, 1::2] = np.cos(position * inv_freq)
  return table.astype(dtype)


class PositionalEncoding(nn.Module):
  """Adds the fixed sinusoid table to [batch, seq, d_model] inputs; it has no parameters."""

  max_len: int
  d_model: int

  def __call__(self, x: jax.Array, positions: jax.Array | None = None) -> jax.Array:
    """`positions`: int [batch, seq], the row of the table each token gets (default: its index,
    0 … seq - 1); each must lie in [0, max_len)."""
    seq = x.shape[1]
    if seq > self.max_len:
      raise ValueError(f"sequence length {seq} exceeds max_len={self.max_len}")
    if positions is None:
      table = sinusoidal_positions(seq, self.d_model, np.float64)
      return x + jnp.asarray(table, dtype=x.dtype)[None]
    table = jnp.asarray(sinusoidal_positions(self.max_len, self.d_model, np.float64), x.dtype)
    # An index past the table reads NaN (mode="fill"), never a clamped, plausible row; so does
    # a negative one, which `take` would count back from the table's end.
    positions = jnp.where(positions < 0, self.max_len, positions)
    return x + jnp.take(table, positions, axis=0, mode="fill", fill_value=jnp.nan)
