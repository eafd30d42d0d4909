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


class ModulesError(ValueError):
  """A modules.json that does not say where its Transformer is; one line naming the file."""


def transformer_folder(path: str | os.PathLike) -> str | None:
  """The folder of the Transformer module of the sentence-transformers folder `path` (its first
  module): `path` itself in newer sentence-transformers, a subfolder such as 0_Transformer in
  older ones; None where `path` holds no modules.json."""
  path = os.fspath(path)
  file = os.path.join(path, "modules.json")
  if not os.path.isfile(file):
    return None
  try:
    with open(file, encoding="utf-8") as f:
      modules = json.load(f)
  except (OSError, ValueError) as e:
    raise ModulesError(f"{file}: not readable JSON ({e})") from None
  first = modules[0] if isinstance(modules, list) and modules else None
  if (not isinstance(first, dict) or not isinstance(first.get("path"), str)
      or "\0" in first["path"]):
    raise ModulesError(f"{file}: holds {_excerpt(modules)}, expected a list of modules (objects "
                       f"of idx, name, path and type), the first the Transformer's")
  if first.get("type") not in TRANSFORMERS:
    raise ModulesError(f"{file}: the first module is of type {first.get('type')!r}, expected "
                       f"{TRANSFORMERS[0]!r} (the Hugging Face model the others run on)")
  folder, root = os.path.realpath(os.path.join(path, first["path"])), os.path.realpath(path)
  if os.path.commonpath([root, folder]) != root:
    raise ModulesError(f"{file}: the Transformer's path {first['path']!r} leads out of {path} "
                       f"(to {folder}), expected a folder of it")
  if not os.path.isdir(folder):
    raise ModulesError(f"{file}: the Transformer's path {first['path']!r} is no folder of "
                       f"{path}")
  return os.path.join(path, first["path"]) if first["path"] else path


def _excerpt(value: Any) -> str:
  """`value` as an error shows it: its start, on one line."""
  text = json.dumps(value)
  return text if len(text) <= 60 else text[:57] + "..."
