"""Hugging Face model families: one module each, and the registry of them.

    from flax_encoder import families
    config, variables = families.load_hf("bert-dir")  # bert, roberta, distilbert, mpnet …
    family, config, variables = families.read_hf("bert-dir")  # and the family's name
    families.get(family).classifier   # what its *ForSequenceClassification pools by, and how

  family      model_types                      module
  bert        bert, electra (discriminator)    bert.py
  roberta     roberta, xlm-roberta, camembert  roberta.py
  distilbert  distilbert                       distilbert.py
  modernbert  modernbert                       modernbert.py
  albert      albert                           albert.py
  mpnet       mpnet                            mpnet.py

Each module holds one `Family` (family.py): its preset, config.json both ways, its tensor
names both ways, its heads, its fine-tuning defaults and its parity stages. The generic
machinery reads them: config_json.py (config.json <-> EncoderConfig), tensors.py (state dict
<-> variables), directory.py (a directory's files). Adding a family is one module, one line
of `FAMILIES` and one entry of tests/hf_models.py (docs/huggingface.md, "Adding a family").
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from flax_encoder.config import EncoderConfig
from flax_encoder.families import albert, bert, distilbert, modernbert, mpnet, roberta
from flax_encoder.families.family import Family, HFError, SequenceClassifier

# name -> family, in the order errors list them
FAMILIES: dict[str, Family] = {f.name: f for f in (bert.FAMILY, roberta.FAMILY,
                                                     distilbert.FAMILY, modernbert.FAMILY,
                                                     albert.FAMILY, mpnet.FAMILY)}
# model_type (config.json's) -> family
MODEL_TYPES: dict[str, Family] = {t: f for f in FAMILIES.values() for t in f.model_types}


def get(name: str) -> Family:
  """The family `name` ('bert', 'roberta', 'distilbert', 'modernbert', 'albert', 'mpnet')."""
  family = FAMILIES.get(name)
  if family is None:
    raise HFError(f"family {name!r}: expected one of {tuple(FAMILIES)}")
  return family


def of_config(hf: Mapping) -> Family:
  """The family of a config.json's contents (read_hf_config checked its model_type)."""
  return MODEL_TYPES[hf["model_type"]]


def of_directory(path: str | os.PathLike) -> Family:
  """The family of the Hugging Face directory `path` (HFError where load_hf cannot take it)."""
  return of_config(read_hf_config(path))


def of_architecture(config: EncoderConfig) -> Family:
  """The family a model trained from scratch exports as, which it has no record of: rotary
  positions are ModernBERT's; shared layers ALBERT's; a relative position bias MPNet's;
  learned positions RoBERTa's with a position offset, else BERT's with token types, else
  DistilBERT's. `hf_config` then says what else differs."""
  if config.position_embedding == "rotary":
    return modernbert.FAMILY
  if config.shared_layers:
    return albert.FAMILY
  if config.relative_attention_buckets:
    return mpnet.FAMILY
  if config.position_offset:
    return roberta.FAMILY
  return bert.FAMILY if config.type_vocab_size else distilbert.FAMILY


# The machinery, which reads the registry above.
from flax_encoder.families.config_json import config_from_hf, hf_config  # noqa: E402
from flax_encoder.families.directory import (  # noqa: E402
    WEIGHT_FILES,
    HFModel,
    load_hf,
    model_directory,
    read_hf,
    read_hf_config,
    read_hf_weights,
)
from flax_encoder.families.tensors import from_hf_state_dict, to_hf_state_dict  # noqa: E402

__all__ = ["FAMILIES", "MODEL_TYPES", "WEIGHT_FILES", "Family", "HFError", "HFModel",
           "SequenceClassifier", "config_from_hf", "from_hf_state_dict", "get", "hf_config",
           "load_hf", "model_directory", "of_architecture", "of_config", "of_directory", "read_hf",
           "read_hf_config", "read_hf_weights", "to_hf_state_dict"]
