"""The attention implementations `EncoderConfig.attention_impl` picks from, each declared once
with what it can do, and the fused and Pallas kernels behind them.

As transformers dispatches attention through one registry (ALL_ATTENTION_FUNCTIONS), here
`KERNELS[name]` says which backend an implementation runs on, whether it attends by segment
ids in place of a mask, whether it takes a local window and dropout on the weights, which
dtypes and sequence lengths it takes, and computes it. The config's checks, the Encoder,
MultiHeadAttention, bucketed inference and the training program read those properties; none
of them compares names.

Shapes: b = batch, q = query positions, k = key positions, h = heads, d = head_dim.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder.reference_attention import scaled_dot_product_attention

# The device a backend of `jax.default_backend()` stands for, in messages.
_DEVICES = {"gpu": "an NVIDIA GPU", "tpu": "a TPU"}
_interpreting = contextvars.ContextVar("interpret_kernels", default=False)


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One attention implementation and what it can do.

  Attributes:
    name: its `attention_impl`.
    title: what it is, in words, for messages.
    function: computes it, on q, k, v [batch, seq, heads, head_dim]. With `takes_segment_ids`:
      (q, k, v, segment_ids, *, window=0, interpret=False) -> out; with `has_dropout` (the
      reference, whose weights MultiHeadAttention sows): (q, k, v, mask, *, dropout_rate,
      dropout_rng) -> (out, weights); otherwise (q, k, v, mask) -> out. With `takes_bias`,
      also a keyword `bias`.
    backend: the one `jax.default_backend()` it runs on; None: any.
    pallas: a Pallas kernel, which also runs on any backend within `interpret_kernels()`.
    takes_segment_ids: attends by segment ids (int [batch, seq], 0 = padding) in place of a
      mask and never builds a [seq, seq] one; an explicit mask is refused.
    windowed_locals: given segment ids in place of a mask, its local layers attend by
      `windowed.windowed_attention` (no [seq, seq] array), its global ones by the mask of them.
    takes_window: runs the local layers of config.local_attention; False: refused with them.
    has_dropout: dropout on the attention weights (config.attention_dropout).
    takes_bias: adds a float `bias` [batch or 1, heads, q, k] to the scores before the softmax
      (config.relative_attention: a relative position scheme's); False: refused with it.
    dtypes: the compute dtypes it takes; None: any.
    block: its tiles: sequence lengths must be a multiple of this; None: any length.
    short_powers_of_two: also lengths that are a power of two below `block`.
    fallback: what computes the same numbers on any backend, offered when this one is refused.
    deprecated: what replaces it and why, while it is deprecated.
    missing: why this JAX lacks it (a function, asked when a config names it), or None.
  """

  name: str
  title: str
  function: Callable
  backend: str | None = None
  pallas: bool = False
  takes_segment_ids: bool = False
  windowed_locals: bool = False
  takes_window: bool = True
  has_dropout: bool = False
  takes_bias: bool = False
  dtypes: tuple[str, ...] | None = None
  block: int | None = None
  short_powers_of_two: bool = False
  fallback: str | None = None
  deprecated: str | None = None
  missing: Callable[[], str | None] | None = None

  def unavailable(self) -> str | None:
    """Why this JAX cannot run it; None where it can."""
    return self.missing() if self.missing else None

  def takes_length(self, seq: int) -> bool:
    """Whether it takes sequences of `seq` tokens."""
    if self.block is None or seq % self.block == 0:
      return True
    return self.short_powers_of_two and seq & (seq - 1) == 0 and seq < self.block

  def check_length(self, seq: int) -> None:
    """ValueError unless it takes sequences of `seq` tokens."""
    if not self.takes_length(seq):
      also = ", or a power of two below it" if self.short_powers_of_two else ""
      raise ValueError(f"attention_impl={self.name!r} takes sequences of a multiple of "
                       f"{self.block} tokens{also} (the kernel's blocks), got {seq}; pad the "
                       f"tokens to one, or use attention_impl={self.fallback!r}")

  def check_backend(self, offer_interpret: bool = True) -> None:
    """ValueError, saying what to use instead, unless it runs on this backend (a Pallas
    kernel also within `interpret_kernels()`, which the message offers if
    `offer_interpret`)."""
    here = jax.default_backend()
    if self.backend in (None, here) or (self.pallas and _interpreting.get()):
      return
    device = _DEVICES[self.backend]
    what = f"a Pallas kernel for {device}" if self.pallas else f"{self.title} and needs {device}"
    if self.pallas and offer_interpret:
      instead = ", or flax_encoder.kernels.interpret_kernels() to run it slowly here"
    else:  # whatever else runs anywhere
      instead = "".join(f" or {k.name!r}" for k in KERNELS.values()
                        if k.backend is None and k.name != self.fallback)
    raise ValueError(f"attention_impl={self.name!r} is {what}; the default backend here is "
                     f"{here!r}. Use attention_impl={self.fallback!r} (same numbers){instead}")

  def warn_if_deprecated(self) -> None:
    """A FutureWarning, the first time in a process, while it is deprecated."""
    if self.deprecated:
      _warn_once(f"attention_impl={self.name!r} is deprecated: {self.deprecated}")

  def alternatives(self, can: Callable[[Kernel], bool]) -> str:
    """Its fallback, or the other kernels of its backend that `can`, quoted for a message."""
    names = [self.fallback] + [k.name for k in KERNELS.values() if k.backend == self.backend
                               and k.name not in (self.name, self.fallback) and can(k)]
    return " or ".join(map(repr, names))


