"""Attention masks. Polarity everywhere in this package: True = attend, False = masked out.

Shapes: b = batch, h = heads, q = query positions, k = key positions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def text_tokens(tokens: jax.Array, pad_id: int = 0) -> jax.Array:
  """bool [batch, seq]: True up to each row's last id other than `pad_id`. The run of pad_id
  that ends a row is the padding a tokenizer added; a pad_id among a text's own ids (a literal
  "[PAD]" or "<pad>" in the text) is the text's, as the tokenizer's attention mask has it."""
  text = tokens != pad_id
  return jnp.flip(jnp.cumsum(jnp.flip(text, 1), 1), 1) > 0


def padding_mask(tokens: jax.Array, pad_id: int = 0) -> jax.Array:
  """The key-padding mask: `text_tokens(tokens, pad_id)[:, None, None, :]`.

  Args:
    tokens: int ids, [batch, seq].
    pad_id: the id a row is padded with (at its end).

  Returns:
    bool mask, [batch, 1, 1, seq]; True where the key is the row's text.
  """
  return text_tokens(tokens, pad_id)[:, None, None, :]


def check_mask(mask, batch: int, heads: int, q_len: int, k_len: int) -> None:
  """Raises unless `mask` is a 4-D bool array broadcastable to [batch, heads, q_len, k_len].
  Fewer dimensions are refused, not broadcast from the right: a [batch, q, k] mask would be
  read as [heads, q, k] whenever batch equals the head count."""
  target = (batch, heads, q_len, k_len)
  dtype = getattr(mask, "dtype", None)
  if dtype is None or np.dtype(dtype) != np.bool_:
    raise TypeError(
        f"mask must be a bool array (True = attend), got "
        f"{type(mask).__name__} of dtype {dtype}; build one with padding_mask(tokens) or "
        f"`mask != 0`")
  shape = tuple(mask.shape)
  if len(shape) != 4:
    raise ValueError(
        f"mask of shape {shape}: expected 4-D [batch, heads or 1, q or 1, k] = {target}; a "
        f"[batch, k] padding mask is mask[:, None, None, :], a [batch, q, k] one mask[:, None]")
  try:
    broadcast = np.broadcast_shapes(shape, target)
  except ValueError:
    broadcast = None
  if broadcast != target:
    raise ValueError(
        f"mask of shape {shape} does not broadcast to [batch, heads, q, k] = {target}; "
        f"expected e.g. [{batch}, 1, 1, {k_len}] (key padding) or [{batch}, 1, {q_len}, {k_len}]")
