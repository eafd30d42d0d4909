"""RoBERTa, XLM-RoBERTa and CamemBERT: BERT's encoder whose learned positions start after the
padding id (position_offset = pad_id + 1, padding reads the row before) and whose
classification head is a dense layer of its own (`preset`). Its tokenizers' token-type rule
(none) holds for XLM-RoBERTa's and CamemBERT's tokenizers, which GTE and Jina v3 use too."""

from __future__ import annotations

import functools

from flax_encoder.config import EncoderConfig
from flax_encoder.families import bert
from flax_encoder.families.family import Family, SequenceClassifier, Tokenizers

# transformers 5's tokenizer of each model_type it reads: none of them gives token types
TOKENIZERS = {"roberta": "RobertaTokenizer", "xlm-roberta": "XLMRobertaTokenizer",
              "camembert": "CamembertTokenizer"}


def preset(vocab_size: int, **overrides) -> EncoderConfig:
  """RoBERTa-base: BERT-base whose positions start after the padding id (pad_id 1,
  position_offset pad_id + 1), with one token type and LayerNorm eps 1e-5."""
  pad_id = overrides.get("pad_id", 1)
  fields = dict(pad_id=pad_id, position_offset=pad_id + 1, type_vocab_size=1,
                layer_norm_eps=1e-5)
  return bert.preset(vocab_size, **{**fields, **overrides})


def read(fields, refuse, model_type: str, sizes: dict) -> tuple[str, dict, dict]:
  """bert.read, the positions counted from pad_token_id + 1."""
  return bert.read(fields, refuse, model_type, sizes, offset=sizes["pad_id"] + 1)


FAMILY = Family(
    name="roberta", title="RoBERTa", stem="Roberta",
    model_types={"roberta": "roberta.", "xlm-roberta": "roberta.", "camembert": "roberta."},
    preset=preset, sizes=bert.SIZES, pad_id=1, null_pad_id=False,
    fixed=bert.FIXED, read=read,
    switches=bert.SWITCHES, token_types=True,
    write=functools.partial(bert.write, model_type="roberta"),
    names=bert.names, word_embeddings=bert.EMBEDDINGS[("embedding",)], layers="encoder.layer.",
    masked_lm={("dense",): "lm_head.dense", ("norm",): "lm_head.layer_norm",
               ("bias",): "lm_head.bias"},
    decoder="lm_head.decoder",
    # BERT's pooler's shape, a fresh layer: the checkpoint's pooler is not the head's.
    pooling=lambda hf: "pooler",
    classifier=SequenceClassifier(
        poolings=("pooler",), pools="by 'pooler'",
        denses=(("classifier.dense", ("pooler", "dense")),
                ("classifier.out_proj", ("classifier",)))),
    stages=bert.stages,
    tokenizers=Tokenizers(classes=TOKENIZERS,
                          token_types={name: False for name in TOKENIZERS.values()}),
)
