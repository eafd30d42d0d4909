"""ALBERT: BERT's Post-LN encoder whose embeddings are embedding_size wide, normalised there and
projected to hidden_size, and whose layers are one layer's parameters applied at every depth
(`preset`). Its pooler is one dense layer; its masked-LM head maps back to the
embedding's width before the decoder tied to the word embeddings. A config.json of several
sets of layer parameters (num_hidden_groups or inner_group_num other than 1) is refused, and
so is the export of a model without a factorised embedding."""

from __future__ import annotations

from collections.abc import Iterator

from flax_encoder.config import EncoderConfig
from flax_encoder.families import bert
from flax_encoder.families.family import (
    ACTIVATIONS,
    Family,
    Fields,
    HFError,
    Refuse,
    SequenceClassifier,
    Tokenizers,
)

# What an ALBERT model has as `preset` has it; config.json gives embedding_size.
SWITCHES = tuple(name for name in bert.SWITCHES if name != "embedding_size")
# The one layer every depth applies: transformers' group 0, its layer 0 (num_hidden_groups and
# inner_group_num 1, the published models').
LAYER = "encoder.albert_layer_groups.0.albert_layers.0"
_LAYER = {("self_attn", "w_q"): "attention.query", ("self_attn", "w_k"): "attention.key",
          ("self_attn", "w_v"): "attention.value", ("self_attn", "w_o"): "attention.dense",
          ("norm1",): "attention.LayerNorm", ("feed_forward", "w_1"): "ffn",
          ("feed_forward", "w_2"): "ffn_output", ("norm2",): "full_layer_layer_norm"}
PROJECTION = "encoder.embedding_hidden_mapping_in"


def preset(vocab_size: int, **overrides) -> EncoderConfig:
  """ALBERT-base (v2): BERT-base whose embeddings are 128 wide, projected to d_model, and
  whose 12 layers are one layer's parameters applied 12 times; GELU's tanh form, no
  dropout."""
  fields = dict(embedding_size=128, shared_layers=True, activation="gelu_tanh", dropout=0.0)
  return bert.preset(vocab_size, **{**fields, **overrides})


def names(config: EncoderConfig) -> Iterator[tuple[tuple, str]]:
  """(flax path under params, module name) of each module: BERT's embeddings, the projection
  and the shared layer's modules, once."""
  for path, name in bert.EMBEDDINGS.items():
    if path != ("token_type_embedding",) or config.type_vocab_size:
      yield path, name
  yield ("embedding_projection",), PROJECTION
  for path, name in _LAYER.items():
    yield ("shared_layer", *path), f"{LAYER}.{name}"


def read(fields: Fields, refuse: Refuse, model_type: str, sizes: dict) -> tuple[str, dict, dict]:
  """(activation, EncoderConfig fields, dropout rates) of an ALBERT config.json."""
  for option in ("num_hidden_groups", "inner_group_num"):
    if fields.integer(option, 1) != 1:
      refuse(option, fields.get(option), "1: one layer's parameters at every depth")
  act = fields.choice("hidden_act", "gelu_new", ACTIVATIONS)
  arch = dict(max_len=bert.max_len(fields, 0), embedding_size=fields.integer("embedding_size", 128),
              layer_norm_eps=fields.number("layer_norm_eps", 1e-12),
              type_vocab_size=fields.integer("type_vocab_size", 2))
  return act, arch, dict(dropout=fields.rate("hidden_dropout_prob", 0.0),
                         attention_dropout=fields.rate("attention_probs_dropout_prob", 0.0))


def write(config: EncoderConfig, act: str) -> dict:
  """AlbertConfig's fields of `config`. The special ids are None: the caller may give a
  tokenizer's."""
  if not config.embedding_size:
    raise HFError("this model is not an albert model: it has embedding_size=0, an albert model "
                  "a factorised embedding (embedding_size > 0)")
  return dict(model_type="albert", vocab_size=config.vocab_size,
              embedding_size=config.embedding_size, hidden_size=config.d_model,
              num_attention_heads=config.n_heads, intermediate_size=config.d_ff,
              num_hidden_layers=config.n_layers, num_hidden_groups=1, inner_group_num=1,
              hidden_act=act, max_position_embeddings=config.max_len,
              type_vocab_size=config.type_vocab_size, layer_norm_eps=config.layer_norm_eps,
              hidden_dropout_prob=config.dropout,
              attention_probs_dropout_prob=config.attention_dropout,
              pad_token_id=config.pad_id, bos_token_id=None, eos_token_id=None)


def stages(n_layers: int) -> list[tuple[str, str, str]]:
  """The embeddings at their width, their projection, then the shared layer at each depth (its
  i-th call)."""
  points = [("embeddings", "embedding_norm", "embeddings"),
            (PROJECTION, "embedding_projection", PROJECTION)]
  return points + [(f"albert_layers.0[{i}]", f"layers_{i}", LAYER) for i in range(n_layers)]


FAMILY = Family(
    name="albert", title="ALBERT", stem="Albert",
    model_types={"albert": "albert."},
    preset=preset, sizes=bert.SIZES, pad_id=0, fixed=bert.FIXED, read=read,
    switches=SWITCHES, token_types=True, write=write,
    carried=("bos_token_id", "eos_token_id", "classifier_dropout_prob"),
    names=names, word_embeddings=bert.EMBEDDINGS[("embedding",)],
    layers="encoder.albert_layer_groups.",
    masked_lm={("dense",): "predictions.dense", ("norm",): "predictions.LayerNorm",
               ("bias",): "predictions.bias"},
    decoder="predictions.decoder", decoder_bias=True, pooler="pooler",
    pooling=lambda hf: "pooler",
    classifier=SequenceClassifier(
        poolings=("pooler",), pools="by 'pooler'",
        denses=(("albert.pooler", ("pooler", "dense")), ("classifier", ("classifier",))),
        from_pooler=True),
    stages=stages,
    # its models have token types, but its tokenizer gives none
    tokenizers=Tokenizers(classes={"albert": "AlbertTokenizer"},
                          token_types={"AlbertTokenizer": False}),
)
