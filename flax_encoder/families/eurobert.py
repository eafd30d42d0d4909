"""EuroBERT: a Llama-style encoder. Pre-norm layers with RMSNorm (`norm_type="rms"`) and a
final one, rotary positions, grouped-query attention (`kv_heads`), SwiGLU, no biases unless
config.json's attention_bias or mlp_bias say, no token types and nothing on the embeddings.
Its classifier pools the first token or the mean, then a dense layer and GELU
(`classifier_pooling` "bos" or "mean"); its masked-LM head is a dense layer to the vocabulary
of its own (`Family.untied_decoder`, `heads.DecoderHead`)."""

from __future__ import annotations

from collections.abc import Iterator

from flax_encoder.config import EncoderConfig
from flax_encoder.families import bert, nomic_bert
from flax_encoder.families.family import (
    ACTIVATIONS,
    Family,
    Fields,
    Refuse,
    SequenceClassifier,
    Tokenizers,
)

SWITCHES = (*nomic_bert.SWITCHES, "norm_type", "type_vocab_size")
_ATTENTION, _MLP = ("w_q", "w_k", "w_v", "w_o"), ("w_1", "w_2")
EMBEDDINGS = {("embedding",): "embed_tokens", ("norm",): "norm"}
# classifier_pooling -> the run's config.task.pooling
POOLINGS = {"bos": "first_gelu", "mean": "mean_gelu"}


def preset(vocab_size: int, **overrides) -> EncoderConfig:
  """EuroBERT-210m: hidden 768, 12 layers, 12 heads, intermediate 3072, rotary base 250,000
  over 8,192 positions, RMSNorm eps 1e-5, SwiGLU, no biases in its layers, pad id 128001, no
  dropout."""
  fields = dict(d_model=768, n_heads=12, d_ff=3072, n_layers=12, max_len=8192,
                position_embedding="rotary", rope_theta=250000.0, type_vocab_size=0,
                embedding_scale=False, embedding_norm=False, final_norm=True,
                norm_position="pre", norm_type="rms", norm_bias=False, glu=True,
                unbiased=",".join((*_ATTENTION, *_MLP, "decoder")), layer_norm_eps=1e-5,
                activation="silu",
                pad_id=128001, dropout=0.0)
  return EncoderConfig(vocab_size=vocab_size, **{**fields, **overrides})


def _layer(i: int) -> dict:
  at = f"layers.{i}."
  return {("self_attn", "w_q"): at + "self_attn.q_proj",
          ("self_attn", "w_k"): at + "self_attn.k_proj",
          ("self_attn", "w_v"): at + "self_attn.v_proj",
          ("self_attn", "w_o"): at + "self_attn.o_proj",
          ("norm1",): at + "input_layernorm",
          ("feed_forward", "w_1"): (at + "mlp.gate_proj", at + "mlp.up_proj"),
          ("feed_forward", "w_2"): at + "mlp.down_proj",
          ("norm2",): at + "post_attention_layernorm"}


def names(config: EncoderConfig) -> Iterator[tuple[tuple, str | tuple[str, ...]]]:
  """(flax path under params, module names): the token table, each layer's, the final norm."""
  yield from EMBEDDINGS.items()
  for i in range(config.n_layers):
    for path, name in _layer(i).items():
      yield (f"layers_{i}", *path), name


def read(fields: Fields, refuse: Refuse, model_type: str, sizes: dict) -> tuple[str, dict, dict]:
  """(activation, EncoderConfig fields, dropout rates) of a EuroBertConfig's config.json."""
  act = fields.choice("hidden_act", "silu", ACTIVATIONS)
  heads = sizes["n_heads"]
  kv = fields.integer("num_key_value_heads", heads, f"a divisor of num_attention_heads={heads}",
                      lambda n: n >= 1 and heads % n == 0)
  if fields.integer("pretraining_tp", 1) != 1:
    refuse("pretraining_tp", fields.get("pretraining_tp"), "1")
  fields.choice("classifier_pooling", "late", ("bos", "mean", "late"))
  unbiased = (() if fields.flag("attention_bias", False) else _ATTENTION) + (
      () if fields.flag("mlp_bias", False) else (*_MLP, "decoder"))  # lm_head's is mlp_bias
  arch = dict(max_len=fields.integer("max_position_embeddings", 8192),
              rope_theta=nomic_bert.rope_theta(fields, refuse, sizes, 10000.0),
              kv_heads=0 if kv == heads else kv, unbiased=",".join(unbiased),
              layer_norm_eps=fields.number("rms_norm_eps", 1e-5))
  return act, arch, dict(dropout=0.0, attention_dropout=fields.rate("attention_dropout", 0.0))


def write(config: EncoderConfig, act: str) -> dict:
  """EuroBertConfig's fields of `config`: its biases as attention_bias and mlp_bias, its
  decoder untied (the special ids are the caller's to give)."""
  unbiased = set(config.unbiased_denses)
  return dict(model_type="eurobert", vocab_size=config.vocab_size, hidden_size=config.d_model,
              intermediate_size=config.d_ff, num_hidden_layers=config.n_layers,
              num_attention_heads=config.n_heads, num_key_value_heads=config.key_value_heads,
              hidden_act=act, max_position_embeddings=config.max_len,
              rms_norm_eps=config.layer_norm_eps, attention_bias=not unbiased & set(_ATTENTION),
              mlp_bias=not unbiased & set(_MLP), attention_dropout=config.attention_dropout,
              pad_token_id=config.pad_id, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta})


def stages(n_layers: int) -> list[tuple[str, str, str]]:
  """The embeddings, per layer its attention's output and the layer, the final norm."""
  points = [("embeddings", "embedding", "embed_tokens")]
  for i in range(n_layers):
    points += [(f"layers.{i}.self_attn", f"layers_{i}/self_attn", f"layers.{i}.self_attn"),
               (f"layers.{i}", f"layers_{i}", f"layers.{i}")]
  return points + [("norm", "norm", "norm")]


FAMILY = Family(
    name="eurobert", title="EuroBERT", stem="EuroBert",
    model_types={"eurobert": "model."},
    preset=preset, sizes=bert.SIZES, pad_id=128001, read=read,
    switches=SWITCHES, write=write,
    carried=("bos_token_id", "eos_token_id", "mask_token_id", "classifier_pooling"),
    names=names, word_embeddings=EMBEDDINGS[("embedding",)], layers="layers.",
    masked_lm={("decoder",): "lm_head"}, decoder="lm_head", untied_decoder=True,
    pooling=lambda hf: POOLINGS.get(hf.get("classifier_pooling"), "mean_gelu"),
    classifier=SequenceClassifier(
        poolings=tuple(POOLINGS.values()), pools="by a dense layer and GELU on the first token "
                                                 "or the mean",
        denses=(("dense", ("pooler", "dense")), ("classifier", ("classifier",))),
        config=lambda pooling: {"classifier_pooling": {v: k for k, v in POOLINGS.items()}[
            pooling]}),
    stages=stages,
    # a generic tokenizer.json (registry.TOKEN_TYPE_CLASSES says its token types)
    tokenizers=Tokenizers(classes={"eurobert": "TokenizersBackend"}, token_types={}),
)
