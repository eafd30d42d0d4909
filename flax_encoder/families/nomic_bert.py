"""NomicBERT (nomic-embed-text's encoder): BERT's Post-LN layers and token types with rotary
positions instead of a position table, SwiGLU feed-forward layers and no biases in the
layers' dense modules (its heads keep theirs). GTE (gte.py) is the same encoder with other
biases, names and heads, and shares its reading and writing here."""

from __future__ import annotations

from collections.abc import Iterator

from flax_encoder.config import LAYER_DENSES, EncoderConfig
from flax_encoder.families import bert
from flax_encoder.families.family import (
    ACTIVATIONS,
    Chunks,
    Family,
    Fields,
    Refuse,
    SequenceClassifier,
    Tokenizers,
)

# Its tensors as transformers 5 saves them: nomic-embed-text's own names (transformers renames
# them on loading).
EMBEDDINGS = {("embedding",): "embeddings.word_embeddings",
              ("token_type_embedding",): "embeddings.token_type_embeddings",
              ("embedding_norm",): "emb_ln"}
# What a rotary Post-LN model has as this preset has it (config.json says the rest).
SWITCHES = (*bert.SWITCHES, "first_attention_norm")


def preset(vocab_size: int, **overrides) -> EncoderConfig:
  """nomic-embed-text-v1.5's encoder: BERT-base's sizes and Post-LN layers, two token types,
  rotary positions of base 1,000 over 2,048 positions, SwiGLU, no bias in any layer's dense
  module, LayerNorm eps 1e-12, no dropout."""
  fields = dict(d_model=768, n_heads=12, d_ff=3072, n_layers=12, max_len=2048,
                position_embedding="rotary", rope_theta=1000.0, type_vocab_size=2,
                embedding_scale=False, embedding_norm=True, final_norm=False,
                norm_position="post", glu=True, unbiased=",".join(LAYER_DENSES),
                layer_norm_eps=1e-12, activation="silu", dropout=0.0)
  return EncoderConfig(vocab_size=vocab_size, **{**fields, **overrides})


def _layer(i: int) -> dict:
  """Layer i's modules but q, k and v (one matrix, Family.qkv): w_1 is fc12's outputs (the
  gate), then fc11's."""
  at = f"encoder.layers.{i}."
  return {("self_attn", "w_o"): at + "attn.out_proj", ("norm1",): at + "norm1",
          ("feed_forward", "w_1"): (at + "mlp.fc12", at + "mlp.fc11"),
          ("feed_forward", "w_2"): at + "mlp.fc2", ("norm2",): at + "norm2"}


def names(config: EncoderConfig, embeddings=EMBEDDINGS, layer=_layer
          ) -> Iterator[tuple[tuple, str | tuple[str, ...] | Chunks]]:
  """(flax path under params, module names) of each module: the `embeddings` (token types
  where it has them) and `layer(i)`'s of each layer (GTE's own)."""
  for path, name in embeddings.items():
    if path != ("token_type_embedding",) or config.type_vocab_size:
      yield path, name
  for i in range(config.n_layers):
    for path, name in layer(i).items():
      yield (f"layers_{i}", *path), name


def rope_theta(fields: Fields, refuse: Refuse, sizes: dict, default: float) -> float:
  """The rotary base of rope_parameters (transformers 5's, `default` where absent); a rotary
  of another kind, or a head_dim other than hidden_size // num_attention_heads, refused."""
  head_dim = fields.get("head_dim")
  if head_dim is not None and head_dim != sizes["d_model"] // sizes["n_heads"]:
    refuse("head_dim", head_dim, f"hidden_size // num_attention_heads = "
                                 f"{sizes['d_model'] // sizes['n_heads']}")
  rope = fields.get("rope_parameters")
  rope = {} if rope is None else rope
  if not isinstance(rope, dict):
    raise fields.error("rope_parameters", "an object")
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type != "default":
    refuse("rope_parameters.rope_type", rope_type, "'default'")
  return Fields(rope, fields.file, "rope_parameters.").number("rope_theta", default)