# Once a process rather than at every trace of every layer. Python's own once-per-place does
# not hold: any change to the warning filters resets it, and the Triton kernel's import makes one.
@functools.cache
def _warn_once(message: str) -> None:
  warnings.warn(message, FutureWarning, stacklevel=3)


def interpreting() -> bool:
  """Whether the Pallas kernels run in interpret mode here (`interpret_kernels()`)."""
  return _interpreting.get()


@contextlib.contextmanager
def interpret_kernels():
  """Within it, the Pallas kernels (those of KERNELS with `pallas`) run in Pallas's interpret
  mode on any backend (slowly: for tests and debugging on a CPU). Functions jitted within
  keep it."""
  token = _interpreting.set(True)
  try:
    yield
  finally:
    _interpreting.reset(token)


def fused_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                    mask: jax.Array | None, implementation: str,
                    bias: jax.Array | None = None) -> jax.Array:
  """softmax(q k^T / sqrt(d) + bias masked) v through `jax.nn.dot_product_attention`: "xla",
  or "cudnn" (cuDNN's fused flash attention, NVIDIA GPUs, bfloat16/float16). Shapes as in
  `scaled_dot_product_attention`; returns the output only (no weights, no dropout)."""
  if implementation in KERNELS:
    KERNELS[implementation].check_backend()
  batch, q_len, heads, _ = query.shape
  if mask is not None:
    mask = jnp.broadcast_to(mask, (batch, heads, q_len, key.shape[1]))
  # JAX's own name for its XLA path, whose softmax is float32 whatever the inputs.
  if implementation == "xla" and query.dtype == jnp.float64:
    return _xla_in_float64(query, key, value, mask, bias)
  return jax.nn.dot_product_attention(query, key, value, bias=bias, mask=mask,
                                      implementation=implementation)


def _xla_in_float64(query, key, value, mask, bias):
  """What `jax.nn.dot_product_attention(implementation="xla")` computes, in float64 throughout:
  it takes the softmax in float32 whatever its inputs are, which makes a float64 model ~1e-7
  off its own float64 reference. Masked scores get the same large negative number."""
  logits = jnp.einsum("bqhd,bkhd->bhqk", query, key) / np.sqrt(query.shape[-1])
  if bias is not None:
    logits = logits + bias
  if mask is not None:
    logits = jnp.where(mask, logits, -0.7 * jnp.finfo(logits.dtype).max)
  return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), value)


