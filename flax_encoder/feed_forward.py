"""Position-wise feed-forward network (paper section 3.3): w_2(dropout(act(w_1 x)))."""

from __future__ import annotations

import flax.linen as nn
import jax

from flax_encoder.config import ACTIVATIONS, EncoderConfig
from flax_encoder.dropout import Dropout
from flax_encoder.dense import dense


class PositionwiseFeedForward(nn.Module):
  """Two dense layers d_model -> d_ff -> d_model, dropout after the activation."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, x: jax.Array, *, deterministic: bool = True) -> jax.Array:
    """[batch, seq, d_model] -> [batch, seq, d_model]."""
    cfg = self.config
    h = ACTIVATIONS[cfg.activation](dense(cfg, cfg.d_ff, ("embed", "mlp"), "w_1")(x))
    h = Dropout(cfg.dropout)(h, deterministic=deterministic)
    return dense(cfg, cfg.d_model, ("mlp", "embed"), "w_2")(h)
