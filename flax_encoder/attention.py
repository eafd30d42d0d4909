"""Multi-head attention (paper section 3.2.2): the projections, rotary positions, a bias on
the scores (relative positions), and the attention implementation `config.attention_impl`
names, run as its entry in `kernels.KERNELS` says it can."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from flax_encoder import relative
from flax_encoder.config import EncoderConfig
from flax_encoder.dense import dense
from flax_encoder.kernels import KERNELS, Kernel, interpreting
from flax_encoder.packing import ids_mask
from flax_encoder.rotary import rotate
from flax_encoder.windowed import local_window, windowed_attention


def _is_ids(mask) -> bool:
  return mask is not None and mask.ndim == 2 and jnp.issubdtype(mask.dtype, jnp.integer)


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
               is_global: bool | jax.Array = True, bias: jax.Array | None = None) -> jax.Array:
    """Attends from `query` to `key`/`value` (self-attention when they are omitted).

    Args:
      query: [batch, q, d_model].
      key: [batch, k, d_model]; defaults to `query`.
      value: [batch, k, d_model]; defaults to `key`.
      mask: bool, True = attend, broadcastable to [batch, heads, q, k]; or one int per token
        from `packing.attention_ids` (int [batch, seq]), which a kernel that takes segment ids
        needs in place of a mask, and by windows of which a kernel of `windowed_locals`
        attends in a local layer (see `kernels.Kernel`).
      deterministic: no dropout when True.
      positions: int [batch, seq], each token's position for rotary positions (self-attention;
        default 0 … seq - 1).
      is_global: False: a layer of config.local_attention's window (a Python bool, or a traced
        one under nn.scan), with config.local_rope_theta.
      bias: float [batch or 1, heads, q, k], added to the scores before the softmax; with
        config.relative_attention, the state the Encoder computed of its part, from which the
        part gives this layer's bias. Only with a kernel of `takes_bias`.

    Returns:
      [batch, q, d_model].
    """
    cfg = self.config
    kernel = KERNELS[cfg.attention_impl]
    kernel.warn_if_deprecated()
    if bias is not None and not kernel.takes_bias:
      takes = " or ".join(repr(k.name) for k in KERNELS.values() if k.takes_bias)
      raise ValueError(f"attention_impl={kernel.name!r} takes no bias on the scores: use "
                       f"attention_impl={takes}")
    key = query if key is None else key
    value = key if value is None else value
    batch, q_len, _ = query.shape
    # [batch, seq, d_model] -> [batch, seq, heads, head_dim]; keys and values of
    # config.key_value_heads heads, each serving n_heads // key_value_heads query heads
    # (grouped-query attention), repeated to one a query head for every kernel.
    w_q, w_k, w_v = (dense(cfg, heads * cfg.head_dim, ("embed", "joined_kv"), name)
                     for name, heads in (("w_q", cfg.n_heads), ("w_k", cfg.key_value_heads),
                                         ("w_v", cfg.key_value_heads)))
    project = lambda w, x: w(x).reshape(batch, x.shape[1], -1, cfg.head_dim)
    groups = cfg.n_heads // cfg.key_value_heads
    q = project(w_q, query)
    k, v = (jnp.repeat(project(w, x), groups, axis=2) if groups > 1 else project(w, x)
            for w, x in ((w_k, key), (w_v, value)))
    if cfg.relative_attention:  # a family's scheme: this layer's bias, from the encoder's state
      bias, q = relative.part(cfg.relative_attention).scores(cfg, q, k, w_q, w_k, bias,
                                                              deterministic)
    if cfg.position_embedding == "rotary":
      q, k = self._rotary(q, k, positions, is_global)
    if kernel.takes_segment_ids:
      context = self._by_segment_ids(kernel, q, k, v, mask, is_global)
    elif _is_ids(mask) and kernel.windowed_locals and bias is None:  # windows take no bias
      context = self._by_ids(kernel, q, k, v, mask, is_global)
    else:
      mask = ids_mask(mask) if _is_ids(mask) else mask
      context = self._by_mask(kernel, q, k, v, mask, deterministic, is_global, bias)
    # [batch, q, heads, head_dim] -> [batch, q, d_model]
    context = context.reshape(batch, q_len, cfg.d_model)
    return dense(cfg, cfg.d_model, ("joined_kv", "embed"), "w_o")(context)

  def _per_layer(self, is_global, whole, local, traced=jax.lax.cond):
    """whole() in a global layer, local() in a layer of config.local_attention's window. Under
    nn.scan `is_global` is traced, and `traced(is_global, whole, local)` picks."""
    if is_global is True or not self.config.local_attention:
      return whole()
    if is_global is False:
      return local()
    return traced(is_global, whole, local)

  def _by_ids(self, kernel: Kernel, q, k, v, ids, is_global):
    """A kernel of `windowed_locals` given `packing.attention_ids`: the local layers by
    `windowed_attention` once the sequence is longer than the three blocks it reads per query
    (shorter, the full mask costs less), the global ones by the kernel on the mask of the
    ids."""
    width = self.config.local_attention
    seq = q.shape[1]
    whole = lambda: kernel.function(q, k, v, ids_mask(ids))
    if seq > 3 * max(width // 2, 1):
      local = lambda: windowed_attention(q, k, v, ids, width)
    else:
      local = lambda: kernel.function(q, k, v, ids_mask(ids) & local_window(seq, seq, width))
    return self._per_layer(is_global, whole, local)

  def _by_mask(self, kernel: Kernel, q, k, v, mask, deterministic, is_global, bias):
    cfg = self.config
    scores = {"bias": bias} if bias is not None else {}
    window = self._per_layer(
        is_global, lambda: None,
        lambda: local_window(q.shape[1], k.shape[1], cfg.local_attention),
        traced=lambda g, _, local: local() | g)  # the window only where the layer is local
    if window is not None:
      mask = window if mask is None else mask & window
    if not kernel.has_dropout:
      return kernel.function(q, k, v, mask, **scores)
    rate = 0.0 if deterministic else cfg.attention_dropout
    rng = self.make_rng("dropout") if rate > 0 else None
    context, weights = kernel.function(q, k, v, mask, dropout_rate=rate, dropout_rng=rng,
                                       **scores)
    self.sow("intermediates", "attention_weights", weights)
    return context

  def _by_segment_ids(self, kernel: Kernel, q, k, v, ids, is_global):
    if not _is_ids(ids):
      raise ValueError(f"attention_impl={kernel.name!r} attends by segment ids (int [batch, "
                       f"seq]), not by a mask: the Encoder passes them")
    kernel.check_backend()
    segments = jnp.maximum(ids, 0)  # attention_ids' padding (negative) is segment 0
    run = lambda window=0: kernel.function(q, k, v, segments, window=window,
                                           interpret=interpreting())
    return self._per_layer(is_global, run, lambda: run(self.config.local_attention))

  def _rotary(self, q, k, positions, is_global):
    cfg = self.config
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(q.shape[1]), q.shape[:2])
    # A negative position reads NaN, as one past the table does.
    positions = jnp.where(positions < 0, cfg.max_len, positions)
    turn = lambda theta: lambda: tuple(rotate(x, positions, theta, cfg.max_len) for x in (q, k))
    both = lambda g, whole, local: jax.tree.map(functools.partial(jnp.where, g), whole(), local())
    return self._per_layer(is_global, turn(cfg.rope_theta), turn(cfg.local_rope_theta),
                           traced=both)