def gelu_only(fields: Fields, refuse: Refuse) -> str:
  """hidden_act, which must be gelu where the masked-LM head applies GELU whatever it says
  (GTE's, Jina v3's): one activation serves both here."""
  act = fields.choice("hidden_act", "gelu", ACTIVATIONS)
  if act != "gelu":
    refuse("hidden_act", act, "'gelu' (its masked-LM head applies GELU whatever the layers use)")
  return act


def read(fields: Fields, refuse: Refuse, model_type: str, sizes: dict) -> tuple[str, dict, dict]:
  """(activation, EncoderConfig fields, dropout rates) of a NomicBertConfig's config.json."""
  act = fields.choice("hidden_act", "silu", ACTIVATIONS)
  arch = dict(max_len=fields.integer("max_position_embeddings", 2048),
              rope_theta=rope_theta(fields, refuse, sizes, 1000.0),
              type_vocab_size=fields.integer("type_vocab_size", 2),
              layer_norm_eps=fields.number("layer_norm_eps", 1e-12))
  return act, arch, dict(dropout=fields.rate("hidden_dropout_prob", 0.0),
                         attention_dropout=fields.rate("attention_probs_dropout_prob", 0.0))


def write(config: EncoderConfig, act: str, model_type: str = "nomic_bert") -> dict:
  """NomicBertConfig's fields of `config` (GteConfig's: `model_type` 'gte')."""
  return dict(model_type=model_type, vocab_size=config.vocab_size, hidden_size=config.d_model,
              num_attention_heads=config.n_heads, intermediate_size=config.d_ff,
              num_hidden_layers=config.n_layers, hidden_act=act,
              max_position_embeddings=config.max_len, type_vocab_size=config.type_vocab_size,
              layer_norm_eps=config.layer_norm_eps, hidden_dropout_prob=config.dropout,
              attention_probs_dropout_prob=config.attention_dropout,
              pad_token_id=config.pad_id,
              rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta})


def stages(n_layers: int) -> list[tuple[str, str, str]]:
  """The embeddings, then per layer its attention's output before the residual and the
  layer."""
  points = [("embeddings", "embedding_norm", "embeddings")]
  for i in range(n_layers):
    points += [(f"layers.{i}.self_attn", f"layers_{i}/self_attn", f"layers.{i}.self_attn"),
               (f"layers.{i}", f"layers_{i}", f"layers.{i}")]
  return points


def classifier(prefix: str) -> SequenceClassifier:
  """BERT's: the pooler (dense and tanh on the first token), then the classifier."""
  return SequenceClassifier(
      poolings=("pooler",), pools="by 'pooler'",
      denses=((prefix + "pooler.dense", ("pooler", "dense")), ("classifier", ("classifier",))),
      from_pooler=True)


FAMILY = Family(
    name="nomic_bert", title="NomicBERT", stem="NomicBert",
    model_types={"nomic_bert": "nomic_bert."},
    preset=preset, sizes=bert.SIZES, pad_id=0, read=read,
    switches=SWITCHES, token_types=True, write=write,
    names=names, word_embeddings=EMBEDDINGS[("embedding",)], layers="encoder.layers.",
    qkv="encoder.layers.{i}.attn.Wqkv",
    masked_lm={("dense",): "cls.predictions.transform.dense",
               ("norm",): "cls.predictions.transform.layer_norm",
               ("bias",): "cls.predictions.bias"},
    decoder="cls.predictions.decoder", decoder_bias=True,
    pooling=lambda hf: "pooler",
    classifier=classifier("nomic_bert."),
    stages=stages,
    # BERT's tokenizer (bert.py says its token types)
    tokenizers=Tokenizers(classes={"nomic_bert": "BertTokenizer"}, token_types={}),
)
