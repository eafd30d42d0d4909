"""Hugging Face model families: one module each, and the registry of them (registry.py).

    from flax_encoder import families
    config, variables = families.load_hf("bert-dir")  # bert, roberta, distilbert, mpnet …
    family, config, variables = families.read_hf("bert-dir")  # and the family's name
    families.get(family).classifier   # what its *ForSequenceClassification pools by, and how

  family              model_types                      module
  bert                bert, electra (discriminator)    bert.py
  roberta             roberta, xlm-roberta, camembert  roberta.py
  distilbert          distilbert                       distilbert.py
  modernbert          modernbert                       modernbert.py
  albert              albert                           albert.py
  mpnet               mpnet                            mpnet.py (and t5_bias.py)
  nomic_bert          nomic_bert                       nomic_bert.py
  gte                 gte                              gte.py
  jina_embeddings_v3  jina_embeddings_v3               jina_embeddings_v3.py
  eurobert            eurobert                         eurobert.py
  deberta-v2          deberta-v2                       deberta_v2.py (and disentangled.py)

Each module holds one `Family` (family.py): its preset, config.json both ways, its tensor
names both ways, its heads, its fine-tuning defaults and its parity stages; a family whose
attention is its own brings it in a module of its own, a relative attention part
(flax_encoder.relative: disentangled.py, DeBERTa's; t5_bias.py, MPNet's). The
generic machinery reads them: config_json.py (config.json <-> EncoderConfig), tensors.py
(state dict <-> variables), directory.py (a directory's files; safetensors_file.py and
torch_zip.py read its weights without torch). Adding a family is one module, one line of
registry.py's `FAMILIES` and one entry of tests/hf_models.py (docs/huggingface.md, "Adding a
family").
"""

from __future__ import annotations

import os

from flax_encoder.families.config_json import config_from_hf, hf_config
from flax_encoder.families.directory import (
    WEIGHT_FILES,
    HFDirectory,
    HFModel,
    load_hf,
    model_directory,
    open_hf,
    read_hf,
    read_hf_config,
    read_hf_weights,
)
from flax_encoder.families.family import Family, HFError, SequenceClassifier, Tokenizers
from flax_encoder.families.registry import (FAMILIES, MODEL_TYPES, SLOW_TOKENIZERS,
                                            TOKEN_TYPE_CLASSES, get, of_architecture,
                                            of_config, tokenizer_class)
from flax_encoder.families.tensors import from_hf_state_dict, to_hf_state_dict


def of_directory(path: str | os.PathLike) -> Family:
  """The family of the Hugging Face directory `path` (HFError where load_hf cannot take it)."""
  return of_config(read_hf_config(path))


__all__ = ["FAMILIES", "MODEL_TYPES", "SLOW_TOKENIZERS", "TOKEN_TYPE_CLASSES", "WEIGHT_FILES",
           "Family", "HFDirectory", "HFError", "HFModel", "SequenceClassifier", "Tokenizers",
           "config_from_hf", "from_hf_state_dict", "get", "hf_config", "load_hf",
           "model_directory", "of_architecture", "of_config", "of_directory", "open_hf", "read_hf",
           "read_hf_config", "read_hf_weights", "to_hf_state_dict", "tokenizer_class"]
