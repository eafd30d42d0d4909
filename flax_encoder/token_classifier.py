"""A token classifier: the encoder, then dropout and a dense layer to one logit per tag at
every position (BERT's BertForTokenClassification).

    model = TokenClassifier(config, num_labels=9)
    logits = model.apply({"params": params}, tokens)   # int [batch, seq] -> [batch, seq, 9]

Its parameters are {"encoder": the Encoder's, "classifier": {"kernel", "bias"}}. With
`head=True` each position first passes through ModernBERT's prediction head ({"head": …},
`heads.PredictionHead`) and the classifier always has a bias, as in transformers'
ModernBertForTokenClassification. Which
positions carry a word's tag (its first sub-token) is the data's business:
`flax_encoder.tokenizer.encode_words` lays the words out and says where each begins.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from flax_encoder.config import EncoderConfig
from flax_encoder.dense import dense
from flax_encoder.dropout import Dropout
from flax_encoder.encoder import Encoder
from flax_encoder.heads import PredictionHead


class TokenClassifier(nn.Module):
  """The encoder, dropout and a dense layer to `num_labels` float32 logits per token (all
  tokens of type 0, as for one text)."""

  config: EncoderConfig
  num_labels: int
  head: bool = False  # ModernBERT's prediction head before the dropout
  check_traced_ids: bool = True  # as Encoder's

  @nn.compact
  def __call__(self, tokens: jax.Array, *, deterministic: bool = True) -> jax.Array:
    """int [batch, seq] -> logits [batch, seq, num_labels], float32."""
    cfg = self.config
    hidden = Encoder(cfg, self.check_traced_ids, name="encoder")(tokens,
                                                                 deterministic=deterministic)
    if self.head:
      hidden = PredictionHead(cfg, name="head")(hidden)
    hidden = Dropout(cfg.dropout)(hidden, deterministic=deterministic)
    logits = dense(cfg, self.num_labels, ("embed", "classes"), "classifier",
                   bias=cfg.dense_bias or self.head)(hidden)
    return logits.astype(jnp.float32)
