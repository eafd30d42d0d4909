"""A sequence classifier: the encoder, pooled over the real tokens, then a dense layer to one
logit per class.

    model = SequenceClassifier(config, num_labels=12)          # pooling="mean" or "first"
    logits = model.apply({"params": params}, tokens)         # int [batch, seq] -> [batch, 12]

Its parameters are {"encoder": the Encoder's, "classifier": {"kernel", "bias"}}; dropout
(config.dropout) sits between the pooling and the dense layer.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder.config import EncoderConfig
from flax_encoder.dense import dense
from flax_encoder.dropout import Dropout
from flax_encoder.encoder import Encoder

POOLINGS = ("mean", "first")


def pool(hidden: jax.Array, real: jax.Array, pooling: str) -> jax.Array:
  """[batch, seq, d] -> [batch, d]: the mean over the real tokens (`real`: bool [batch, seq];
  a row without one pools to 0), or the first token."""
  if pooling == "first":
    return hidden[:, 0]
  weights = real.astype(hidden.dtype)[..., None]
  return jnp.sum(hidden * weights, axis=1) / jnp.maximum(jnp.sum(weights, axis=1), 1)


def macro_f1(true_positives, true, predicted) -> float:
  """The mean F1 over the classes that occur in the labels or the predictions, from each
  class's counts of true positives, labels and predictions ([num_labels] each)."""
  true_positives, true, predicted = (np.asarray(x, np.float64) for x in
                                     (true_positives, true, predicted))
  seen = (true + predicted) > 0
  f1 = 2 * true_positives[seen] / (true + predicted)[seen]
  return float(np.mean(f1)) if f1.size else 0.0


class SequenceClassifier(nn.Module):
  """The encoder, pooled, then dropout and a dense layer to `num_labels` float32 logits."""

  config: EncoderConfig
  num_labels: int
  pooling: str = "mean"

  @nn.compact
  def __call__(self, tokens: jax.Array, *, deterministic: bool = True) -> jax.Array:
    """int [batch, seq] -> logits [batch, num_labels], float32."""
    if self.pooling not in POOLINGS:
      raise ValueError(f"pooling: {self.pooling!r}, expected one of {POOLINGS}")
    cfg = self.config
    hidden = Encoder(cfg, name="encoder")(tokens, deterministic=deterministic)
    pooled = pool(hidden, tokens != cfg.pad_id, self.pooling)
    pooled = Dropout(cfg.dropout)(pooled, deterministic=deterministic)
    logits = dense(cfg, self.num_labels, ("embed", "classes"), "classifier")(pooled)
    return logits.astype(jnp.float32)
