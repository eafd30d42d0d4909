"""Dropout as PyTorch computes it (x * keep / (1 - rate)), with a cheaper mask.

`flax.linen.Dropout` draws a full threefry block (two 32-bit words) per element and lets XLA
re-derive the mask from those words in every fusion of the backward pass that needs it. Here
each 32-bit word gives two elements 16 bits each, and the backward pass reads the saved mask
(BENCHMARKS.md measures the difference).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def keep_mask(rng: jax.Array, rate: float, shape: tuple[int, ...]) -> jax.Array:
  """bool mask of `shape`, True with probability 1 - round(rate * 65536) / 65536.

  16 random bits per element: the drop probability is `rate` rounded to a multiple of 2^-16
  (0.1 becomes 0.100006). A last axis of odd length falls back to `jax.random.bernoulli`.
  """
  if not shape or shape[-1] % 2:
    return jax.random.bernoulli(rng, 1.0 - rate, shape)
  words = jax.random.bits(rng, (*shape[:-1], shape[-1] // 2), jnp.uint32)
  # The low halves fill the first half of the last axis, the high halves the second, so the
  # split is a broadcast and a reshape that XLA fuses, not an interleaving copy.
  shifts = jnp.array([[0], [16]], jnp.uint32)
  halves = ((words[..., None, :] >> shifts) & 0xFFFF).reshape(shape)
  return halves >= jnp.uint32(round(rate * 65536))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def apply_mask(x: jax.Array, keep: jax.Array, scale: float) -> jax.Array:
  """x * scale where keep, else 0; the backward pass masks with the saved `keep`."""
  return jnp.where(keep, x * scale, 0).astype(x.dtype)


def _apply_mask_fwd(x, keep, scale):
  return apply_mask(x, keep, scale), keep


def _apply_mask_bwd(scale, keep, g):
  return apply_mask(g, keep, scale), np.zeros(keep.shape, jax.dtypes.float0)


apply_mask.defvjp(_apply_mask_fwd, _apply_mask_bwd)


class Dropout(nn.Module):
  """`flax.linen.Dropout`'s interface: draws from the 'dropout' rng unless deterministic."""

  rate: float

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    if deterministic or self.rate == 0.0:
      return x
    keep = keep_mask(self.make_rng("dropout"), self.rate, x.shape)
    return apply_mask(x, keep, 1.0 / (1.0 - self.rate))
