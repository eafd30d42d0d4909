"""Jina embeddings v3 (transformers' `jina_embeddings_v3`): XLM-RoBERTa's Post-LN encoder with
rotary positions (base 20,000) in place of the position table, saved under its published
names (`emb_ln`, `mixer.Wqkv`, `mlp.fc1`); RoBERTa's masked-LM head, whose activation is GELU
whatever the layers use, and its classification head. The task LoRA adapters of the published
checkpoints are not transformers' model: weights holding them are refused."""

from __future__ import annotations

import functools

from flax_encoder.config import EncoderConfig
from flax_encoder.families import bert, nomic_bert, roberta
from flax_encoder.families.family import Family, Fields, Refuse, Tokenizers

SWITCHES = (*nomic_bert.SWITCHES, "activation")
EMBEDDINGS = nomic_bert.EMBEDDINGS


def preset(vocab_size: int, **overrides) -> EncoderConfig:
  """jina-embeddings-v3's encoder (XLM-RoBERTa-large's sizes): hidden 1024, 16 heads, 24
  layers, intermediate 4096, rotary base 20,000 over 8,194 positions, one token type, a plain
  GELU feed-forward layer, biases everywhere, pad id 1, LayerNorm eps 1e-5, dropout 0.1."""
  fields = dict(d_model=1024, n_heads=16, d_ff=4096, n_layers=24, max_len=8194,
                rope_theta=20000.0, type_vocab_size=1, glu=False, unbiased="",
                activation="gelu", pad_id=1, layer_norm_eps=1e-5, dropout=0.1)
  return nomic_bert.preset(vocab_size, **{**fields, **overrides})


def _layer(i: int) -> dict:
  """Layer i's modules but q, k and v (one matrix, Family.qkv)."""
  at = f"encoder.layers.{i}."
  return {("self_attn", "w_o"): at + "mixer.out_proj", ("norm1",): at + "norm1",
          ("feed_forward", "w_1"): at + "mlp.fc1", ("feed_forward", "w_2"): at + "mlp.fc2",
          ("norm2",): at + "norm2"}


def read(fields: Fields, refuse: Refuse, model_type: str, sizes: dict) -> tuple[str, dict, dict]:
  """(activation, EncoderConfig fields, dropout rates) of a JinaEmbeddingsV3Config's
  config.json."""
  act = nomic_bert.gelu_only(fields, refuse)
  arch = dict(max_len=fields.integer("max_position_embeddings", 8194),
              rope_theta=nomic_bert.rope_theta(fields, refuse, sizes, 20000.0),
              type_vocab_size=fields.integer("type_vocab_size", 1),
              layer_norm_eps=fields.number("layer_norm_eps", 1e-5))
  return act, arch, dict(dropout=fields.rate("hidden_dropout_prob", 0.1),
                         attention_dropout=fields.rate("attention_probs_dropout_prob", 0.1))


FAMILY = Family(
    name="jina_embeddings_v3", title="Jina embeddings v3", stem="JinaEmbeddingsV3",
    model_types={"jina_embeddings_v3": "roberta."},
    preset=preset, sizes=bert.SIZES, pad_id=1, read=read,
    switches=SWITCHES, token_types=True,
    write=functools.partial(nomic_bert.write, model_type="jina_embeddings_v3"),
    carried=("bos_token_id", "eos_token_id"),
    names=functools.partial(nomic_bert.names, embeddings=EMBEDDINGS, layer=_layer),
    word_embeddings=EMBEDDINGS[("embedding",)], layers="encoder.layers.",
    qkv="encoder.layers.{i}.mixer.Wqkv",
    masked_lm=roberta.FAMILY.masked_lm, decoder=roberta.FAMILY.decoder,
    pooling=lambda hf: "pooler",
    classifier=roberta.FAMILY.classifier,
    stages=nomic_bert.stages,
    refused_weights=("lora_A", "lora_B"),
    # XLM-RoBERTa's tokenizer (roberta.py says its token types)
    tokenizers=Tokenizers(classes={"jina_embeddings_v3": "XLMRobertaTokenizer"}, token_types={}),
)
