"""Packed rows: several sequences in one row of tokens, told apart by segment ids.

Segment ids are ints [batch, seq]: the tokens of one sequence share an id, 0 marks padding.
`Encoder(config)(tokens, segment_ids=..., positions=...)` then encodes each sequence as if it
were alone in its row: a token attends only to tokens of its own segment, and its position in
the sinusoid table counts from its sequence's first token (`segment_positions`).

Shapes: b = batch, q = query positions, k = key positions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flax_encoder.masks import text_tokens

# The ids a packed text takes at least, which bounds the texts a row of s ids holds (s // it,
# `segments_per_row`): what each packs, and why its bound is where it is.
LEAST_IDS = {
    "text": 4,  # a text embedded or scored ([CLS] x [SEP] is 3): the sentence encoders
    # an example fine-tuned (classify, regress, tag): 16 in 128, which short texts (tens of
    # ids) never reach, in half the logits of 4's
    "example": 8,
}


def segments_per_row(length: int, packs: str = "text") -> int:
  """The texts (`packs`: "text", "example": LEAST_IDS) a packed row of `length` ids holds at
  most: the second axis of what is computed of them."""
  return max(1, length // LEAST_IDS[packs])


def segment_mask(segment_ids: jax.Array) -> jax.Array:
  """bool [batch, 1, q, k]: True where query and key belong to the same segment and the key is
  not padding (segment 0)."""
  same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
  return same & (segment_ids != 0)[:, None, None, :]


def attention_ids(tokens: jax.Array, pad_id: int,
                  segment_ids: jax.Array | None = None) -> jax.Array:
  """int32 [batch, seq]: one int per token that says whom it attends to, for the attention
  paths that build no [seq, seq] mask. Its magnitude is the token's segment and its sign says
  whether other tokens may attend to it: a query attends to a key iff the key's id is positive
  and equals the magnitude of the query's. Unpacked, the row's text is 1 and its padding -1
  (`padding_mask(tokens)`); packed, the ids are `segment_ids`, padding 0
  (`segment_mask(segment_ids)`); `ids_mask` is the mask they stand for."""
  if segment_ids is not None:
    return jnp.asarray(segment_ids, jnp.int32)
  return jnp.where(text_tokens(tokens, pad_id), 1, -1).astype(jnp.int32)


def ids_mask(ids: jax.Array) -> jax.Array:
  """bool [batch, 1, q, k], the mask that `attention_ids` stands for."""
  key = ids[:, None, None, :]
  return (key > 0) & (key == jnp.abs(ids)[:, None, :, None])


def segment_positions(segment_ids: jax.Array) -> jax.Array:
  """int32 [batch, seq]: each token's index within the run of equal segment ids it belongs to
  (0 at every change of id), the `positions` that encode each packed sequence as if alone."""
  batch, seq = segment_ids.shape
  index = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq))
  starts = jnp.concatenate([jnp.ones((batch, 1), bool),
                            segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
  first = jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
  return index - first
