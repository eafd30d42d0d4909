"""Position-wise feed-forward network (paper section 3.3): w_2(dropout(act(w_1 x)))."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from flax_encoder.activations import FUNCTIONS
from flax_encoder.config import EncoderConfig
from flax_encoder.dropout import Dropout
from flax_encoder.dense import dense


class PositionwiseFeedForward(nn.Module):
  """Two dense layers d_model -> d_ff -> d_model, dropout after the activation. With
  config.glu, w_1 goes to 2 d_ff: the activation of its first half times its second (GeGLU
  with GELU, ModernBERT's)."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, x: jax.Array, *, deterministic: bool = True) -> jax.Array:
    """[batch, seq, d_model] -> [batch, seq, d_model]."""
    cfg = self.config
    act = FUNCTIONS[cfg.activation]
    if cfg.glu:
      h, gate = jnp.split(dense(cfg, 2 * cfg.d_ff, ("embed", "mlp"), "w_1")(x), 2, axis=-1)
      h = act(h) * gate
    else:
      h = act(dense(cfg, cfg.d_ff, ("embed", "mlp"), "w_1")(x))
    h = Dropout(cfg.dropout)(h, deterministic=deterministic)
    return dense(cfg, cfg.d_model, ("mlp", "embed"), "w_2")(h)
