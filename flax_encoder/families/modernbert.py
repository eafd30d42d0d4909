"""ModernBERT: Pre-LN without layer 0's attention norm, rotary positions (one base in the
global layers, another in the local ones), global attention every n-th layer and a window in
the others, GeGLU, a final LayerNorm (`preset`); q, k and v in one matrix,
and a prediction head (dense, activation, LayerNorm) its masked-LM head and classifiers
share."""

from __future__ import annotations

from collections.abc import Iterator

from flax_encoder.classifier import HEAD_POOLINGS
from flax_encoder.config import EncoderConfig
from flax_encoder.families.family import (
    ACTIVATIONS,
    Family,
    Fields,
    Refuse,
    SequenceClassifier,
    Tokenizers,
)

SIZES = ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers")
SWITCHES = ("position_embedding", "position_offset", "type_vocab_size", "embedding_scale",
            "embedding_norm", "final_norm", "norm_position", "first_attention_norm", "glu",
            "embedding_size", "shared_layers", "relative_attention", "unbiased")
LAYER_TYPES = ("full_attention", "sliding_attention")
_EMBEDDINGS = {("embedding",): "embeddings.tok_embeddings", ("embedding_norm",): "embeddings.norm",
               ("norm",): "final_norm"}
# Its prediction head ("prediction_head" under variables["heads"]): the masked-LM head's dense
# and norm, which its *ForSequenceClassification and *ForTokenClassification read by the same
# names.
PREDICTION_HEAD = {("dense",): "head.dense", ("norm",): "head.norm"}


def preset(vocab_size: int, **overrides) -> EncoderConfig:
  """ModernBERT-base: Pre-LN without layer 0's attention norm and with a final LayerNorm,
  rotary positions (base 160,000 global, 10,000 local), global attention every third layer
  and a window of 128 in the others, GeGLU, no biases, exact GELU; d_model 768, 12 heads,
  d_ff 1152, 22 layers, 8192 positions, pad_id 50283, no dropout."""
  fields = dict(d_model=768, n_heads=12, d_ff=1152, n_layers=22, max_len=8192, pad_id=50283,
                position_embedding="rotary", rope_theta=160000.0, local_rope_theta=10000.0,
                local_attention=128, global_attention_every=3, glu=True, dense_bias=False,
                norm_bias=False, first_attention_norm=False, norm_position="pre",
                final_norm=True, embedding_scale=False, embedding_norm=True,
                activation="gelu", dropout=0.0)
  return EncoderConfig(vocab_size=vocab_size, **{**fields, **overrides})


def _layer(i: int) -> dict:
  at = f"layers.{i}."  # and attn.Wqkv: w_q, w_k, w_v stacked (Family.qkv)
  names = {("self_attn", "w_o"): at + "attn.Wo", ("norm2",): at + "mlp_norm",
           ("feed_forward", "w_1"): at + "mlp.Wi", ("feed_forward", "w_2"): at + "mlp.Wo"}
  return {("norm1",): at + "attn_norm", **names} if i else names  # layer 0 has no attn_norm


def names(config: EncoderConfig) -> Iterator[tuple[tuple, str]]:
  """(flax path under params, module name) of each module but the stacked q, k, v."""
  yield from _EMBEDDINGS.items()
  for i in range(config.n_layers):
    for path, name in _layer(i).items():
      yield (f"layers_{i}", *path), name


def read(fields: Fields, refuse: Refuse, model_type: str, sizes: dict) -> tuple[str, dict, dict]:
  """(activation, EncoderConfig fields, dropout rates) of a ModernBERT config.json."""
  head_dim = fields.get("head_dim")
  if head_dim and head_dim != sizes["d_model"] // sizes["n_heads"]:  # its rotary reads it
    refuse("head_dim", head_dim, f"hidden_size // num_attention_heads = "
                                 f"{sizes['d_model'] // sizes['n_heads']}")
  if fields.get("rope_scaling") is not None:
    refuse("rope_scaling", fields.get("rope_scaling"), "null")
  theta, local_theta = _rope_thetas(fields, refuse)
  bias = fields.flag("attention_bias", False)
  for option in ("mlp_bias", "classifier_bias"):
    if fields.flag(option, False) != bias:
      refuse(option, fields.get(option), f"attention_bias={bias!r} (one switch for every dense "
                                         f"layer)")
  if not fields.flag("decoder_bias", True):
    refuse("decoder_bias", False, "True")
  act = fields.choice("hidden_activation", "gelu", ACTIVATIONS)
  if fields.choice("classifier_activation", act, ACTIVATIONS) != act:
    refuse("classifier_activation", fields.get("classifier_activation"), f"{act!r}, the layers'")
  fields.choice("classifier_pooling", "cls", ("cls", "mean"))
  # transformers' window is local_attention // 2 either way, so 0 and 1 both let a token see
  # itself alone; EncoderConfig's 1 is that window, its 0 none at all.
  window = fields.integer("local_attention", 128, "an integer >= 0", lambda n: n >= 0)
  arch = dict(max_len=fields.integer("max_position_embeddings", 8192),
              rope_theta=theta, local_rope_theta=local_theta, local_attention=max(window, 1),
              global_attention_every=_global_every(fields, refuse, sizes["n_layers"]),
              dense_bias=bias, norm_bias=fields.flag("norm_bias", False),
              layer_norm_eps=fields.number("norm_eps", 1e-5))
  rates = dict(dropout=fields.rate("mlp_dropout", 0.0),
               attention_dropout=fields.rate("attention_dropout", 0.0))
  return act, arch, rates


