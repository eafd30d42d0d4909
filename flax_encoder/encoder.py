"""The encoder stack: embedding (* sqrt(d_model)) + positions (+ token types), (LayerNorm),
dropout, (a projection to d_model), (a relative attention part's state, shared by the layers),
N layers (or one layer N times), (final LayerNorm)."""

from __future__ import annotations

import inspect
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder import relative
from flax_encoder.config import EncoderConfig
from flax_encoder.dense import dense
from flax_encoder.dropout import Dropout
from flax_encoder.embedding import PositionalEncoding
from flax_encoder.inputs import (check_packing, check_token_shape, check_token_types,
                                 check_token_values)
from flax_encoder.kernels import KERNELS
from flax_encoder.layer import EncoderLayer, layer_norm
from flax_encoder.masks import check_mask, padding_mask
from flax_encoder.packing import attention_ids, segment_mask
from flax_encoder.sharding import ACTIVATION_AXES

# What each EncoderConfig.remat option keeps from the forward pass for the backward pass.
_SAVED_IN_REMAT = {
    "full": None,  # nothing: the whole layer is recomputed
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


# nn.remat traces its arguments; `deterministic` is a Python bool and must stay one, and so is
# a layer's `is_global` unless the layers are scanned (then it is the scan's input).
_PARAMETERS = list(inspect.signature(EncoderLayer.__call__).parameters)


def _layer_class(cfg: EncoderConfig):
  if cfg.remat == "none":
    return EncoderLayer
  static = ("deterministic",) if cfg.scan_layers else ("deterministic", "is_global")
  return nn.remat(EncoderLayer, policy=_SAVED_IN_REMAT[cfg.remat],
                  static_argnums=tuple(_PARAMETERS.index(name) for name in static))


def _scan_body(layer: nn.Module, x, is_global, mask, deterministic, positions, bias):
  return layer(x, mask, deterministic, positions, is_global, bias), None


class Encoder(nn.Module):
  """The Transformer encoder of "Attention Is All You Need", as the PyTorch tutorial port has it,
  or, by EncoderConfig's switches, as BERT, RoBERTa and DistilBERT have it (learned positions,
  token types, a LayerNorm on the embeddings, no final LayerNorm), ALBERT (narrower embeddings
  projected to d_model, one layer's parameters at every depth) or ModernBERT, plus the
  relative attention part a family registers (flax_encoder.relative: MPNet's bias by T5's
  buckets, DeBERTa's disentangled attention).

  Attributes:
    config: sizes and options.
    check_traced_ids: under a caller's jit, out-of-range token ids get a
      `checkify.debug_check` (see `flax_encoder.checked_apply`). False leaves it out of the
      traced program: for `jax.export`, which cannot serialize it, and where the ids were
      checked on the host before, since the check's effect takes every call of the jitted
      function off JAX's C++ dispatch path (3 to 5 ms a call on a 2-core CPU, 6 ms on an
      H200's host).
  """

  config: EncoderConfig
  check_traced_ids: bool = True

  @nn.compact
  def __call__(self, tokens: jax.Array, mask: jax.Array | None = None, *,
               segment_ids: jax.Array | None = None, positions: jax.Array | None = None,
               token_types: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    """Encodes token ids.

    Args:
      tokens: int ids in [0, vocab_size), [batch, seq], seq <= max_len.
      mask: bool, True = attend, broadcastable to [batch, heads, seq, seq]
        ([batch, 1, 1, seq] or [batch, 1, seq, seq]); defaults to the padding mask
        `padding_mask(tokens, pad_id)`: the run of pad_id that ends a row is padding, a
        pad_id among the text's ids (a literal "[PAD]") is the text's, as a tokenizer's
        attention mask has it.
      segment_ids: int [batch, seq], for rows that pack several sequences: a token attends
        only to tokens of its own segment; 0 marks padding, and only 0: a pad_id within a
        segment is its text's (`flax_encoder.packing`). Combined
        with `mask` when both are given. An attention kernel that takes segment ids
        (`kernels.KERNELS` says which) takes no mask: segment ids (or, without them, the
        padding) go to it; so do the local layers of a kernel of `windowed_locals` when no
        `mask` is given (`windowed_attention`: no [seq, seq] array).
      positions: int [batch, seq], each token's position in its sequence, in [0, max_len);
        defaults to 0 … seq - 1. For packed rows,
        `packing.segment_positions(segment_ids)`. A relative attention part
        (config.relative_attention) reads their differences, by default of the tokens' indices
        (padding or not, as transformers has it).
      token_types: int [batch, seq] in [0, type_vocab_size) (BERT's segment A = 0, B = 1);
        defaults to zeros. Only for a config with type_vocab_size > 0.
      deterministic: no dropout when True; otherwise dropout draws from the 'dropout' rng.

    Returns:
      [batch, seq, d_model] in config.dtype.
    """
    cfg = self.config
    check_token_shape(tokens, cfg.max_len)
    check_token_values(tokens, cfg.vocab_size, traced=self.check_traced_ids)
    check_packing(segment_ids, positions, tokens.shape, cfg.max_len)
    check_token_types(token_types, tokens.shape, cfg.type_vocab_size)
    batch, seq = tokens.shape

    kernel = KERNELS[cfg.attention_impl]
    if mask is not None:
      check_mask(mask, batch, cfg.n_heads, seq, seq)
    if kernel.takes_segment_ids and mask is not None:
      raise ValueError(f"attention_impl={kernel.name!r} attends by segment ids, not by a "
                       f"mask: pass segment_ids (0 marks padding) or leave both out (the run "
                       f"of pad_id that ends a row is padding)")
    if kernel.takes_segment_ids or (
        cfg.local_attention and kernel.windowed_locals and mask is None):
      # One int per token, never a [seq, seq] mask: the kernels take segment ids, and the
      # local layers of the fused paths attend by windows of them (windowed_attention).
      mask = attention_ids(tokens, cfg.pad_id, segment_ids)
    elif segment_ids is not None:
      packed = segment_mask(segment_ids)
      mask = packed if mask is None else mask & packed
    elif mask is None:
      mask = padding_mask(tokens, cfg.pad_id)

    width = cfg.embedding_width  # of the tables: ALBERT's are narrower than d_model
    embed = Embed(cfg.vocab_size, width, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                  # std width^-0.5: after the sqrt(width) scale the embeddings have unit
                  # variance, the scale of the sinusoids (tensor2tensor's choice).
                  embedding_init=nn.with_logical_partitioning(
                      nn.initializers.normal(stddev=width**-0.5), ("vocab", "embed")),
                  name="embedding")
    # A negative id is out of range like one past the table (NaN rows under a plain jit),
    # not counted back from its end as a gather would.
    x = embed(jnp.where(tokens < 0, cfg.vocab_size, tokens))
    if cfg.embedding_scale:
      x = x * math.sqrt(width)
    if cfg.type_vocab_size:
      types = jnp.zeros_like(tokens) if token_types is None else token_types
      x = x + _table(cfg, cfg.type_vocab_size, "token_type_embedding")(
          jnp.where(types < 0, cfg.type_vocab_size, types))
    if cfg.position_embedding == "sinusoidal":
      x = PositionalEncoding(cfg.max_len, width, name="pos_encoder")(x, positions)
    elif cfg.position_embedding == "learned":
      x = x + _table(cfg, cfg.max_len + cfg.position_offset, "position_embedding")(
          _position_rows(cfg, tokens, positions))
    rotary = positions if cfg.position_embedding == "rotary" else None  # turned in each layer
    if cfg.embedding_norm:
      x = layer_norm(cfg, "embedding_norm")(x)
    x = Dropout(cfg.dropout)(x, deterministic=deterministic)
    if cfg.embedding_size:  # [batch, seq, embedding_size] -> [batch, seq, d_model]
      x = dense(cfg, cfg.d_model, ("embed_factor", "embed"), "embedding_projection")(x)
    x = nn.with_logical_constraint(x, ACTIVATION_AXES)
    bias = _relative_state(cfg, positions, seq)

    layer = _layer_class(cfg)
    if cfg.shared_layers:
      # One layer's parameters ("shared_layer"), applied at each depth by a module of its
      # own ("layers_{i}", without parameters), whose output reads as that depth's.
      shared = layer(cfg, name="shared_layer")
      for i, is_global in enumerate(cfg.global_layers):
        x = Depth(shared, name=f"layers_{i}")(x, mask, deterministic, rotary, is_global, bias)
    elif cfg.scan_layers:
      scan = nn.scan(_scan_body, variable_axes={"params": 0, "intermediates": 0},
                     split_rngs={"params": True, "dropout": True},
                     in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast),
                     length=cfg.n_layers, metadata_params={nn.PARTITION_NAME: "layers"})
      x, _ = scan(layer(cfg, name="layers"), x, jnp.asarray(cfg.global_layers), mask,
                  deterministic, rotary, bias)
    else:
      for i, is_global in enumerate(cfg.global_layers):
        x = layer(cfg, first=i == 0, name=f"layers_{i}")(x, mask, deterministic, rotary,
                                                           is_global, bias)

    if cfg.final_norm:
      x = layer_norm(cfg, "norm")(x)
    return x


class Depth(nn.Module):
  """One depth of a stack whose layers share their parameters: `layer`, which the encoder
  holds, applied here (EncoderLayer's arguments)."""

  layer: nn.Module

  def __call__(self, *args) -> jax.Array:
    return self.layer(*args)


class Embed(nn.Embed):
  """nn.Embed, gathering rows in the parameters' dtype and casting only the rows it gathered.

  nn.Embed casts the whole table to `dtype` before the gather, so under bfloat16 compute the
  gradient of the lookup is a bfloat16 scatter-add: the updates of a row seen thousands of
  times in a batch (the mask token, BERT's token type 0) are summed in bfloat16, and on a GPU
  each is a compare-and-swap loop that such a row serialises (94 ms of a 120 ms training step
  of the paper's base model at 64 x 512 on an H200). The forward values are the same; the
  gradient is summed in the parameters' dtype, as PyTorch's autocast leaves embeddings.
  """

  def __call__(self, inputs: jax.Array) -> jax.Array:
    if self.num_embeddings == 1:  # a broadcast, no gather (nn.Embed's own path)
      return super().__call__(inputs)
    rows = jnp.take(self.embedding, inputs, axis=0)  # an id outside the table reads NaN
    return rows.astype(self.dtype or rows.dtype)


def _table(cfg: EncoderConfig, rows: int, name: str) -> Embed:
  """A learned table of `rows` vectors of the embedding's width (BERT's positions and token
  types), normal with std 0.02 (BERT's initializer_range). An index out of [0, rows) reads
  NaN."""
  return Embed(rows, cfg.embedding_width, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
               embedding_init=nn.with_logical_partitioning(
                   nn.initializers.normal(stddev=0.02), (None, "embed")), name=name)


def _relative_state(cfg: EncoderConfig, positions: jax.Array | None, seq: int):
  """What every layer's attention reads of the relative attention part
  (config.relative_attention, flax_encoder.relative), computed once from the positions and
  its parameters, which sit under the part's `scope`; None without one."""
  if not cfg.relative_attention:
    return None
  part = relative.part(cfg.relative_attention)
  return part.shared(cfg, part.scope)(positions, seq)


def _position_rows(cfg: EncoderConfig, tokens: jax.Array, positions: jax.Array | None):
  """The row of the learned position table each token reads: its position, plus
  position_offset. With a position_offset, RoBERTa's rule as transformers computes it from the
  ids: a sequence's ids other than pad_id count from position_offset, and a pad_id (padding, or
  a literal "<pad>" in the text) reads the row before it and is not counted. A negative
  position reads NaN, as one past the table does."""
  seq = tokens.shape[1]
  index = jnp.broadcast_to(jnp.arange(seq), tokens.shape)
  if not cfg.position_offset:
    rows = index if positions is None else positions
  else:
    counted = (tokens != cfg.pad_id).astype(jnp.int32)
    count = jnp.cumsum(counted, axis=1)  # counted ids up to each, from the row's start
    if positions is not None:  # from the start of each one's sequence
      start = jnp.clip(index - positions, 0, seq - 1)
      count = count - jnp.take_along_axis(count - counted, start, axis=1)
    rows = count * counted + cfg.position_offset - 1
  if positions is None:
    return rows
  return jnp.where(positions < 0, cfg.max_len + cfg.position_offset, rows)


def stack_layers(params: dict, n_layers: int) -> dict:
  """Unscanned params (`layers_0` … `layers_{n-1}`) -> scanned (`layers`, leading axis n)."""
  params = dict(params)
  per_layer = [params.pop(f"layers_{i}") for i in range(n_layers)]
  # numpy stays numpy (and float64 stays float64 without jax_enable_x64).
  stack = lambda *xs: (np.stack if isinstance(xs[0], np.ndarray) else jnp.stack)(xs)
  params["layers"] = jax.tree.map(stack, *per_layer)
  return params


def unstack_layers(params: dict, n_layers: int) -> dict:
  """Scanned params (`layers` with leading axis n) -> unscanned (`layers_0` … `layers_{n-1}`)."""
  params = dict(params)
  stacked = params.pop("layers")
  for i in range(n_layers):
    params[f"layers_{i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return params