def splash_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                     segment_ids: jax.Array, *, window: int = 0,
                     interpret: bool = False) -> jax.Array:
  """softmax(q k^T / sqrt(d)) v where a query attends only to keys of its own segment, by
  TPU Splash attention (Pallas): the segment ids go to the kernel, which skips the blocks
  they rule out and never builds a [seq, seq] mask. Padding is segment 0: its queries see
  only padding and no real token sees it, so rows of several sequences packed together are
  encoded as if each were alone.

  Args:
    query, key, value: [batch, seq, heads, head_dim]; seq a multiple of the kernel's block.
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
  KERNELS["splash"].check_length(seq)
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
                     segment_ids: jax.Array, *, window: int = 0,
                     interpret: bool = False) -> jax.Array:
  """softmax(q k^T / sqrt(d)) v where a query attends only to keys of its own segment, by the
  flash attention kernel that ships with JAX for NVIDIA GPUs (Pallas, lowered to Triton): the
  segment ids go to the kernel, which masks block by block and never builds a [seq, seq]
  mask. Shapes and padding as in `splash_attention`; seq a multiple of the kernel's block or
  a power of two below it. `window` must be 0: the kernel takes none."""
  if window:
    raise ValueError(f"window: {window}, expected 0: {KERNELS['triton'].title} takes no window")
  gpu_attention = _gpu_attention()
  KERNELS["triton"].check_length(query.shape[1])
  return gpu_attention.mha(query, key, value, segment_ids.astype(jnp.int32),
                           sm_scale=1.0 / math.sqrt(query.shape[-1]), interpret=interpret)


@functools.cache
def _gpu_attention():
  """JAX's Pallas attention for NVIDIA GPUs, or None where this JAX has none (0.12 removed it)."""
  with warnings.catch_warnings():  # JAX 0.11 deprecates it for tokamax, whose attention
    warnings.simplefilter("ignore", DeprecationWarning)  # takes no segment ids
    try:
      from jax.experimental.pallas.ops.gpu import attention
    except ImportError:
      return None
  return attention


def _triton_missing() -> str | None:
  if _gpu_attention() is None:
    return (f"this JAX ({jax.__version__}) has no Pallas GPU attention "
            f"(jax.experimental.pallas.ops.gpu.attention, which JAX 0.12 removed)")
  return None


# Pallas's tiles: a sequence is split into blocks of this many positions (the TPU's 128 lanes).
_PALLAS_BLOCK = 128

KERNELS: dict[str, Kernel] = {kernel.name: kernel for kernel in (
    Kernel("reference", "the reference einsum attention", scaled_dot_product_attention,
           has_dropout=True, takes_bias=True),
    Kernel("xla", "XLA's attention", functools.partial(fused_attention, implementation="xla"),
           windowed_locals=True, takes_bias=True),
    # cuDNN's own sliding window is one-sided (or causal) only: its local layers go by
    # windowed_attention, or by a mask. It takes no bias here: jax.nn.dot_product_attention
    # passes one to cuDNN, but a bias broadcast over the batch and its gradient are untested
    # on a GPU, so a model with one (MPNet's) runs by "xla".
    Kernel("cudnn", "cuDNN flash attention",
           functools.partial(fused_attention, implementation="cudnn"), backend="gpu",
           windowed_locals=True, dtypes=("bfloat16", "float16"), fallback="xla"),
    Kernel("splash", "TPU Splash attention", splash_attention, backend="tpu", pallas=True,
           takes_segment_ids=True, block=_PALLAS_BLOCK, fallback="xla"),
    Kernel("triton", "JAX's Triton attention kernel", triton_attention, backend="gpu",
           pallas=True, takes_segment_ids=True, takes_window=False, block=_PALLAS_BLOCK,
           short_powers_of_two=True, fallback="xla",
           deprecated="JAX deprecates the Pallas Triton backend it is built on (0.11.2 warns "
                      "at every lowering) and will remove it; on NVIDIA GPUs use "
                      "attention_impl='cudnn' (jax.nn.dot_product_attention's cuDNN flash "
                      "attention, which takes a mask, not segment ids) until a Pallas Mosaic "
                      "GPU kernel takes segment ids",
           missing=_triton_missing),
)}
