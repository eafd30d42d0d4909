"""GTE (transformers' `gte`: gte-base-en-v1.5's and gte-multilingual's encoder): NomicBERT's
encoder (nomic_bert.py) with biases on every dense module but the gated feed-forward's first,
GeGLU, rotary base 160,000, one token type or none, and a RoBERTa-like masked-LM head whose
activation is GELU whatever the layers use."""

from __future__ import annotations

import functools

from flax_encoder.config import EncoderConfig
from flax_encoder.families import bert, nomic_bert
from flax_encoder.families.family import Chunks, Family, Fields, Refuse, Tokenizers

SWITCHES = (*nomic_bert.SWITCHES, "activation")
EMBEDDINGS = {**nomic_bert.EMBEDDINGS, ("embedding_norm",): "embeddings.LayerNorm"}


def _layer(i: int) -> dict:
  """Layer i's modules but q, k and v (one matrix, Family.qkv), as transformers 5 saves them
  (gte-base-en-v1.5's names): up_gate_proj holds the up projection, then the gate."""
  at = f"encoder.layer.{i}."
  return {("self_attn", "w_o"): at + "attention.o_proj", ("norm1",): at + "attn_ln",
          ("feed_forward", "w_1"): Chunks(at + "mlp.up_gate_proj", (1, 0)),
          ("feed_forward", "w_2"): at + "mlp.down_proj", ("norm2",): at + "mlp_ln"}


def preset(vocab_size: int, **overrides) -> EncoderConfig:
  """gte-base-en-v1.5's encoder: NomicBERT's with biases but on the gate and up projections,
  GeGLU, one token type, rotary base 160,000 over 8,192 positions, pad id 1, dropout 0.1."""
  fields = dict(max_len=8192, rope_theta=160000.0, type_vocab_size=1, unbiased="w_1",
                activation="gelu", pad_id=1, dropout=0.1)
  return nomic_bert.preset(vocab_size, **{**fields, **overrides})


def read(fields: Fields, refuse: Refuse, model_type: str, sizes: dict) -> tuple[str, dict, dict]:
  """(activation, EncoderConfig fields, dropout rates) of a GteConfig's config.json."""
  act = nomic_bert.gelu_only(fields, refuse)
  arch = dict(max_len=fields.integer("max_position_embeddings", 8192),
              rope_theta=nomic_bert.rope_theta(fields, refuse, sizes, 160000.0),
              type_vocab_size=fields.integer("type_vocab_size", 1, "an integer >= 0",
                                             lambda n: n >= 0),
              layer_norm_eps=fields.number("layer_norm_eps", 1e-12))
  return act, arch, dict(dropout=fields.rate("hidden_dropout_prob", 0.1),
                         attention_dropout=fields.rate("attention_probs_dropout_prob", 0.0))


FAMILY = Family(
    name="gte", title="GTE", stem="Gte",
    model_types={"gte": "gte."},
    preset=preset, sizes=bert.SIZES, pad_id=1, read=read,
    switches=SWITCHES, write=functools.partial(nomic_bert.write, model_type="gte"),
    names=functools.partial(nomic_bert.names, embeddings=EMBEDDINGS, layer=_layer),
    word_embeddings=EMBEDDINGS[("embedding",)], layers="encoder.layer.",
    qkv="encoder.layer.{i}.attention.qkv_proj",
    masked_lm={("dense",): "lm_head.dense", ("norm",): "lm_head.norm",
               ("bias",): "lm_head.decoder.bias"},
    decoder="lm_head.decoder",
    pooling=lambda hf: "pooler",
    classifier=nomic_bert.classifier("gte."),
    stages=nomic_bert.stages,
    # XLM-RoBERTa's tokenizer (roberta.py says its token types)
    tokenizers=Tokenizers(classes={"gte": "XLMRobertaTokenizer"}, token_types={}),
)
