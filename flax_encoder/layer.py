"""One encoder layer: self-attention and feed-forward, each with residual and LayerNorm."""

from __future__ import annotations

import flax.linen as nn
import jax

from flax_encoder.attention import MultiHeadAttention
from flax_encoder.config import EncoderConfig
from flax_encoder.dropout import Dropout
from flax_encoder.feed_forward import PositionwiseFeedForward
from flax_encoder.norm import layer_norm
from flax_encoder.sharding import ACTIVATION_AXES


class EncoderLayer(nn.Module):
  """One layer, Post-LN (the paper's) or Pre-LN.

  Post-LN: x = norm(x + dropout(sublayer(x))). Pre-LN: x = x + dropout(sublayer(norm(x))).
  """

  config: EncoderConfig
  first: bool = False  # layer 0: without config.first_attention_norm, no norm before attention

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None = None,
               deterministic: bool = True, positions: jax.Array | None = None,
               is_global: bool | jax.Array = True, bias: jax.Array | None = None) -> jax.Array:
    """[batch, seq, d_model] -> [batch, seq, d_model]; `mask`, `positions` (rotary),
    `is_global` (False: the local window) and `bias` (on the scores) as in
    MultiHeadAttention."""
    cfg = self.config
    attend = lambda h: MultiHeadAttention(cfg, name="self_attn")(
        h, mask=mask, deterministic=deterministic, positions=positions, is_global=is_global,
        bias=bias)
    feed_forward = lambda h: PositionwiseFeedForward(cfg, name="feed_forward")(
        h, deterministic=deterministic)
    dropout = lambda h: Dropout(cfg.dropout)(h, deterministic=deterministic)
    norm1, norm2 = layer_norm(cfg, "norm1"), layer_norm(cfg, "norm2")
    if self.first and not cfg.first_attention_norm:
      norm1 = lambda h: h

    if cfg.norm_position == "post":
      x = norm1(x + dropout(attend(x)))
      x = norm2(x + dropout(feed_forward(x)))
    else:
      x = x + dropout(attend(norm1(x)))
      x = x + dropout(feed_forward(norm2(x)))
    return nn.with_logical_constraint(x, ACTIVATION_AXES)
