"""Scaled dot-product attention and multi-head attention (paper section 3.2).

Shapes: b = batch, q = query positions, k = key positions, h = heads, d = head_dim.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder.config import EncoderConfig
from flax_encoder.dropout import apply_mask, keep_mask
from flax_encoder.dense import dense
from flax_encoder.packing import ids_mask

# The PyTorch tutorial port fills masked scores with -1e9 (`masked_fill(mask == 0, -1e9)`), not
# -inf, so a row whose keys are all masked averages the values instead of producing NaN.
MASK_FILL = -1e9


def scaled_dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array | None = None,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """softmax(q k^T / sqrt(d) masked) v, the reference einsum implementation.

  Args:
    query: [batch, q, heads, head_dim].
    key: [batch, k, heads, head_dim].
    value: [batch, k, heads, head_dim].
    mask: bool, True = attend, broadcastable to [batch, heads, q, k].
    dropout_rate: dropout on the attention weights; needs `dropout_rng` when > 0.
    dropout_rng: PRNG key for that dropout.

  Returns:
    (output [batch, q, heads, head_dim], weights [batch, heads, q, k]). The weights are the
    softmax before dropout.
  """
  keep = None
  if dropout_rate > 0.0:
    if dropout_rng is None:
      raise ValueError("dropout_rng is needed when dropout_rate > 0")
    batch, q_len, heads, _ = query.shape
    keep = keep_mask(dropout_rng, dropout_rate, (batch, heads, q_len, key.shape[1]))
  return _attention(query, key, value, mask, keep, dropout_rate)


def _heads_first(x):
  """[b, q, h, d] <-> [b, h, q, d]."""
  return jnp.swapaxes(x, 1, 2)


def _softmax_weights(q, k, mask):
  """softmax of the masked scores q k^T; q, k heads-first, q already scaled by 1/sqrt(d)."""
  scores = jnp.einsum("bhqd,bhkd->bhqk", q, k)
  # Softmax in at least float32: bf16 scores lose the small weights otherwise.
  scores = scores.astype(jnp.promote_types(scores.dtype, jnp.float32))
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
@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attention(query, key, value, mask, keep, rate):
  return _attention_fwd_impl(query, key, value, mask, keep, rate)[0]


def _attention_fwd_impl(query, key, value, mask, keep, rate):
  scale = 1.0 / math.sqrt(query.shape[-1])
  q, k, v = _heads_first(query) * scale, _heads_first(key), _heads_first(value)
  weights = _softmax_weights(q, k, mask)
  out = jnp.einsum("bhqk,bhkd->bhqd", _dropout(weights, keep, rate), v)
  return (_heads_first(out), weights), (q, k, v, mask, keep, out, weights)


def _attention_fwd(query, key, value, mask, keep, rate):
  primal = lambda x: None if x is None else x.value
  return _attention_fwd_impl(*map(primal, (query, key, value, mask, keep)), rate)


def _attention_bwd(rate, residuals, cotangents):
  q, k, v, mask, keep, out, weights = residuals
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
  d_scores = d_scores.astype(q.dtype)
  scale = 1.0 / math.sqrt(q.shape[-1])
  d_q = jnp.einsum("bhqk,bhkd->bhqd", d_scores, k) * scale
  d_k = jnp.einsum("bhqk,bhqd->bhkd", d_scores, q)  # q carries the scale already
  float0 = lambda x: None if x is None else np.zeros(x.shape, jax.dtypes.float0)
  return (*map(_heads_first, (d_q, d_k, d_v)), float0(mask), float0(keep))


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)


def fused_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                    mask: jax.Array | None, implementation: str) -> jax.Array:
  """softmax(q k^T / sqrt(d) masked) v through `jax.nn.dot_product_attention`: "xla", or
  "cudnn" (cuDNN's fused flash attention, NVIDIA GPUs, bfloat16/float16). Shapes as in
  `scaled_dot_product_attention`; returns the output only (no weights, no dropout)."""
  check_backend(implementation)
  batch, q_len, heads, _ = query.shape
  if mask is not None:
    mask = jnp.broadcast_to(mask, (batch, heads, q_len, key.shape[1]))
  if implementation == "xla" and query.dtype == jnp.float64:
    return _xla_in_float64(query, key, value, mask)
  return jax.nn.dot_product_attention(query, key, value, mask=mask,
                                      implementation=implementation)


def _xla_in_float64(query, key, value, mask):
  """What `jax.nn.dot_product_attention(implementation="xla")` computes, in float64 throughout:
  it takes the softmax in float32 whatever its inputs are, which makes a float64 model ~1e-7
  off its own float64 reference. Masked scores get the same large negative number."""
  logits = jnp.einsum("bqhd,bkhd->bhqk", query, key) / np.sqrt(query.shape[-1])
  if mask is not None:
    logits = jnp.where(mask, logits, -0.7 * jnp.finfo(logits.dtype).max)
  return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), value)


# The attention kernels that run on one backend only: that backend, and what the kernel is.
KERNEL_BACKENDS = {"cudnn": ("gpu", "cuDNN flash attention and needs an NVIDIA GPU"),
                   "triton": ("gpu", "a Pallas kernel for an NVIDIA GPU"),
                   "splash": ("tpu", "a Pallas kernel for a TPU")}
# Those of them that take segment ids in place of a mask (and run in interpret_kernels()).
SEGMENT_KERNELS = ("splash", "triton")
# Their tiles: a sequence is split into blocks of this many positions (the TPU's 128 lanes),
# so its length must be a multiple of it (the Triton kernel also takes a power of two below).
SPLASH_BLOCK = 128
_interpreting = contextvars.ContextVar("interpret_kernels", default=False)


def kernel_takes(impl: str, seq: int) -> bool:
  """Whether `impl` (one of SEGMENT_KERNELS) takes sequences of `seq` tokens."""
  power_of_two = seq & (seq - 1) == 0
  return seq % SPLASH_BLOCK == 0 or (impl == "triton" and power_of_two and seq < SPLASH_BLOCK)


def check_kernel_length(impl: str, seq: int) -> None:
  """ValueError unless `impl` (one of SEGMENT_KERNELS) takes sequences of `seq` tokens."""
  if not kernel_takes(impl, seq):
    also = ", or a power of two below it" if impl == "triton" else ""
    raise ValueError(f"attention_impl={impl!r} takes sequences of a multiple of "
                     f"{SPLASH_BLOCK} tokens{also} (the kernel's blocks), got {seq}; pad the "
                     f"tokens to one, or use attention_impl='xla'")


def check_backend(impl: str, offer_interpret: bool = True) -> None:
  """ValueError, saying what to use instead, if `impl` is a kernel of one backend (one of
  KERNEL_BACKENDS) and this is not that backend (nor interpret_kernels(), for the Pallas
  ones, which the message offers if `offer_interpret`)."""
  backend, what = KERNEL_BACKENDS.get(impl, (None, None))
  if backend is None or jax.default_backend() == backend or (
      impl in SEGMENT_KERNELS and _interpreting.get()):
    return
  instead = (", or flax_encoder.attention.interpret_kernels() to run it slowly here"
             if impl in SEGMENT_KERNELS and offer_interpret else " or 'reference'")
  raise ValueError(f"attention_impl={impl!r} is {what}; the default backend here is "
                   f"{jax.default_backend()!r}. Use attention_impl='xla' (same numbers)"
                   f"{instead}")


@contextlib.contextmanager
def interpret_kernels():
  """Within it, the Pallas kernels (attention_impl 'splash' and 'triton') run in Pallas's
  interpret mode on any backend (slowly: for tests and debugging on a CPU). Functions jitted
  within keep it."""
  token = _interpreting.set(True)
  try:
    yield
  finally:
    _interpreting.reset(token)


def splash_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                     segment_ids: jax.Array, *, window: int = 0,
                     interpret: bool = False) -> jax.Array:
  """softmax(q k^T / sqrt(d)) v where a query attends only to keys of its own segment, by
  TPU Splash attention (Pallas): the segment ids go to the kernel, which skips the blocks
  they rule out and never builds a [seq, seq] mask. Padding is segment 0: its queries see
  only padding and no real token sees it, so rows of several sequences packed together are
  encoded as if each were alone.

  Args:
    query, key, value: [batch, seq, heads, head_dim]; seq a multiple of SPLASH_BLOCK.
    segment_ids: int [batch, seq].
    window: > 0: a query sees only the keys at most window / 2 positions away (a local layer's
      config.local_attention), and the kernel skips the blocks outside that band.
    interpret: run the kernel in Pallas's interpret mode (any backend, slowly).

  Returns:
    [batch, seq, heads, head_dim].
  """
  from jax.experimental.pallas.ops.tpu.splash_attention import (
      splash_attention_kernel as splash, splash_attention_mask as masks)
  batch, seq, heads, head_dim = query.shape
  check_kernel_length("splash", seq)
  block = max(b for b in (512, 256, 128) if seq % b == 0)
  sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                            block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                            block_q_dq=block, block_kv_dq=block)
  mask = (masks.LocalMask((seq, seq), (window // 2, window // 2), offset=0) if window
          else masks.FullMask((seq, seq)))
  kernel = splash.make_splash_mha(
      masks.MultiHeadMask([mask] * heads),
      block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [batch, heads, seq, head_dim]
  segment_ids = segment_ids.astype(jnp.int32)
  out = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=splash.SegmentIds(q=s, kv=s)))(
      heads_first(query / np.sqrt(head_dim).astype(query.dtype)), heads_first(key),
      heads_first(value), segment_ids)
  return heads_first(out)


def triton_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                     segment_ids: jax.Array, *, interpret: bool = False) -> jax.Array:
  """softmax(q k^T / sqrt(d)) v where a query attends only to keys of its own segment, by the
  flash attention kernel that ships with JAX for NVIDIA GPUs (Pallas, lowered to Triton): the
  segment ids go to the kernel, which masks block by block and never builds a [seq, seq]
  mask. Shapes and padding as in `splash_attention`; seq a multiple of SPLASH_BLOCK or a
  power of two below it."""
  with warnings.catch_warnings():  # JAX 0.12 deprecates it for tokamax, whose attention
    warnings.simplefilter("ignore", DeprecationWarning)  # takes no segment ids
    from jax.experimental.pallas.ops.gpu import attention as gpu_attention
  check_kernel_length("triton", query.shape[1])
  return gpu_attention.mha(query, key, value, segment_ids.astype(jnp.int32),
                           sm_scale=1.0 / math.sqrt(query.shape[-1]), interpret=interpret)


SEGMENT_KERNEL_FUNCTIONS = {"splash": splash_attention, "triton": triton_attention}


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


def _is_ids(mask) -> bool:
  return mask is not None and mask.ndim == 2 and jnp.issubdtype(mask.dtype, jnp.integer)


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


class MultiHeadAttention(nn.Module):
  """Multi-head attention with separate w_q, w_k, w_v, w_o projections (the tutorial port's).

  The attention weights of the reference implementation are sown into the 'intermediates'
  collection as `attention_weights` ([batch, heads, q, k]); `apply(..., mutable=
  ['intermediates'])` returns them.
  """

  config: EncoderConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array | None = None,
               value: jax.Array | None = None, mask: jax.Array | None = None, *,
               deterministic: bool = True, positions: jax.Array | None = None,
               is_global: bool | jax.Array = True) -> jax.Array:
    """Attends from `query` to `key`/`value` (self-attention when they are omitted).

    Args:
      query: [batch, q, d_model].
      key: [batch, k, d_model]; defaults to `query`.
      value: [batch, k, d_model]; defaults to `key`.
      mask: bool, True = attend, broadcastable to [batch, heads, q, k]. With
        attention_impl 'splash' or 'triton', the segment ids instead (int [batch, seq], 0 =
        padding), which those kernels take in place of a mask.
      deterministic: no dropout when True.
      positions: int [batch, seq], each token's position for rotary positions (self-attention;
        default 0 … seq - 1).
      is_global: False: a layer of config.local_attention's window (a Python bool, or a traced
        one under nn.scan), with config.local_rope_theta.

    Returns:
      [batch, q, d_model].
    """
    cfg = self.config
    key = query if key is None else key
    value = key if value is None else value
    batch, q_len, _ = query.shape
    # [batch, seq, d_model] -> [batch, seq, heads, head_dim]
    project = lambda name, x: dense(cfg, cfg.d_model, ("embed", "joined_kv"), name)(x).reshape(
        batch, x.shape[1], cfg.n_heads, cfg.head_dim)
    q, k, v = project("w_q", query), project("w_k", key), project("w_v", value)
    if cfg.position_embedding == "rotary":
      q, k = self._rotary(q, k, positions, is_global)
    if _is_ids(mask) and cfg.attention_impl in ("xla", "cudnn"):
      context = self._by_ids(q, k, v, mask, is_global)
    else:
      if _is_ids(mask) and cfg.attention_impl == "reference":
        mask = ids_mask(mask)
      context = self._by_mask(q, k, v, mask, deterministic, is_global)
    # [batch, q, heads, head_dim] -> [batch, q, d_model]
    context = context.reshape(batch, q_len, cfg.d_model)
    return dense(cfg, cfg.d_model, ("joined_kv", "embed"), "w_o")(context)

  def _by_ids(self, q, k, v, ids, is_global):
    """attention_impl 'xla' or 'cudnn' given `packing.attention_ids`: the local layers by
    `windowed_attention` once the sequence is longer than the three blocks it reads per query
    (shorter, the full mask costs less), the global ones by `fused_attention`."""
    cfg = self.config
    seq = q.shape[1]
    whole = lambda: fused_attention(q, k, v, ids_mask(ids), cfg.attention_impl)
    if seq > 3 * max(cfg.local_attention // 2, 1):
      local = lambda: windowed_attention(q, k, v, ids, cfg.local_attention)
    else:
      local = lambda: fused_attention(
          q, k, v, ids_mask(ids) & local_window(seq, seq, cfg.local_attention),
          cfg.attention_impl)
    if is_global is True or not cfg.local_attention:
      return whole()
    if is_global is False:
      return local()
    return jax.lax.cond(is_global, whole, local)  # traced under nn.scan

  def _by_mask(self, q, k, v, mask, deterministic, is_global):
    cfg = self.config
    if cfg.local_attention and is_global is not True and cfg.attention_impl != "splash":
      window = local_window(q.shape[1], k.shape[1], cfg.local_attention)
      if is_global is not False:  # traced: the window only where the layer is local
        window = window | is_global
      mask = window if mask is None else mask & window

    if cfg.attention_impl == "reference":
      rate = 0.0 if deterministic else cfg.attention_dropout
      rng = self.make_rng("dropout") if rate > 0 else None
      context, weights = scaled_dot_product_attention(q, k, v, mask, dropout_rate=rate,
                                                      dropout_rng=rng)
      self.sow("intermediates", "attention_weights", weights)
      return context
    if cfg.attention_impl in SEGMENT_KERNELS:
      impl = cfg.attention_impl
      if mask is None or mask.ndim != 2 or not jnp.issubdtype(mask.dtype, jnp.integer):
        raise ValueError(f"attention_impl={impl!r} attends by segment ids (int [batch, seq]), "
                         f"not by a mask: the Encoder passes them")
      check_backend(impl)
      segments = jnp.maximum(mask, 0)  # attention_ids' padding (negative) is segment 0
      run = lambda window=0: SEGMENT_KERNEL_FUNCTIONS[impl](
          q, k, v, segments, interpret=_interpreting.get(), **({"window": window} if window else {}))
      if is_global is True or not cfg.local_attention:
        return run()
      if is_global is False:
        return run(cfg.local_attention)
      return jax.lax.cond(is_global, run, lambda: run(cfg.local_attention))
    return fused_attention(q, k, v, mask, cfg.attention_impl)

  def _rotary(self, q, k, positions, is_global):
    cfg = self.config
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(q.shape[1]), q.shape[:2])
    # A negative position reads NaN, as one past the table does.
    positions = jnp.where(positions < 0, cfg.max_len, positions)
    turn = lambda x, theta: rotate(x, positions, theta, cfg.max_len)
    if is_global is True or not cfg.local_attention:
      return turn(q, cfg.rope_theta), turn(k, cfg.rope_theta)
    if is_global is False:
      return turn(q, cfg.local_rope_theta), turn(k, cfg.local_rope_theta)
    pick = lambda x: jnp.where(is_global, turn(x, cfg.rope_theta), turn(x, cfg.local_rope_theta))
    return pick(q), pick(k)
