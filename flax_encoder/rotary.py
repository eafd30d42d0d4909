"""Rotary positions (RoFormer): each head's queries and keys turned by their position, the
halves of head_dim paired as transformers pairs them (ModernBERT's positions)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def rotary_angles(max_len: int, head_dim: int, theta: float) -> np.ndarray:
  """float64 [max_len, head_dim / 2]: position p times theta^(-2i / head_dim), the angle by
  which rotary positions turn pair i at p (computed in float64, rounded once where used)."""
  inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  return np.arange(max_len, dtype=np.float64)[:, None] * inv_freq


def rotate(x: jax.Array, positions: jax.Array, theta: float, max_len: int) -> jax.Array:
  """x [batch, seq, heads, head_dim] turned by rotary positions (`positions` int [batch,
  seq]): x * cos + rotate_half(x) * sin, the halves of head_dim paired as transformers pairs
  them; in at least float32, returned in x's dtype."""
  dtype = jnp.promote_types(x.dtype, jnp.float32)
  angles = rotary_angles(max_len, x.shape[-1], theta)
  cos, sin = (jnp.asarray(np.concatenate([f(angles)] * 2, -1), dtype) for f in (np.cos, np.sin))
  take = lambda table: jnp.take(table, positions, axis=0, mode="fill",
                                fill_value=jnp.nan)[:, :, None, :]
  x32 = x.astype(dtype)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
  return (x32 * take(cos) + rotated * take(sin)).astype(x.dtype)
