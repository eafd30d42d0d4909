"""A sentence-transformers folder's modules.json: which of its folders is the Transformer
module, the Hugging Face model directory (config.json, weights, tokenizer) the other modules
(Pooling, Dense, Normalize) run on. It imports no JAX, so tokenizing workers can read it.

    transformer_folder("all-MiniLM-L6-v2")  # the folder itself (sentence-transformers >= 2)
    transformer_folder("older-model")       # older-model/0_Transformer
"""

from __future__ import annotations

import json
import os
from typing import Any

# The Transformer module's type as modules.json names it: where its class lives, which
# sentence-transformers 6 moved (6.2 writes sentence_transformers.base.modules.transformer).
TRANSFORMERS = ("sentence_transformers.models.Transformer",
                "sentence_transformers.base.models.Transformer",
                "sentence_transformers.base.modules.transformer.Transformer")

# The Transformer module's settings file (max_seq_length, do_lower_case), by the name
# sentence-transformers gave it per family.
TRANSFORMER_CONFIGS = tuple(f"sentence_{name}_config.json" for name in (
    "bert", "roberta", "distilbert", "camembert", "albert", "xlm-roberta", "xlnet"))


class ModulesError(ValueError):
  """A modules.json that does not say where its Transformer is; one line naming the file."""


def read_modules(path: str | os.PathLike) -> list[dict] | None:
  """The entries of the sentence-transformers folder `path`'s modules.json (objects with a
  path, each a folder inside `path`), checked as far as every reader needs; None where
  `path` holds no modules.json."""
  path = os.fspath(path)
  file = os.path.join(path, "modules.json")
  if not os.path.isfile(file):
    return None
  try:
    with open(file, encoding="utf-8") as f:
      modules = json.load(f)
  except (OSError, ValueError) as e:
    raise ModulesError(f"{file}: not readable JSON ({e})") from None
  if not isinstance(modules, list) or not modules or not all(
      isinstance(m, dict) and isinstance(m.get("path"), str) and "\0" not in m["path"]
      for m in modules):
    raise ModulesError(f"{file}: holds {_excerpt(modules)}, expected a list of modules (objects "
                       f"of idx, name, path and type), the first the Transformer's")
  root = os.path.realpath(path)
  for i, module in enumerate(modules):
    folder = os.path.realpath(os.path.join(path, module["path"]))
    if os.path.commonpath([root, folder]) != root:
      which = "the Transformer's" if i == 0 else f"module {i}'s"
      raise ModulesError(f"{file}: {which} path {module['path']!r} leads out of {path} "
                         f"(to {folder}), expected a folder of it")
  return modules


def transformer_folder(path: str | os.PathLike) -> str | None:
  """The folder of the Transformer module of the sentence-transformers folder `path` (its first
  module): `path` itself in newer sentence-transformers, a subfolder such as 0_Transformer in
  older ones; None where `path` holds no modules.json."""
  path = os.fspath(path)
  modules = read_modules(path)
  if modules is None:
    return None
  first, file = modules[0], os.path.join(path, "modules.json")
  if first.get("type") not in TRANSFORMERS:
    raise ModulesError(f"{file}: the first module is of type {first.get('type')!r}, expected "
                       f"{TRANSFORMERS[0]!r} (the Hugging Face model the others run on)")
  if not os.path.isdir(os.path.join(path, first["path"])):
    raise ModulesError(f"{file}: the Transformer's path {first['path']!r} is no folder of "
                       f"{path}")
  return os.path.join(path, first["path"]) if first["path"] else path


def _excerpt(value: Any) -> str:
  """`value` as an error shows it: its start, on one line."""
  text = json.dumps(value)
  return text if len(text) <= 60 else text[:57] + "..."
