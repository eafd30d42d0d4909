"""Sliding-window attention (ModernBERT's local layers): the window as a mask, and computed
block by block from one int per token, without any [seq, seq] array.

Shapes: b = batch, n = blocks, q = query positions, k = key positions, h = heads,
d = head_dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def local_window(q_len: int, k_len: int, width: int) -> jax.Array:
  """bool [1, 1, q_len, k_len]: True where the query and key are at most width / 2 apart."""
  distance = np.abs(np.arange(q_len)[:, None] - np.arange(k_len)[None, :])
  return jnp.asarray(distance <= width // 2)[None, None]


def windowed_attention(query: jax.Array, key: jax.Array, value: jax.Array, ids: jax.Array,
                       width: int) -> jax.Array:
  """Self-attention in which a token sees the keys at most width / 2 positions away, computed
  block by block so that no [seq, seq] array is ever built: time and memory grow linearly with
  the sequence. The sequence is cut into blocks of width / 2 positions; the queries of a block
  meet the keys of that block and of its two neighbours, all that their window can reach.

  The numbers are those of the full-mask path (`fused_attention` with `ids_mask(ids) &
  local_window(...)`), including a query that may attend to nothing: it gets the mean of all
  the values, as a softmax over equal masked scores gives it there.

  Args:
    query, key, value: [batch, seq, heads, head_dim].
    ids: int [batch, seq] from `packing.attention_ids` (segments and padding).
    width: the window, config.local_attention.

  Returns:
    [batch, seq, heads, head_dim].
  """
  batch, seq, heads, head_dim = query.shape
  half = width // 2
  block = max(half, 1)
  n = -(-seq // block)
  extra = n * block - seq

  def blocks(x, before, after, fill=0):
    widths = [(0, 0)] * x.ndim
    widths[1] = (before, after)
    x = jnp.pad(x, widths, constant_values=fill)
    return x.reshape(batch, -1, block, *x.shape[2:])

  def neighbours(x):  # [batch, n + 2, block, ...] -> [batch, n, 3 * block, ...]
    return jnp.concatenate([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)

  q = blocks(query, 0, extra)
  k, v = (neighbours(blocks(x, block, extra + block)) for x in (key, value))
  query_ids = jnp.abs(blocks(ids, 0, extra))[..., None]  # [batch, n, block, 1]
  key_ids = neighbours(blocks(ids, block, extra + block))[:, :, None, :]  # 0 past the ends
  # Query a of a block sits at block + a among its 3 * block keys.
  offset = block + np.arange(block)[:, None] - np.arange(3 * block)[None, :]
  allowed = (key_ids > 0) & (key_ids == query_ids) & (np.abs(offset) <= half)

  precision = jnp.promote_types(query.dtype, jnp.float32)
  logits = jnp.einsum("bnqhd,bnkhd->bnhqk", q, k, preferred_element_type=precision)
  logits = logits / np.sqrt(head_dim).astype(precision)
  logits = jnp.where(allowed[:, :, None], logits, -0.7 * jnp.finfo(precision).max)
  weights = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
  out = jnp.einsum("bnhqk,bnkhd->bnqhd", weights, v, preferred_element_type=precision)
  out = out.reshape(batch, n * block, heads, head_dim)[:, :seq]
  # A query that may attend to nothing: the mean of every value, as on the full-mask path.
  nothing = ~allowed.any(-1).reshape(batch, n * block)[:, :seq, None, None]
  mean = jnp.mean(value.astype(precision), axis=1, keepdims=True)
  return jnp.where(nothing, mean, out).astype(value.dtype)
