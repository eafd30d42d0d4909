"""A sequence classifier: the encoder, pooled over the real tokens, then a dense layer to one
logit per class.

    model = SequenceClassifier(config, num_labels=12)          # pooling="mean" or "first"
    logits = model.apply({"params": params}, tokens)         # int [batch, seq] -> [batch, 12]
    logits = model.apply({"params": params}, tokens, segment_ids)  # -> [batch, segments, 12]

Its parameters are {"encoder": the Encoder's, "classifier": {"kernel", "bias"}}; dropout
(config.dropout) sits between the pooling and the dense layer. The poolings of the BERT
family add a dense layer on the first token ({"pooler": {"dense": …}}): "pooler", tanh (BERT's
pooler, RoBERTa's classification head), and "pre_classifier", ReLU (DistilBERT's).
ModernBERT's pool the first token ("first_head") or the mean ("mean_head"), then pass it
through its prediction head ({"head": {"dense": …, "norm": …}}, `heads.PredictionHead`); its
classifier always has a bias, as transformers' ModernBertForSequenceClassification's.

Packed rows (several short examples in one row, `flax_encoder.packing`): with segment ids
(1 … k in a row, 0 at padding) each example is encoded as if alone (it attends to its own
segment, its positions and a pair's token types restart at its first token) and pooled on its
own (its first token, or the mean of its tokens), to logits [batch, max_segments, classes]: an
example's logits are those it has alone in a padded row. The parameters are the same either way.
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
from flax_encoder import packing
from flax_encoder.packing import segment_positions
from flax_encoder.pooling import one_text_a_row, pool

# A classifier's pooling -> the pooling mode it starts from (flax_encoder.pooling's names).
MODES = {"mean": "mean", "first": "cls", "pooler": "cls", "pre_classifier": "cls",
         "first_head": "cls", "mean_head": "mean", "first_gelu": "cls", "mean_gelu": "mean"}
POOLINGS = tuple(MODES)
# ModernBERT's: the pooled state then its prediction head.
HEAD_POOLINGS = {name: MODES[name] for name in ("first_head", "mean_head")}
# A dense layer ({"pooler": {"dense": …}}) and its activation on the pooled state: BERT's
# pooler, DistilBERT's pre-classifier, EuroBERT's dense layer and GELU.
_POOLER = {"pooler": "tanh", "pre_classifier": "relu", "first_gelu": "gelu", "mean_gelu": "gelu"}


def segments_per_row(seq_len: int) -> int:
  """The examples a packed row of `seq_len` ids holds at most: its logits' second axis."""
  return packing.segments_per_row(seq_len, "example")


def pair_token_types(tokens: jax.Array, separator: int,
                     segment_ids: jax.Array | None = None) -> jax.Array:
  """BERT's token types of [CLS] a [SEP] b [SEP] rows: 0 up to the first `separator`, 1 after
  it (padding after a single text gets 1 too: no real token attends to it). In packed rows
  (`segment_ids`), the first separator of each segment's own."""
  is_separator = (tokens == separator).astype(jnp.int32)
  seen = jnp.cumsum(is_separator, axis=1) - is_separator  # the separators before each token
  if segment_ids is not None:  # less those before its segment's first token
    first = jnp.arange(tokens.shape[1]) - segment_positions(segment_ids)
    seen = seen - jnp.take_along_axis(seen, first, axis=1)
  return (seen > 0).astype(jnp.int32)


def second_text_types(second_starts, length: int) -> jax.Array:
  """int32 [..., length]: a pair's token types as the tokenizer gives them, 0 before its second
  text and 1 from it on (`second_starts` [...]: where each pair's second text begins), whatever
  separators the first text spells."""
  return (jnp.arange(length) >= jnp.asarray(second_starts)[..., None]).astype(jnp.int32)


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
  tokens are of type 1 (`pair_token_types`); None: all of type 0. `max_segments`: the segments
  a packed row's logits have (`segment_ids` from 1 to it); None: `segments_per_row(seq)`."""

  config: EncoderConfig
  num_labels: int
  pooling: str = "mean"
  type_separator: int | None = None
  max_segments: int | None = None
  check_traced_ids: bool = True  # as Encoder's

  @nn.compact
  def __call__(self, tokens: jax.Array, segment_ids: jax.Array | None = None, *,
               token_types: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """int [batch, seq] -> logits [batch, num_labels], float32; with `segment_ids` (int
    [batch, seq], packed rows) each segment's: [batch, max_segments, num_labels].
    `token_types` (int [batch, seq], as the tokenizer typed a pair's texts) are taken over the
    `type_separator` rule, which a first text that spells the separator misleads."""
    if self.pooling not in POOLINGS:
      raise ValueError(f"pooling: {self.pooling!r}, expected one of {POOLINGS}")
    cfg = self.config
    types, positions = token_types, None
    if types is None and self.type_separator is not None and cfg.type_vocab_size > 1:
      types = pair_token_types(tokens, self.type_separator, segment_ids)
    if segment_ids is not None:  # each example as if alone: positions from its first token
      positions = segment_positions(segment_ids)
    hidden = Encoder(cfg, self.check_traced_ids, name="encoder")(
        tokens, segment_ids=segment_ids, positions=positions, token_types=types,
        deterministic=deterministic)
    head = self.pooling in HEAD_POOLINGS
    if segment_ids is None:  # a text a row; the pad ids that end it are padding, as the encoder's
      ids, at = one_text_a_row(tokens, cfg.pad_id)
      pooled, _ = pool((MODES[self.pooling],), hidden, ids, at, 1)
    else:
      segments = self.max_segments or segments_per_row(tokens.shape[1])
      pooled, present = pool((MODES[self.pooling],), hidden, segment_ids, positions, segments)
      pooled = jnp.where(present[:, None], pooled, 0).reshape(tokens.shape[0], segments, -1)
    pooled = pooled.astype(hidden.dtype)
    if self.pooling in _POOLER:  # a dense layer on each sequence's pooled state
      pooler = Pooler(cfg, _POOLER[self.pooling], name="pooler")
      pooled = pooler(pooled.reshape(-1, 1, pooled.shape[-1])).reshape(pooled.shape)
    if head:
      pooled = PredictionHead(cfg, name="head")(pooled)
    pooled = Dropout(cfg.dropout)(pooled, deterministic=deterministic)
    logits = dense(cfg, self.num_labels, ("embed", "classes"), "classifier",
                   bias=cfg.dense_bias or head)(pooled)
    return logits.astype(jnp.float32)
