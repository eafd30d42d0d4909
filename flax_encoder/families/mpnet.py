"""MPNet (all-mpnet-base-v2's architecture): BERT's Post-LN encoder without token types, whose
learned positions start after padding id 1 as RoBERTa's do, plus T5's relative position bias
(families/t5_bias.py: one table of scores per head and bucket of relative position that the
encoder adds to every layer's attention scores) (`preset`). Its masked-LM head and classifier
are RoBERTa's. A config.json transformers' MPNet reads otherwise than it says (another
pad_token_id or relative_attention_num_buckets) is refused."""

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
from flax_encoder.families.t5_bias import Part

# transformers' MPNet counts positions from padding id 1 and buckets relative positions by 32,
# whatever config.json's pad_token_id and relative_attention_num_buckets say.
PAD_ID = 1
BUCKETS = 32
# What an MPNet model has as `preset` has it: BERT's switches (its relative attention among
# them) and no token types.
SWITCHES = (*bert.SWITCHES, "type_vocab_size")
EMBEDDINGS = {path: name for path, name in bert.EMBEDDINGS.items()
              if path != ("token_type_embedding",)}
RELATIVE_BIAS = {(Part.scope,): "encoder.relative_attention_bias"}  # the bias's table


def preset(vocab_size: int, **overrides) -> EncoderConfig:
  """MPNet-base (all-mpnet-base-v2's architecture): BERT-base without token types, whose
  positions start after padding id 1 (pad_id 1, position_offset 2, as RoBERTa's), with a
  relative position bias of 32 buckets shared by its layers, LayerNorm eps 1e-5."""
  fields = dict(pad_id=PAD_ID, position_offset=PAD_ID + 1, type_vocab_size=0,
                relative_attention=Part(buckets=BUCKETS).spec(), layer_norm_eps=1e-5)
  return bert.preset(vocab_size, **{**fields, **overrides})


def _layer(i: int) -> dict:
  at = f"encoder.layer.{i}."
  return {("self_attn", "w_q"): at + "attention.attn.q",
          ("self_attn", "w_k"): at + "attention.attn.k",
          ("self_attn", "w_v"): at + "attention.attn.v",
          ("self_attn", "w_o"): at + "attention.attn.o",
          ("norm1",): at + "attention.LayerNorm",
          ("feed_forward", "w_1"): at + "intermediate.dense",
          ("feed_forward", "w_2"): at + "output.dense",
          ("norm2",): at + "output.LayerNorm"}


def names(config: EncoderConfig) -> Iterator[tuple[tuple, str]]:
  """(flax path under params, module name) of each module: the embeddings, the relative
  position bias the layers share, and each layer's modules."""
  yield from EMBEDDINGS.items()
  yield from RELATIVE_BIAS.items()
  for i in range(config.n_layers):
    for path, name in _layer(i).items():
      yield (f"layers_{i}", *path), name


def read(fields: Fields, refuse: Refuse, model_type: str, sizes: dict) -> tuple[str, dict, dict]:
  """(activation, EncoderConfig fields, dropout rates) of an MPNet config.json."""
  if sizes["pad_id"] != PAD_ID:
    refuse("pad_token_id", sizes["pad_id"],
           f"{PAD_ID}: transformers' MPNet counts positions from padding id {PAD_ID}")
  if fields.integer("relative_attention_num_buckets", BUCKETS) != BUCKETS:
    refuse("relative_attention_num_buckets", fields.get("relative_attention_num_buckets"),
           f"{BUCKETS}: transformers' MPNet buckets relative positions by {BUCKETS} whatever "
           f"its table holds")
  act = fields.choice("hidden_act", "gelu", ACTIVATIONS)
  arch = dict(max_len=bert.max_len(fields, PAD_ID + 1),
              layer_norm_eps=fields.number("layer_norm_eps", 1e-12))
  return act, arch, dict(dropout=fields.rate("hidden_dropout_prob", 0.1),
                         attention_dropout=fields.rate("attention_probs_dropout_prob", 0.1))


def write(config: EncoderConfig, act: str) -> dict:
  """MPNetConfig's fields of `config`. The special ids besides padding are None: the caller
  may give a tokenizer's."""
  if config.pad_id != PAD_ID:
    raise HFError(f"this model is not an mpnet model: it has pad_id={config.pad_id}, an mpnet "
                  f"model {PAD_ID} (transformers' MPNet counts positions from it)")
  return dict(model_type="mpnet", vocab_size=config.vocab_size, hidden_size=config.d_model,
              num_attention_heads=config.n_heads, intermediate_size=config.d_ff,
              num_hidden_layers=config.n_layers, hidden_act=act,
              max_position_embeddings=config.max_len + config.position_offset,
              layer_norm_eps=config.layer_norm_eps, hidden_dropout_prob=config.dropout,
              attention_probs_dropout_prob=config.attention_dropout,
              relative_attention_num_buckets=Part.parse(config.relative_attention).buckets,
              pad_token_id=config.pad_id, bos_token_id=None, eos_token_id=None)


FAMILY = Family(
    name="mpnet", title="MPNet", stem="MPNet",
    model_types={"mpnet": "mpnet."},
    preset=preset, sizes=bert.SIZES, pad_id=PAD_ID, null_pad_id=False, read=read,
    switches=SWITCHES, write=write,
    carried=("bos_token_id", "eos_token_id"),
    names=names, word_embeddings=bert.EMBEDDINGS[("embedding",)], layers="encoder.layer.",
    masked_lm={("dense",): "lm_head.dense", ("norm",): "lm_head.layer_norm",
               ("bias",): "lm_head.bias"},
    decoder="lm_head.decoder", decoder_bias=True,
    # RoBERTa's classifier: dense and tanh on the first token, a fresh layer of the pooler's
    # shape (the checkpoint's pooler is not the head's).
    pooling=lambda hf: "pooler",
    classifier=SequenceClassifier(
        poolings=("pooler",), pools="by 'pooler'",
        denses=(("classifier.dense", ("pooler", "dense")),
                ("classifier.out_proj", ("classifier",)))),
    stages=bert.stages,
    tokenizers=Tokenizers(classes={"mpnet": "MPNetTokenizer"},
                          token_types={"MPNetTokenizer": False}),
)
