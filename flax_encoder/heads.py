"""The heads BERT-family and ModernBERT checkpoints carry on top of the encoder.

    hidden = Encoder(config).apply(variables, tokens)                 # [batch, seq, d]
    logits = MaskedLMHead(config).apply(
        {"params": variables["heads"]["masked_lm"]}, hidden,
        variables["params"]["embedding"]["embedding"])               # [batch, seq, vocab]
    pooled = Pooler(config).apply({"params": variables["heads"]["pooler"]}, hidden)  # [batch, d]

`MaskedLMHead`: dense d -> the embedding's width (d, or ALBERT's embedding_size), the config's
activation, LayerNorm, then the embedding table transposed (the decoder tied to the input
embedding) plus a bias per token. `Pooler`: BERT's dense d -> d and tanh on the first token
(ALBERT's too). `PredictionHead`: ModernBERT's `head`, the masked-LM head's first three steps
alone (dense, activation, LayerNorm), which its classifiers apply to the pooled or per-token
hidden states. `flax_encoder.families.load_hf` puts the weights of those a checkpoint has
under `variables["heads"]`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from flax_encoder.activations import FUNCTIONS
from flax_encoder.config import EncoderConfig
from flax_encoder.dense import dense
from flax_encoder.layer import layer_norm


def _transform(cfg: EncoderConfig, hidden: jax.Array, width: int) -> jax.Array:
  """LayerNorm(activation(dense(hidden))), d -> width: its modules "dense" and "norm" belong
  to the module that calls it."""
  h = FUNCTIONS[cfg.activation](dense(cfg, width, ("embed", "mlp"), "dense")(hidden))
  return layer_norm(cfg, "norm")(h)


class MaskedLMHead(nn.Module):
  """Hidden states -> vocabulary logits through BERT's transform and the tied decoder."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, hidden: jax.Array, embedding: jax.Array) -> jax.Array:
    """hidden [..., d_model] and the embedding table [vocab_size, config.embedding_width] ->
    logits [..., vocab_size] in config.dtype."""
    cfg = self.config
    if tuple(embedding.shape) != (cfg.vocab_size, cfg.embedding_width):
      raise ValueError(f"embedding: shape {tuple(embedding.shape)}, expected the encoder's table "
                       f"[vocab_size, embedding_width] = "
                       f"{[cfg.vocab_size, cfg.embedding_width]}")
    h = _transform(cfg, hidden, cfg.embedding_width)  # [..., embedding_width]
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           ("vocab",)),
                      (cfg.vocab_size,), cfg.param_dtype)
    logits = jnp.einsum("...d,vd->...v", h.astype(cfg.dtype), jnp.asarray(embedding, cfg.dtype))
    return logits + bias.astype(cfg.dtype)


class DecoderHead(nn.Module):
  """An untied masked-LM decoder (EuroBERT's lm_head): hidden states -> vocabulary logits by
  one dense layer of its own ("decoder", its bias as config.has_bias says)."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, hidden: jax.Array) -> jax.Array:
    """[..., d_model] -> logits [..., vocab_size] in config.dtype."""
    cfg = self.config
    return dense(cfg, cfg.vocab_size, ("embed", "vocab"), "decoder")(hidden)


class Pooler(nn.Module):
  """BERT's pooler: tanh(dense(first token's hidden state))."""

  config: EncoderConfig
  activation: str = "tanh"  # DistilBERT's pre-classifier uses "relu", EuroBERT's "gelu"

  @nn.compact
  def __call__(self, hidden: jax.Array) -> jax.Array:
    """[batch, seq, d_model] -> [batch, d_model]."""
    act = FUNCTIONS[self.activation]
    return act(dense(self.config, self.config.d_model, ("embed", "mlp"), "dense")(hidden[:, 0]))


class PredictionHead(nn.Module):
  """ModernBERT's prediction head: LayerNorm(activation(dense(hidden))), d -> d, at every
  position given (biases as config.dense_bias and config.norm_bias say)."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, hidden: jax.Array) -> jax.Array:
    """[..., d_model] -> [..., d_model] in config.dtype."""
    return _transform(self.config, hidden, self.config.d_model)
