"""DistilBERT: BERT's encoder under other names, without token types or a pooler; its
classifier pools through a dense + ReLU pre-classifier (`preset`)."""

from __future__ import annotations

import functools

from flax_encoder.config import EncoderConfig
from flax_encoder.families import bert
from flax_encoder.families.family import (
    ACTIVATIONS,
    Family,
    SequenceClassifier,
    Tokenizers,
    post_ln_stages,
)

SIZES = ("dim", "n_heads", "hidden_dim", "n_layers")


def preset(vocab_size: int, **overrides) -> EncoderConfig:
  """DistilBERT-base: BERT-base of 6 layers, without token types."""
  return bert.preset(vocab_size, **{**dict(n_layers=6, type_vocab_size=0), **overrides})


def _layer(i: int) -> dict:
  at = f"transformer.layer.{i}."
  return {("self_attn", "w_q"): at + "attention.q_lin",
          ("self_attn", "w_k"): at + "attention.k_lin",
          ("self_attn", "w_v"): at + "attention.v_lin",
          ("self_attn", "w_o"): at + "attention.out_lin",
          ("norm1",): at + "sa_layer_norm",
          ("feed_forward", "w_1"): at + "ffn.lin1",
          ("feed_forward", "w_2"): at + "ffn.lin2",
          ("norm2",): at + "output_layer_norm"}


def read(fields, refuse, model_type: str, sizes: dict) -> tuple[str, dict, dict]:
  """(activation, EncoderConfig fields, dropout rates) of a DistilBERT config.json."""
  positions = bert.max_len(fields, 0)
  act = fields.choice("activation", "gelu", ACTIVATIONS)
  return act, dict(max_len=positions), dict(
      dropout=fields.rate("dropout", 0.1),
      attention_dropout=fields.rate("attention_dropout", 0.1))


def write(config: EncoderConfig, act: str) -> dict:
  """DistilBertConfig's fields of `config`."""
  return dict(model_type="distilbert", vocab_size=config.vocab_size, dim=config.d_model,
              n_heads=config.n_heads, hidden_dim=config.d_ff, n_layers=config.n_layers,
              activation=act, max_position_embeddings=config.max_len + config.position_offset,
              dropout=config.dropout, attention_dropout=config.attention_dropout,
              pad_token_id=config.pad_id, sinusoidal_pos_embds=False)


stages = post_ln_stages("transformer.layer.", "sa_layer_norm")


FAMILY = Family(
    name="distilbert", title="DistilBERT", stem="DistilBert",
    model_types={"distilbert": "distilbert."},
    preset=preset, sizes=SIZES, pad_id=0, read=read,
    switches=(*bert.SWITCHES, "type_vocab_size", "layer_norm_eps"), write=write,
    names=functools.partial(bert.names, layer=_layer),
    word_embeddings=bert.EMBEDDINGS[("embedding",)], layers="transformer.layer.",
    masked_lm={("dense",): "vocab_transform", ("norm",): "vocab_layer_norm",
               ("bias",): "vocab_projector.bias"},
    decoder="vocab_projector",
    pooling=lambda hf: "pre_classifier",
    classifier=SequenceClassifier(
        poolings=("pre_classifier",), pools="by 'pre_classifier'",
        denses=(("pre_classifier", ("pooler", "dense")), ("classifier", ("classifier",)))),
    stages=stages,
    # transformers 5 tokenizes it with BERT's tokenizer (bert.py says its token types)
    tokenizers=Tokenizers(classes={"distilbert": "BertTokenizer"},
                          token_types={"DistilBertTokenizer": False}),
)
