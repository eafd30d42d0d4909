"""A sequence classifier: the encoder, pooled over the real tokens, then a dense layer to one
logit per class.

    model = SequenceClassifier(config, num_labels=12)          # pooling="mean" or "first"
    logits = model.apply({"params": params}, tokens)         # int [batch, seq] -> [batch, 12]

Its parameters are {"encoder": the Encoder's, "classifier": {"kernel", "bias"}}; dropout
(config.dropout) sits between the pooling and the dense layer. The poolings of the BERT
family add a dense layer on the first token ({"pooler": {"dense": …}}): "pooler", tanh (BERT's
pooler, RoBERTa's classification head), and "pre_classifier", ReLU (DistilBERT's).
ModernBERT's pool the first token ("first_head") or the mean ("mean_head"), then pass it
through its prediction head ({"head": {"dense": …, "norm": …}}, `heads.PredictionHead`); its
classifier always has a bias, as transformers' ModernBertForSequenceClassification's.
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
from flax_encoder.heads import Pooler, PredictionHead

POOLINGS = ("mean", "first", "pooler", "pre_classifier", "first_head", "mean_head")
# ModernBERT's: the pooling before its prediction head.
HEAD_POOLINGS = {"first_head": "first", "mean_head": "mean"}
_POOLER_ACTIVATION = {"pooler": "tanh", "pre_classifier": "relu"}


def pair_token_types(tokens: jax.Array, separator: int) -> jax.Array:
  """BERT's token types of [CLS] a [SEP] b [SEP] rows: 0 up to the first `separator`, 1 after
  it (padding after a single text gets 1 too: no real token attends to it)."""
  seen = jnp.cumsum(tokens == separator, axis=1) - (tokens == separator)
  return (seen > 0).astype(jnp.int32)


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
  """The encoder, pooled, then dropout and a dense layer to `num_labels` float32 logits.

  `type_separator`: for an encoder with token types, the id after whose first occurrence
  tokens are of type 1 (`pair_token_types`); None: all of type 0."""

  config: EncoderConfig
  num_labels: int
  pooling: str = "mean"
  type_separator: int | None = None

  @nn.compact
  def __call__(self, tokens: jax.Array, *, deterministic: bool = True) -> jax.Array:
    """int [batch, seq] -> logits [batch, num_labels], float32."""
    if self.pooling not in POOLINGS:
      raise ValueError(f"pooling: {self.pooling!r}, expected one of {POOLINGS}")
    cfg = self.config
    types = None
    if self.type_separator is not None and cfg.type_vocab_size > 1:
      types = pair_token_types(tokens, self.type_separator)
    hidden = Encoder(cfg, name="encoder")(tokens, token_types=types,
                                          deterministic=deterministic)
    head = self.pooling in HEAD_POOLINGS
    if self.pooling in _POOLER_ACTIVATION:
      pooled = Pooler(cfg, _POOLER_ACTIVATION[self.pooling], name="pooler")(hidden)
    else:
      pooled = pool(hidden, tokens != cfg.pad_id, HEAD_POOLINGS.get(self.pooling, self.pooling))
    if head:
      pooled = PredictionHead(cfg, name="head")(pooled)
    pooled = Dropout(cfg.dropout)(pooled, deterministic=deterministic)
    logits = dense(cfg, self.num_labels, ("embed", "classes"), "classifier",
                   bias=cfg.dense_bias or head)(pooled)
    return logits.astype(jnp.float32)
