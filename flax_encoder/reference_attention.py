"""The reference attention: softmax(q k^T / sqrt(d) + bias masked) v written out in einsums,
with dropout on the weights and a hand-written backward pass (paper section 3.2.1).

Shapes: b = batch, q = query positions, k = key positions, h = heads, d = head_dim.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder.dropout import apply_mask, keep_mask

# The PyTorch tutorial port fills masked scores with -1e9 (`masked_fill(mask == 0, -1e9)`), not
# -inf, so a row whose keys are all masked averages the values instead of producing NaN.
MASK_FILL = -1e9


def scaled_dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array | None = None,
    *,
    bias: jax.Array | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """softmax(q k^T / sqrt(d) + bias masked) v, the reference einsum implementation.

  Args:
    query: [batch, q, heads, head_dim].
    key: [batch, k, heads, head_dim].
    value: [batch, k, heads, head_dim].
    mask: bool, True = attend, broadcastable to [batch, heads, q, k].
    bias: float [batch or 1, heads, q, k], added to the scaled scores (MPNet's relative
      positions); it gets a gradient.
    dropout_rate: dropout on the attention weights; needs `dropout_rng` when > 0.
    dropout_rng: PRNG key for that dropout.

  Returns:
    (output [batch, q, heads, head_dim], weights [batch, heads, q, k]). The weights are the
    softmax before dropout.
  """
  if bias is not None and bias.ndim != 4:
    raise ValueError(f"bias: shape {tuple(bias.shape)}, expected [batch or 1, heads, q, k]")
  keep = None
  if dropout_rate > 0.0:
    if dropout_rng is None:
      raise ValueError("dropout_rng is needed when dropout_rate > 0")
    batch, q_len, heads, _ = query.shape
    keep = keep_mask(dropout_rng, dropout_rate, (batch, heads, q_len, key.shape[1]))
  return _attention(query, key, value, bias, mask, keep, dropout_rate)


def _heads_first(x):
  """[b, q, h, d] <-> [b, h, q, d]."""
  return jnp.swapaxes(x, 1, 2)


def _softmax_weights(q, k, bias, mask):
  """softmax of the masked scores q k^T + bias; q, k heads-first, q already scaled by
  1/sqrt(d)."""
  scores = jnp.einsum("bhqd,bhkd->bhqk", q, k)
  # Softmax in at least float32: bf16 scores lose the small weights otherwise.
  scores = scores.astype(jnp.promote_types(scores.dtype, jnp.float32))
  if bias is not None:
    scores = scores + bias.astype(scores.dtype)
  if mask is not None:
    scores = jnp.where(mask, scores, MASK_FILL)
  return jax.nn.softmax(scores, axis=-1).astype(q.dtype)


def _dropout(x, keep, rate):
  return x if keep is None else apply_mask(x, keep, 1.0 / (1.0 - rate))


# Attention has a hand-written backward pass: the softmax gradient P * (dP - rowsum(P * dP))
# uses rowsum(P * dP) = rowsum(dO * O), a reduction over head_dim instead of over all keys, as
# flash attention's backward does. This holds with dropout on the weights too: then O is
# dropout(P) V, and rowsum(P * dropout'(dP_dropped)) = rowsum(dropout(P) * dP_dropped) =
# rowsum(dO * O). Autodiff's version reduces dP over the keys inside the fusion that computes
# dP, which XLA:CPU ran ~20x slower than the matmul alone at 512 positions.
#
# Inside, q, k and v are heads-first with the 1/sqrt(d) scale applied to q, so every product is
# a plain batched matmul over [batch, heads] and no [b, h, q, k] array is scaled. The returned
# weights' cotangent is a symbolic zero unless something differentiates through them (the sown
# intermediates usually are not), and then its terms are skipped.
@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _attention(query, key, value, bias, mask, keep, rate):
  return _attention_fwd_impl(query, key, value, bias, mask, keep, rate)[0]


def _attention_fwd_impl(query, key, value, bias, mask, keep, rate):
  scale = 1.0 / math.sqrt(query.shape[-1])
  q, k, v = _heads_first(query) * scale, _heads_first(key), _heads_first(value)
  weights = _softmax_weights(q, k, bias, mask)
  out = jnp.einsum("bhqk,bhkd->bhqd", _dropout(weights, keep, rate), v)
  return (_heads_first(out), weights), (q, k, v, bias, mask, keep, out, weights)


def _attention_fwd(query, key, value, bias, mask, keep, rate):
  primal = lambda x: None if x is None else x.value
  return _attention_fwd_impl(*map(primal, (query, key, value, bias, mask, keep)), rate)


def _attention_bwd(rate, residuals, cotangents):
  q, k, v, bias, mask, keep, out, weights = residuals
  d_out, d_weights_direct = cotangents  # the second: from uses of the returned weights
  direct = not isinstance(d_weights_direct, jax.custom_derivatives.SymbolicZero)
  f32 = jnp.promote_types(weights.dtype, jnp.float32)
  if isinstance(d_out, jax.custom_derivatives.SymbolicZero):
    d_out = jnp.zeros(out.shape, out.dtype)
  else:
    d_out = _heads_first(d_out)
  d_v = jnp.einsum("bhqk,bhqd->bhkd", _dropout(weights, keep, rate), d_out)
  d_weights = _dropout(jnp.einsum("bhqd,bhkd->bhqk", d_out, v), keep, rate).astype(f32)
  row = jnp.sum(d_out.astype(f32) * out.astype(f32), -1, keepdims=True)
  if direct:
    d_weights = d_weights + d_weights_direct.astype(f32)
    row = row + jnp.sum(weights.astype(f32) * d_weights_direct.astype(f32), -1, keepdims=True)
  d_scores = weights.astype(f32) * (d_weights - row)
  if mask is not None:
    d_scores = jnp.where(mask, d_scores, 0.0)  # the -1e9 fill is a constant
  d_bias = None if bias is None else _sum_to(d_scores, bias.shape).astype(bias.dtype)
  d_scores = d_scores.astype(q.dtype)
  scale = 1.0 / math.sqrt(q.shape[-1])
  d_q = jnp.einsum("bhqk,bhkd->bhqd", d_scores, k) * scale
  d_k = jnp.einsum("bhqk,bhqd->bhkd", d_scores, q)  # q carries the scale already
  float0 = lambda x: None if x is None else np.zeros(x.shape, jax.dtypes.float0)
  return (*map(_heads_first, (d_q, d_k, d_v)), d_bias, float0(mask), float0(keep))


def _sum_to(x, shape):
  """`x` summed over the axes a bias of `shape` was broadcast along ([1, heads, q, k]: the
  batch)."""
  axes = tuple(i for i, (n, m) in enumerate(zip(shape, x.shape)) if n == 1 and m != 1)
  return jnp.sum(x, axis=axes, keepdims=True)


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)
