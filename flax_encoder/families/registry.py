"""The registry of Hugging Face model families: each family's module, by name and by the
model_type of its config.json. The machinery (config_json.py, tensors.py, directory.py) reads
it; adding a family adds its module to `FAMILIES`."""

from __future__ import annotations

from collections.abc import Mapping

from flax_encoder import relative
from flax_encoder.config import EncoderConfig
from flax_encoder.families import (albert, bert, deberta_v2, distilbert, eurobert, gte,
                                   jina_embeddings_v3, modernbert, mpnet, nomic_bert, roberta)
from flax_encoder.families.family import Family, HFError, SlowTokenizer

# name -> family, in the order errors list them
FAMILIES: dict[str, Family] = {f.name: f for f in (bert.FAMILY, roberta.FAMILY,
                                                     distilbert.FAMILY, modernbert.FAMILY,
                                                     albert.FAMILY, mpnet.FAMILY,
                                                     nomic_bert.FAMILY, gte.FAMILY,
                                                     jina_embeddings_v3.FAMILY,
                                                     eurobert.FAMILY, deberta_v2.FAMILY)}
# model_type (config.json's) -> family
MODEL_TYPES: dict[str, Family] = {t: f for f in FAMILIES.values() for t in f.model_types}
# transformers 5's tokenizer class (less "Fast") -> whether it gives the model token_type_ids:
# the families' (Family.tokenizers) and the generic ones. A generic tokenizer.json
# (TokenizersBackend) gives none, so a BERT saved with one gets token types of 0 throughout.
TOKEN_TYPE_CLASSES: dict[str, bool] = {
    "TokenizersBackend": False, "PreTrainedTokenizer": False,
    **{c: gives for f in FAMILIES.values() for c, gives in f.tokenizers.token_types.items()}}
# the tokenizers families build from files of their own, in the order a directory is asked
SLOW_TOKENIZERS: tuple[SlowTokenizer, ...] = tuple(
    f.tokenizers.slow for f in FAMILIES.values() if f.tokenizers.slow is not None)


def get(name: str) -> Family:
  """The family `name` ('bert', 'roberta', 'distilbert', 'modernbert', 'albert', 'mpnet',
  'nomic_bert', 'gte', 'jina_embeddings_v3', 'eurobert', 'deberta-v2')."""
  family = FAMILIES.get(name)
  if family is None:
    raise HFError(f"family {name!r}: expected one of {tuple(FAMILIES)}")
  return family


def tokenizer_class(model_type) -> str | None:
  """The tokenizer class transformers 5 picks for a directory of config.json's `model_type`
  that names none (its TOKENIZER_MAPPING_NAMES); None for a model_type of no family."""
  family = MODEL_TYPES.get(model_type)
  return None if family is None else family.tokenizers.classes.get(model_type)


def of_config(hf: Mapping) -> Family:
  """The family of a config.json's contents (read_hf_config checked its model_type)."""
  return MODEL_TYPES[hf["model_type"]]


def of_architecture(config: EncoderConfig) -> Family:
  """The family a model trained from scratch exports as, which it has no record of: the first
  whose switches it has as that family's preset has them (`Family.expected`); else, by its
  most telling switch, the family whose config.json `hf_config` then says what else differs:
  rotary positions are ModernBERT's, shared layers ALBERT's, a relative position bias
  MPNet's, learned positions RoBERTa's with a position offset, else BERT's with token types,
  else DistilBERT's."""
  for family in FAMILIES.values():
    if family.expected(config) == {k: getattr(config, k) for k in family.switches} and (
        config.type_vocab_size or not family.token_types):
      return family
  if config.position_embedding == "rotary":
    return modernbert.FAMILY
  if config.shared_layers:
    return albert.FAMILY
  if config.relative_attention and isinstance(relative.part(config.relative_attention),
                                             mpnet.Part):
    return mpnet.FAMILY
  if config.position_offset:
    return roberta.FAMILY
  return bert.FAMILY if config.type_vocab_size else distilbert.FAMILY
