"""DeBERTa v2 and v3 (transformers' `deberta-v2`): BERT's Post-LN layers whose attention is
disentangled (families/disentangled.py: content and relative-position scores through a shared
table of relative-position embeddings), without absolute positions in v3
(`position_biased_input` false) or with BERT's table in v2; its classifier a dense layer and
its pooler activation (GELU) on the first token. Settings transformers computes another way
(unshared position projections, the convolution of v2-xlarge, a pooler of another size) are
refused. Its tokenizer, where a directory has no tokenizer.json, is built from its
SentencePiece model, spm.model (`spm_tokenizer`)."""

from __future__ import annotations

import os
from collections.abc import Iterator

from flax_encoder.config import EncoderConfig
from flax_encoder.families import bert
from flax_encoder.families.disentangled import NORMS, TYPES, Part
from flax_encoder.families.family import (
    ACTIVATIONS,
    Family,
    Fields,
    HFError,
    Refuse,
    SequenceClassifier,
    SlowTokenizer,
    Tokenizers,
)
from flax_encoder.tokenizer_options import TokenizerError, TokenizerOptions

# BERT's, but its positions (v2's table, v3's none) and its relative attention's settings,
# which config.json says.
SWITCHES = (*(s for s in bert.SWITCHES if s not in ("position_embedding", "relative_attention")),
            "first_attention_norm")
# tokenizer_config.json's tokenizer_class (less "Fast") built from spm.model: "[CLS] a [SEP] b
# [SEP]", a Unigram model
TOKENIZER_CLASSES = ("DebertaV2Tokenizer",)
_RELATIVE = {("relative_attention", "rel_embeddings"): "encoder.rel_embeddings",
             ("relative_attention", "norm"): "encoder.LayerNorm"}


def preset(vocab_size: int, **overrides) -> EncoderConfig:
  """deberta-v3-base: BERT-base's sizes and Post-LN layers with disentangled attention (256
  position buckets, distances to 512, c2p and p2c, the table normalised), no absolute
  positions and no token types, LayerNorm eps 1e-7, exact GELU, dropout 0.1."""
  fields = dict(position_embedding="none", type_vocab_size=0, layer_norm_eps=1e-7,
                relative_attention=Part().spec())
  return bert.preset(vocab_size, **{**fields, **overrides})


def _layer(i: int) -> dict:
  """BERT's layer names, its query, key and value projections named query_proj …"""
  return {path: name + "_proj" if path[-1] in ("w_q", "w_k", "w_v") else name
          for path, name in bert.layer(i).items()}


def names(config: EncoderConfig) -> Iterator[tuple[tuple, str]]:
  """(flax path under params, module name) of each module: the embeddings it has, the
  relative-position table and its norm, each layer's."""
  for path, name in bert.EMBEDDINGS.items():
    if ((path != ("token_type_embedding",) or config.type_vocab_size)
        and (path != ("position_embedding",) or config.position_embedding == "learned")):
      yield path, name
  norm = "layer_norm" in config.relative_attention
  for path, name in _RELATIVE.items():
    if path[-1] != "norm" or norm:
      yield path, name
  for i in range(config.n_layers):
    for path, name in _layer(i).items():
      yield (f"layers_{i}", *path), name


