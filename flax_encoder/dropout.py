"""Dropout as PyTorch computes it (x * keep / (1 - rate)), with a cheaper mask.

`flax.linen.Dropout` draws a full threefry block (two 32-bit words) per element and lets XLA
re-derive the mask from those words in every fusion of the backward pass that needs it. Here
each 32-bit word gives two elements 16 bits each, and the backward pass reads the saved mask
(BENCHMARKS.md measures the difference).

The words are those `jax.random.bits` draws from a threefry key, counters and all, so a mask
splits over a mesh as jax's does and is the same on any number of devices. Only threefry's
rounds are written out here (`random_words`): jax emits them on the CPU as a loop of five
steps, each a pass over the whole array of words, where XLA:CPU fuses the written-out rounds
into one.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


# Threefry-2x32's rotations, one set for each group of four rounds in turn, and the constant
# of its third key word (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", 2011).
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KEY_PARITY = 0x1BD11BDA


def random_words(rng: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """`jax.random.bits(rng, shape, jnp.uint32)` for a threefry key (JAX's partitionable
  counters: one hash of (0, i) for the i-th word), its twenty rounds written out. Other keys,
  and arrays of 2^32 words or more, go to `jax.random.bits`."""
  typed = jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)
  impl = (str(jax.random.key_impl(rng)) if typed
          else getattr(jax.config, "jax_default_prng_impl", "threefry2x32"))
  # Read, never set: jax's own options (a JAX without the option counts as partitionable).
  partitionable = getattr(jax.config, "jax_threefry_partitionable", True)
  if "threefry" not in impl or math.prod(shape) >= 1 << 32 or not partitionable:
    return jax.random.bits(rng, shape, jnp.uint32)
  k0, k1 = jax.random.key_data(rng) if typed else rng
  keys = (k0, k1, k0 ^ k1 ^ jnp.uint32(_KEY_PARITY))
  # Each word's index from one iota per axis, which the SPMD partitioner splits as it splits
  # the array.
  strides = [math.prod(shape[axis + 1:]) for axis in range(len(shape))]
  index = sum((jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
               for axis, stride in enumerate(strides)), jnp.zeros(shape, jnp.uint32))
  x0, x1 = keys[0] + jnp.zeros(shape, jnp.uint32), index + keys[1]  # the counter (0, index)
  for group in range(5):
    for rotation in _ROTATIONS[group % 2]:
      x0 = x0 + x1
      x1 = x0 ^ ((x1 << rotation) | (x1 >> (32 - rotation)))
    x0 = x0 + keys[(group + 1) % 3]
    x1 = x1 + keys[(group + 2) % 3] + jnp.uint32(group + 1)
  return x0 ^ x1


def keep_mask(rng: jax.Array, rate: float, shape: tuple[int, ...]) -> jax.Array:
  """bool mask of `shape`, True with probability 1 - round(rate * 65536) / 65536.

  16 random bits per element: the drop probability is `rate` rounded to a multiple of 2^-16
  (0.1 becomes 0.100006). A last axis of odd length falls back to `jax.random.bernoulli`.
  """
  if not shape or shape[-1] % 2:
    return jax.random.bernoulli(rng, 1.0 - rate, shape)
  words = random_words(rng, (*shape[:-1], shape[-1] // 2))
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
