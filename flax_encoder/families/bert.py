"""BERT, and ELECTRA's discriminator where its embedding_size is its hidden_size: Post-LN,
learned positions and token types, a LayerNorm on the embeddings, none at the end
(`preset`). RoBERTa and DistilBERT are this encoder under other names and ids
(roberta.py, distilbert.py), and share its pieces here.
"""

from __future__ import annotations

from collections.abc import Iterator

from flax_encoder.config import EncoderConfig
from flax_encoder.families.family import (
    ACTIVATIONS,
    Family,
    Fields,
    Refuse,
    SequenceClassifier,
    Tokenizers,
    post_ln_stages,
)

SIZES = ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers")
# What a BERT-family model has as `preset` has it (config.json says the rest).
SWITCHES = ("position_embedding", "embedding_scale", "embedding_norm", "final_norm",
            "norm_position", "glu", "dense_bias", "norm_bias", "local_attention",
            "position_offset", "embedding_size", "shared_layers", "relative_attention", "unbiased")
# transformers 4's relative positions are another model.
FIXED = {"position_embedding_type": ("absolute", "absolute")}
EMBEDDINGS = {("embedding",): "embeddings.word_embeddings",
              ("position_embedding",): "embeddings.position_embeddings",
              ("token_type_embedding",): "embeddings.token_type_embeddings",
              ("embedding_norm",): "embeddings.LayerNorm"}


def preset(vocab_size: int, **overrides) -> EncoderConfig:
  """BERT-base: Post-LN, learned positions (512) and two token types, a LayerNorm on the
  embeddings and none at the end, exact GELU, LayerNorm eps 1e-12; d_model 768, 12 heads,
  d_ff 3072, 12 layers, dropout 0.1."""
  fields = dict(d_model=768, n_heads=12, d_ff=3072, n_layers=12, max_len=512,
                position_embedding="learned", type_vocab_size=2, embedding_scale=False,
                embedding_norm=True, final_norm=False, norm_position="post",
                layer_norm_eps=1e-12, activation="gelu", dropout=0.1)
  return EncoderConfig(vocab_size=vocab_size, **{**fields, **overrides})


def layer(i: int) -> dict:
  """transformers' names of BERT's layer i's modules."""
  at = f"encoder.layer.{i}."
  return {("self_attn", "w_q"): at + "attention.self.query",
          ("self_attn", "w_k"): at + "attention.self.key",
          ("self_attn", "w_v"): at + "attention.self.value",
          ("self_attn", "w_o"): at + "attention.output.dense",
          ("norm1",): at + "attention.output.LayerNorm",
          ("feed_forward", "w_1"): at + "intermediate.dense",
          ("feed_forward", "w_2"): at + "output.dense",
          ("norm2",): at + "output.LayerNorm"}


def names(config: EncoderConfig, layer=layer) -> Iterator[tuple[tuple, str]]:
  """(flax path under params, module name) of each module of a BERT encoder: its embeddings
  (token types where it has them) and `layer(i)`'s names of each layer (DistilBERT's own)."""
  for path, name in EMBEDDINGS.items():
    if path != ("token_type_embedding",) or config.type_vocab_size:
      yield path, name
  for i in range(config.n_layers):
    for path, name in layer(i).items():
      yield (f"layers_{i}", *path), name


def max_len(fields: Fields, offset: int) -> int:
  """The positions the encoder has: max_position_embeddings less the rows before the first
  (RoBERTa's `offset`)."""
  if not offset:
    return fields.integer("max_position_embeddings", 512)
  return fields.integer(
      "max_position_embeddings", 512, f"an integer > pad_token_id + 1 = {offset} (RoBERTa's "
      f"positions start after the padding id)", lambda n: n > offset) - offset


def read(fields: Fields, refuse: Refuse, model_type: str, sizes: dict,
         offset: int = 0) -> tuple[str, dict, dict]:
  """(activation, EncoderConfig fields, dropout rates) of a BERT config.json (RoBERTa's, whose
  positions start at `offset`)."""
  positions = max_len(fields, offset)
  act = fields.choice("hidden_act", "gelu", ACTIVATIONS)
  if model_type == "electra" and fields.integer("embedding_size", 128) != sizes["d_model"]:
    refuse("embedding_size", fields.get("embedding_size", 128),
           f"hidden_size={sizes['d_model']}")
  arch = dict(max_len=positions, layer_norm_eps=fields.number("layer_norm_eps", 1e-12),
              type_vocab_size=fields.integer("type_vocab_size", 2))
  return act, arch, dict(dropout=fields.rate("hidden_dropout_prob", 0.1),
                         attention_dropout=fields.rate("attention_probs_dropout_prob", 0.1))


def write(config: EncoderConfig, act: str, model_type: str = "bert") -> dict:
  """BertConfig's fields of `config` (RobertaConfig's: `model_type` 'roberta')."""
  return dict(model_type=model_type, vocab_size=config.vocab_size, hidden_size=config.d_model,
              num_attention_heads=config.n_heads, intermediate_size=config.d_ff,
              num_hidden_layers=config.n_layers, hidden_act=act,
              max_position_embeddings=config.max_len + config.position_offset,
              type_vocab_size=config.type_vocab_size, layer_norm_eps=config.layer_norm_eps,
              hidden_dropout_prob=config.dropout,
              attention_probs_dropout_prob=config.attention_dropout,
              pad_token_id=config.pad_id, position_embedding_type="absolute")


stages = post_ln_stages("encoder.layer.", "attention")


FAMILY = Family(
    name="bert", title="BERT", stem="Bert",
    model_types={"bert": "bert.", "electra": "electra."},
    preset=preset, sizes=SIZES, pad_id=0, fixed=FIXED, read=read,
    switches=SWITCHES, token_types=True, write=write,
    names=names, word_embeddings=EMBEDDINGS[("embedding",)],
    layers="encoder.layer.",
    masked_lm={("dense",): "cls.predictions.transform.dense",
               ("norm",): "cls.predictions.transform.LayerNorm",
               ("bias",): "cls.predictions.bias"},
    decoder="cls.predictions.decoder", decoder_bias=True,
    pooling=lambda hf: "pooler",
    classifier=SequenceClassifier(
        poolings=("pooler",), pools="by 'pooler'",
        denses=(("bert.pooler.dense", ("pooler", "dense")), ("classifier", ("classifier",))),
        from_pooler=True),
    stages=stages,
    # transformers 5 tokenizes ELECTRA with BERT's tokenizer
    tokenizers=Tokenizers(classes={"bert": "BertTokenizer", "electra": "BertTokenizer"},
                          token_types={"BertTokenizer": True, "ElectraTokenizer": True}),
)