def read(fields: Fields, refuse: Refuse, model_type: str, sizes: dict) -> tuple[str, dict, dict]:
  """(activation, EncoderConfig fields, dropout rates) of a DebertaV2Config's config.json."""
  act = fields.choice("hidden_act", "gelu", ACTIVATIONS)
  d_model = sizes["d_model"]
  for option, value, expected in (
      ("relative_attention", fields.flag("relative_attention", False), True),
      ("share_att_key", fields.flag("share_att_key", False), True),
      ("conv_kernel_size", fields.get("conv_kernel_size", 0) or 0, 0),
      ("embedding_size", fields.get("embedding_size", d_model) or d_model, d_model),
      ("pooler_hidden_size", fields.get("pooler_hidden_size", d_model), d_model),
      ("attention_head_size", fields.get("attention_head_size", d_model // sizes["n_heads"]),
       d_model // sizes["n_heads"])):
    if value != expected:
      refuse(option, value, repr(expected))
  if fields.choice("pooler_hidden_act", "gelu", ACTIVATIONS) != "gelu":
    refuse("pooler_hidden_act", fields.get("pooler_hidden_act"), "'gelu'")
  types = fields.get("pos_att_type") or []
  types = types.split("|") if isinstance(types, str) else types
  if not isinstance(types, list) or not set(types) <= set(TYPES):
    raise fields.error("pos_att_type", f"a list of {list(TYPES)}")
  norms = [n.strip() for n in str(fields.get("norm_rel_ebd", "none")).lower().split("|")]
  if not set(norms) <= set(NORMS):
    raise fields.error("norm_rel_ebd", f"one of {list(NORMS)}")
  max_len = fields.integer("max_position_embeddings", 512)
  max_relative = fields.integer("max_relative_positions", -1, "an integer", lambda n: True)
  buckets = fields.integer("position_buckets", -1, "an integer", lambda n: True)
  part = Part(buckets=max(buckets, 0), max_relative=max_relative if max_relative >= 1
              else max_len, types=tuple(types),
              norm="layer_norm" if "layer_norm" in norms else "none")
  positions = "learned" if fields.flag("position_biased_input", True) else "none"
  arch = dict(max_len=max_len, position_embedding=positions, relative_attention=part.spec(),
              type_vocab_size=fields.integer("type_vocab_size", 0, "an integer >= 0",
                                             lambda n: n >= 0),
              layer_norm_eps=fields.number("layer_norm_eps", 1e-7))
  return act, arch, dict(dropout=fields.rate("hidden_dropout_prob", 0.1),
                         attention_dropout=fields.rate("attention_probs_dropout_prob", 0.1))


def write(config: EncoderConfig, act: str) -> dict:
  """DebertaV2Config's fields of `config` (HFError where it has no disentangled attention)."""
  if not config.relative_attention.startswith("disentangled"):
    raise HFError(f"this model is not a deberta-v2 model: it has relative_attention="
                  f"{config.relative_attention!r}, a deberta-v2 model 'disentangled,…'")
  part = Part.parse(config.relative_attention)
  return dict(model_type="deberta-v2", vocab_size=config.vocab_size, hidden_size=config.d_model,
              num_attention_heads=config.n_heads, intermediate_size=config.d_ff,
              num_hidden_layers=config.n_layers, hidden_act=act,
              max_position_embeddings=config.max_len, type_vocab_size=config.type_vocab_size,
              layer_norm_eps=config.layer_norm_eps, hidden_dropout_prob=config.dropout,
              attention_probs_dropout_prob=config.attention_dropout,
              pad_token_id=config.pad_id, relative_attention=True, share_att_key=True,
              position_biased_input=config.position_embedding == "learned",
              pos_att_type=list(part.types), position_buckets=part.buckets or -1,
              max_relative_positions=part.max_relative, norm_rel_ebd=part.norm,
              pooler_hidden_size=config.d_model, pooler_hidden_act="gelu")


def spm_tokenizer(directory: str) -> bytes:
  """DeBERTa v2 and v3's tokenizer from spm.model, as transformers' DebertaV2Tokenizer builds
  it: the model's pieces and scores as a Unigram model; whitespace runs, tabs and newlines to
  one space, NFC, trailing spaces stripped (lower-cased first with do_lower_case); words
  split at punctuation with split_by_punct, then at spaces marked "\u2581" (before the first
  word too unless add_prefix_space is false); "[CLS] a [SEP] b [SEP]"; special tokens the
  model lacks ([MASK]) added after its pieces."""
  import sentencepiece
  from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
  from tokenizers import Tokenizer as HFTokenizer
  from tokenizers import processors
  file = os.path.join(directory, "spm.model")
  try:
    model = sentencepiece.SentencePieceProcessor(model_file=file)
  except (OSError, RuntimeError) as e:
    raise TokenizerError(f"{file}: not a SentencePiece model "
                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
  pieces = [(model.id_to_piece(i), model.get_score(i)) for i in range(model.get_piece_size())]
  ids = {piece: i for i, (piece, _) in enumerate(pieces)}
  options = TokenizerOptions(directory, TOKENIZER_CLASSES, "spm.model", ids, file)
  names = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
           "mask_token")
  defaults = ("[CLS]", "[SEP]", "[UNK]", "[SEP]", "[PAD]", "[CLS]", "[MASK]")
  # a token that is not one of its pieces ([MASK]) comes after them, as transformers adds it
  specials = {name: options.special(name, default, added=True)
              for name, default in zip(names, defaults)}
  unk = specials["unk_token"][0].content
  unk_id = next((i for i, (piece, score) in enumerate(pieces) if piece == unk and score == 0.0),
                1)
  tokenizer = HFTokenizer(models.Unigram(pieces, unk_id=unk_id, byte_fallback=False))
  lower = [normalizers.Lowercase()] if options.flag("do_lower_case", False) else []
  tokenizer.normalizer = normalizers.Sequence(
      lower + [normalizers.Replace(Regex(r"\s{2,}|[\n\r\t]"), " "), normalizers.NFC(),
               normalizers.Strip(left=False, right=True)])
  scheme = "always" if options.flag("add_prefix_space", True) else "first"
  split = ([pre_tokenizers.Punctuation(behavior="isolated")]
           if options.flag("split_by_punct", False) else [])
  tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
      split + [pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme)])
  tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=scheme)
  unique: dict = {}  # [CLS] and [SEP] are bos and eos too: each added once
  for token, _ in specials.values():
    unique.setdefault(token.content, token)
  tokenizer.add_special_tokens(list(unique.values()))
  cls, sep = (specials[name][0].content for name in ("cls_token", "sep_token"))
  tokenizer.post_processor = processors.TemplateProcessing(
      single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
      special_tokens=[(cls, tokenizer.token_to_id(cls)), (sep, tokenizer.token_to_id(sep))])
  return tokenizer.to_str().encode("utf-8")


FAMILY = Family(
    name="deberta-v2", title="DeBERTa", stem="DebertaV2",
    model_types={"deberta-v2": "deberta."},
    preset=preset, sizes=bert.SIZES, pad_id=0, read=read,
    switches=SWITCHES, write=write,
    names=names, word_embeddings=bert.EMBEDDINGS[("embedding",)], layers="encoder.layer.",
    masked_lm={("dense",): "cls.predictions.transform.dense",
               ("norm",): "cls.predictions.transform.LayerNorm",
               ("bias",): "cls.predictions.bias"},
    decoder="cls.predictions.decoder", decoder_bias=True,
    pooling=lambda hf: "first_gelu",
    classifier=SequenceClassifier(
        poolings=("first_gelu",), pools="by 'first_gelu' (its pooler: a dense layer and GELU "
                                        "on the first token)",
        denses=(("pooler.dense", ("pooler", "dense")), ("classifier", ("classifier",)))),
    stages=bert.stages,  # its attention module ends with its LayerNorm, as BERT's
    tokenizers=Tokenizers(classes={"deberta-v2": "DebertaV2Tokenizer"},
                          token_types={"DebertaV2Tokenizer": True, "DebertaTokenizer": True},
                          slow=SlowTokenizer(files=("spm.model",), build=spm_tokenizer)),
)