def _global_every(fields: Fields, refuse: Refuse, n_layers: int) -> int:
  """Every how many layers, from layer 0, transformers' ModernBERT attends globally: as its
  layer_types say where given, else every global_attn_every_n_layers (3 by default)."""
  every = (fields.integer("global_attn_every_n_layers")
           if "global_attn_every_n_layers" in fields.hf else None)
  kinds = fields.get("layer_types")
  if kinds is None:
    return every or 3
  if (not isinstance(kinds, list) or len(kinds) != n_layers
      or not all(isinstance(k, str) and k in LAYER_TYPES for k in kinds)):
    raise fields.error("layer_types", f"a list of num_hidden_layers={n_layers} of "
                                      f"{list(LAYER_TYPES)}")
  full = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
  every = every or (full[1] if len(full) > 1 else n_layers)
  if kinds != ["sliding_attention" if i % every else "full_attention" for i in range(n_layers)]:
    refuse("layer_types", kinds, f"global every {every} layers, from layer 0")
  return every


def _rope_thetas(fields: Fields, refuse: Refuse) -> tuple[float, float]:
  """The rotary bases of the global and the local layers as transformers' ModernBertConfig
  sets them: rope_parameters' rope_theta of each, else global_rope_theta and
  local_rope_theta, else 160000 and 10000."""
  rope = fields.get("rope_parameters", {})
  rope = {} if rope is None else rope
  if not isinstance(rope, dict) or not set(rope) <= set(LAYER_TYPES):
    raise fields.error("rope_parameters", f"an object of {list(LAYER_TYPES)}")
  thetas = []
  for kind, old, default in (("full_attention", "global_rope_theta", 160000.0),
                             ("sliding_attention", "local_rope_theta", 10000.0)):
    params = rope.get(kind, {})
    if not isinstance(params, dict):
      raise Fields(rope, fields.file, "rope_parameters.").error(kind, "an object")
    kind_fields = Fields(params, fields.file, f"rope_parameters.{kind}.")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
      refuse(f"rope_parameters[{kind!r}].rope_type", rope_type, "'default'")
    thetas.append(kind_fields.number("rope_theta", fields.number(old, default)))
  return thetas[0], thetas[1]


def write(config: EncoderConfig, act: str) -> dict:
  """ModernBertConfig's fields of `config`, as transformers 5 writes them: the window's layers
  as layer_types, both rotary bases in rope_parameters. The special ids are None: the caller
  may give a tokenizer's."""
  every = config.global_attention_every if config.local_attention else 1
  kinds = [LAYER_TYPES[0] if is_global else LAYER_TYPES[1] for is_global in config.global_layers]
  rope = {"full_attention": {"rope_type": "default", "rope_theta": config.rope_theta},
          "sliding_attention": {"rope_type": "default", "rope_theta": config.local_rope_theta}}
  return dict(model_type="modernbert", vocab_size=config.vocab_size, hidden_size=config.d_model,
              intermediate_size=config.d_ff, num_hidden_layers=config.n_layers,
              num_attention_heads=config.n_heads, hidden_activation=act,
              classifier_activation=act, max_position_embeddings=config.max_len,
              norm_eps=config.layer_norm_eps, norm_bias=config.norm_bias,
              attention_bias=config.dense_bias, mlp_bias=config.dense_bias,
              classifier_bias=config.dense_bias, decoder_bias=True,
              local_attention=config.local_attention, global_attn_every_n_layers=every,
              layer_types=kinds, rope_parameters=rope, embedding_dropout=config.dropout,
              mlp_dropout=config.dropout, classifier_dropout=config.dropout,
              attention_dropout=config.attention_dropout, pad_token_id=config.pad_id,
              bos_token_id=None, eos_token_id=None, cls_token_id=None, sep_token_id=None)


def pooling(hf) -> str:
  """Its classifier_pooling through the prediction head: the first token ("cls") or the mean."""
  return {"mean": "mean_head"}.get(hf.get("classifier_pooling", "cls"), "first_head")


def stages(n_layers: int) -> list[tuple[str, str, str]]:
  """Pre-LN: each attention sub-layer's output before its residual, then the layer; the final
  LayerNorm last."""
  points = [("embeddings", "embedding_norm", "embeddings")]
  for i in range(n_layers):
    points += [(f"layers.{i}.attn", f"layers_{i}/self_attn", f"layers.{i}.attn"),
               (f"layers.{i}", f"layers_{i}", f"layers.{i}")]
  return points + [("final_norm", "norm", "final_norm")]


FAMILY = Family(
    name="modernbert", title="ModernBERT", stem="ModernBert",
    model_types={"modernbert": "model."},
    preset=preset, sizes=SIZES, pad_id=50283, read=read,
    switches=SWITCHES, write=write,
    # What an export keeps of the directory it started from (its pooling only where no
    # sequence classifier says its own).
    carried=("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id",
             "classifier_pooling"),
    names=names, word_embeddings=_EMBEDDINGS[("embedding",)], layers="layers.",
    qkv="layers.{i}.attn.Wqkv",
    masked_lm={("dense",): "head.dense", ("norm",): "head.norm", ("bias",): "decoder.bias"},
    decoder="decoder", prediction_head=PREDICTION_HEAD,
    pooling=pooling,
    classifier=SequenceClassifier(
        poolings=tuple(HEAD_POOLINGS), pools="through its prediction head",
        denses=(("classifier", ("classifier",)),),
        config=lambda pooling: {"classifier_pooling": HEAD_POOLINGS[pooling]}),
    tags_through_head=True,
    stages=stages,
    # a generic tokenizer.json (registry.TOKEN_TYPE_CLASSES says its token types)
    tokenizers=Tokenizers(classes={"modernbert": "TokenizersBackend"}, token_types={}),
)
