"""Pooling: the token states of packed rows to one vector for each text, each text pooled as
sentence-transformers' Pooling module pools it alone. The modes are sentence-transformers'
names (its Pooling config's), and this is their one implementation: the sentence encoders
(`flax_encoder.embeddings`), the classifiers' heads (`flax_encoder.classifier`, whose
poolings name the mode they start from) and training all pool here.

    pooled, present = pool(("mean",), hidden, segment_ids, positions, segments)

Shapes: r = rows, s = ids of a row, d = width.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from flax_encoder.masks import text_tokens

MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")


def pool(modes: Sequence[str], hidden: jax.Array, segment_ids: jax.Array, positions: jax.Array,
         segments: int, pool_from: jax.Array | int = 0) -> tuple[jax.Array, jax.Array]:
  """[r, s, d] -> ([r * segments, len(modes) * d] float32, bool [r * segments]: whether the row
  has that segment), each segment pooled as sentence-transformers pools a text alone.

  A segment whose ids are all left out (`pool_from`) pools as sentence-transformers' text
  whose mask is all zeros: mean 0, max -inf, cls its first id, lasttoken 0."""
  rows, length, width = hidden.shape
  slots = rows * segments  # segment j + 1 of row i is slot i * segments + j
  x = hidden.astype(jnp.float32).reshape(rows * length, width)
  real = (segment_ids > 0) & (segment_ids <= segments)
  slot = jnp.where(real, jnp.arange(rows)[:, None] * segments + segment_ids - 1, slots)
  pooled = (real & (positions >= pool_from)).reshape(-1)
  slot, index = slot.reshape(-1), jnp.arange(rows * length)
  # the ids a segment does not pool go to one slot past the rest, dropped after
  pooled_slot = jnp.where(pooled, slot, slots)

  def over(values, reduce, where=pooled_slot):
    return reduce(values, where, num_segments=slots + 1)[:slots]

  count = over(pooled.astype(jnp.float32), jax.ops.segment_sum)[:, None]
  present = over(jnp.ones(rows * length), jax.ops.segment_sum, slot) > 0
  out = []
  for mode in modes:
    if mode in ("mean", "mean_sqrt_len_tokens"):
      total = over(x, jax.ops.segment_sum)
      denominator = jnp.maximum(count, 1e-9)
      out.append(total / (denominator if mode == "mean" else jnp.sqrt(denominator)))
    elif mode == "weightedmean":  # weights 1, 2, … from each text's first id
      weights = (positions.reshape(-1, 1) + 1).astype(jnp.float32)
      total = over(x * weights, jax.ops.segment_sum)
      out.append(total / jnp.maximum(over(weights, jax.ops.segment_sum), 1e-9))
    elif mode == "max":
      out.append(over(x, jax.ops.segment_max))
    elif mode == "cls":  # its first pooled id; its first id where it pools none
      first = over(index, jax.ops.segment_min)
      first = jnp.where(count[:, 0] > 0, first, over(index, jax.ops.segment_min, slot))
      out.append(x[jnp.clip(first, 0, rows * length - 1)])
    elif mode == "lasttoken":  # its last pooled id; zeros where it pools none
      last = over(index, jax.ops.segment_max)
      out.append(jnp.where(count > 0, x[jnp.clip(last, 0, rows * length - 1)], 0))
    else:
      raise ValueError(f"pooling mode {mode!r}, expected one of {MODES}")
  return jnp.concatenate(out, axis=-1), present


def one_text_a_row(tokens: jax.Array, pad_id: int) -> tuple[jax.Array, jax.Array]:
  """(segment ids, positions) of padded rows of a text each (int [r, s]): the run of `pad_id`
  that ends a row is padding (segment 0), the ids before it the row's one text (segment 1, a
  pad_id among them included), at their index."""
  segment_ids = text_tokens(tokens, pad_id).astype(jnp.int32)
  return segment_ids, jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
