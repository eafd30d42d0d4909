"""Positions: the paper's sinusoidal encoding (section 3.5), and a learned bias on the
attention scores by relative position (T5's buckets, MPNet's bias).

Shapes: b = batch, q = query positions, k = key positions, h = heads.
"""

from __future__ import annotations

import functools
import math
from typing import Any

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


# T5's and MPNet's: distances from this on share one direction's farthest bucket.
RELATIVE_MAX_DISTANCE = 128


@functools.cache
def _distance_buckets(half: int) -> np.ndarray:
  """The bucket of each distance d = 0 … RELATIVE_MAX_DISTANCE among one direction's `half`
  buckets, as T5 has it: the first `exact` = half // 2 distances one bucket each, then bucket
  exact + floor(spread * log(d / exact) / log(max / exact)), at most half - 1. The floor is
  found by comparing powers of integers, so no rounding of the logarithms moves a distance on
  a boundary (16, 32, 64 with 32 buckets) to the bucket below."""
  exact, spread, far = half // 2, half - half // 2, RELATIVE_MAX_DISTANCE
  buckets = list(range(exact))
  for d in range(exact, far + 1):
    k = 0  # the largest k < spread with (far / exact)^k <= (d / exact)^spread
    while k + 1 < spread and far**(k + 1) * exact**spread <= d**spread * exact**(k + 1):
      k += 1
    buckets.append(exact + k)
  return np.asarray(buckets, np.int32)


def relative_buckets(relative: jax.Array, buckets: int) -> jax.Array:
  """T5's bidirectional bucket (MPNet's) of each relative position, key - query: keys before
  the query in [0, buckets / 2), keys after it in [buckets / 2, buckets)."""
  half = buckets // 2
  distance = jnp.minimum(jnp.abs(relative), RELATIVE_MAX_DISTANCE)
  return jnp.where(relative > 0, half, 0) + jnp.asarray(_distance_buckets(half))[distance]


class RelativePositionBias(nn.Module):
  """A learned score per head for each bucket of relative position (`relative_buckets`), to
  add to every layer's attention scores: MPNet's encoder computes it once for all its layers."""

  buckets: int
  n_heads: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, positions: jax.Array) -> jax.Array:
    """positions: int [b or 1, seq], each token's position in its sequence -> the bias
    [b or 1, h, q, k] in `dtype`."""
    table = self.param("embedding", nn.with_logical_partitioning(
        nn.initializers.normal(stddev=0.02), (None, None)), (self.buckets, self.n_heads),
                       self.param_dtype)
    relative = positions[:, None, :] - positions[:, :, None]  # [b, q, k]
    bias = jnp.asarray(table, self.dtype)[relative_buckets(relative, self.buckets)]
    return jnp.transpose(bias, (0, 3, 1, 2))  # [b, q, k, h] -> [b, h, q, k]
