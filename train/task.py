"""Masked-token prediction: the encoder plus an output layer, and its losses."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from flax_encoder import Encoder, EncoderConfig
from flax_encoder.sharding import dense


class MaskedLM(nn.Module):
  """Encoder + a dense layer to vocabulary logits. Encoder weights live under 'encoder'."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, tokens: jax.Array, *, deterministic: bool = True) -> jax.Array:
    """int [batch, seq] -> logits [batch, seq, vocab] in config.dtype."""
    cfg = self.config
    hidden = Encoder(cfg, name="encoder")(tokens, deterministic=deterministic)
    return dense(cfg, cfg.vocab_size, ("embed", "vocab"), "head",
                 kernel_init=nn.initializers.lecun_normal())(hidden)


def smoothed_loss(logits, targets, weights, label_smoothing: float) -> jax.Array:
  """Mean label-smoothed cross-entropy over the weighted (masked) positions."""
  logits = logits.astype(jnp.float32)
  labels = optax.smooth_labels(jax.nn.one_hot(targets, logits.shape[-1]), label_smoothing)
  losses = optax.softmax_cross_entropy(logits, labels)
  return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def eval_sums(logits, targets, weights, baseline_token: int) -> dict:
  """Sums over masked positions: cross-entropy (no smoothing), correct, baseline correct."""
  logits = logits.astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return {"ce": jnp.sum(ce * weights),
          "correct": jnp.sum((jnp.argmax(logits, -1) == targets) * weights),
          "baseline_correct": jnp.sum((targets == baseline_token) * weights),
          "count": jnp.sum(weights)}
