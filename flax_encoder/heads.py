"""The heads BERT-family checkpoints carry on top of the encoder.

    hidden = Encoder(config).apply(variables, tokens)                 # [batch, seq, d]
    logits = MaskedLMHead(config).apply(
        {"params": variables["heads"]["masked_lm"]}, hidden,
        variables["params"]["embedding"]["embedding"])               # [batch, seq, vocab]
    pooled = Pooler(config).apply({"params": variables["heads"]["pooler"]}, hidden)  # [batch, d]

`MaskedLMHead`: dense d -> d, the config's activation, LayerNorm, then the embedding table
transposed (the decoder tied to the input embedding) plus a bias per token. `Pooler`: BERT's
dense d -> d and tanh on the first token. `flax_encoder.pytorch.load_hf` puts the weights of
those a checkpoint has under `variables["heads"]`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from flax_encoder.config import ACTIVATIONS, EncoderConfig
from flax_encoder.dense import dense
from flax_encoder.layer import layer_norm


class MaskedLMHead(nn.Module):
  """Hidden states -> vocabulary logits through BERT's transform and the tied decoder."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, hidden: jax.Array, embedding: jax.Array) -> jax.Array:
    """hidden [..., d_model] and the embedding table [vocab_size, d_model] -> logits
    [..., vocab_size] in config.dtype."""
    cfg = self.config
    h = ACTIVATIONS[cfg.activation](dense(cfg, cfg.d_model, ("embed", "mlp"), "dense")(hidden))
    h = layer_norm(cfg, "norm")(h)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           ("vocab",)),
                      (cfg.vocab_size,), cfg.param_dtype)
    logits = jnp.einsum("...d,vd->...v", h.astype(cfg.dtype), jnp.asarray(embedding, cfg.dtype))
    return logits + bias.astype(cfg.dtype)


class Pooler(nn.Module):
  """BERT's pooler: tanh(dense(first token's hidden state))."""

  config: EncoderConfig
  activation: str = "tanh"  # DistilBERT's pre-classifier uses "relu"

  @nn.compact
  def __call__(self, hidden: jax.Array) -> jax.Array:
    """[batch, seq, d_model] -> [batch, d_model]."""
    act = {"tanh": jnp.tanh, "relu": jax.nn.relu}[self.activation]
    return act(dense(self.config, self.config.d_model, ("embed", "mlp"), "dense")(hidden[:, 0]))
