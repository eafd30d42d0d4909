"""A masked language model: the encoder, then an output layer to a logit per vocabulary entry,
computed at every position or only at those asked for. What pretraining trains
(`python -m train`'s masked-token task) and what a SPLADE encoder's vectors are pooled from
(`flax_encoder.sparse`).

    model = MaskedLM(config, checkpoint_head=True)      # a Hugging Face *ForMaskedLM's head
    logits = model.apply({"params": params}, tokens)                  # [batch, seq, vocab]
    logits = model.apply({"params": params}, tokens, predict_at)      # [batch, k, vocab]

Its parameters are {"encoder": the Encoder's, and the output layer's: "masked_lm"
(`heads.MaskedLMHead` or `heads.DecoderHead`), "head_bias" (tied to the embedding table) or
"head" (a dense layer of its own)}.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from flax_encoder.config import EncoderConfig
from flax_encoder.dense import dense
from flax_encoder.encoder import Encoder
from flax_encoder.heads import DecoderHead, MaskedLMHead


class MaskedLM(nn.Module):
  """Encoder + an output layer to vocabulary logits. Encoder weights live under 'encoder'.

  Attributes:
    config: the encoder's.
    tie_embeddings: the output layer is the transposed embedding table plus a bias (BERT's
      choice), instead of a dense layer of its own ('head').
    checkpoint_head: BERT's whole head instead (`flax_encoder.heads.MaskedLMHead`, 'masked_lm':
      dense, activation, LayerNorm, then the tied table and a bias), as a Hugging Face
      checkpoint has it; with `decoder_head` too, the checkpoint's untied decoder
      (`heads.DecoderHead`, EuroBERT's).
    head_at_every_position: with `predict_at`, compute the output layer at every position and
      then select (the cost that selecting first saves; benchmarks/head.py compares them).
  """

  config: EncoderConfig
  tie_embeddings: bool = False
  head_at_every_position: bool = False
  checkpoint_head: bool = False
  decoder_head: bool = False
  check_traced_ids: bool = True  # as Encoder's

  @nn.compact
  def __call__(self, tokens: jax.Array, predict_at: jax.Array | None = None, *,
               segment_ids: jax.Array | None = None, positions: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    """int [batch, seq] -> logits [batch, seq, vocab], or at `predict_at` (int [batch, k])
    only: [batch, k, vocab]; in config.dtype. `segment_ids` and `positions` go to the encoder
    (packed rows)."""
    cfg = self.config
    encoder = Encoder(cfg, self.check_traced_ids, name="encoder")
    hidden = encoder(tokens, segment_ids=segment_ids, positions=positions,
                     deterministic=deterministic)
    select = lambda x: jnp.take_along_axis(x, predict_at[..., None], axis=1)
    if predict_at is not None and not self.head_at_every_position:
      hidden = select(hidden)
    if self.checkpoint_head and self.decoder_head:
      logits = DecoderHead(cfg, name="masked_lm")(hidden)
    elif self.checkpoint_head:
      table = nn.meta.unbox(encoder.variables["params"]["embedding"]["embedding"])
      logits = MaskedLMHead(cfg, name="masked_lm")(hidden, table)
    elif self.tie_embeddings:
      table = nn.meta.unbox(encoder.variables["params"]["embedding"]["embedding"])
      bias = self.param("head_bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                                  ("vocab",)),
                        (cfg.vocab_size,), cfg.param_dtype)
      logits = jnp.einsum("bsd,vd->bsv", hidden.astype(cfg.dtype), table.astype(cfg.dtype))
      logits = logits + bias.astype(cfg.dtype)
    else:
      logits = dense(cfg, cfg.vocab_size, ("embed", "vocab"), "head",
                     kernel_init=nn.initializers.lecun_normal())(hidden)
    if predict_at is not None and self.head_at_every_position:
      logits = select(logits)
    return logits
