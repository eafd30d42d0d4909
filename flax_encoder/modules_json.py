"""A sentence-transformers folder's modules.json: which of its folders is the Transformer
module, the Hugging Face model directory (config.json, weights, tokenizer) the other modules
(Pooling, Dense, Normalize) run on; `read_json`, how every reader of such a folder reads
its JSON files; and `FolderFiles`, the files one load reads, each opened once. It imports no
JAX, so tokenizing workers can read it.

    transformer_folder("all-MiniLM-L6-v2")  # the folder itself (sentence-transformers >= 2)
    transformer_folder("older-model")       # older-model/0_Transformer
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

# The Transformer module's type as modules.json names it: where its class lives, which
# sentence-transformers 6 moved (6.2 writes sentence_transformers.base.modules.transformer).
TRANSFORMERS = ("sentence_transformers.models.Transformer",
                "sentence_transformers.base.models.Transformer",
                "sentence_transformers.base.modules.transformer.Transformer",
                # a sparse encoder's of sentence-transformers 5 (a Transformer of a masked LM)
                "sentence_transformers.sparse_encoder.models.MLMTransformer",
                "sentence_transformers.sparse_encoder.modules.mlm_transformer.MLMTransformer")

# The Transformer module's settings file (max_seq_length, do_lower_case), by the names
# sentence-transformers reads it under (one per architecture of its early versions).
TRANSFORMER_CONFIGS = ("sentence_bert_config.json", "sentence_roberta_config.json",
                       "sentence_distilbert_config.json", "sentence_camembert_config.json",
                       "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
                       "sentence_xlnet_config.json")


class ModulesError(ValueError):
  """A modules.json that does not say where its Transformer is; one line naming the file."""


def not_a_file(file: str) -> str | None:
  """What the path `file` is where it is there but no regular file ("a directory", "a FIFO"
  …), else None (a regular file, or a link to one; or nothing there). Opening a FIFO blocks
  until something writes to it, so a folder's files are looked at before they are opened."""
  try:
    mode = os.stat(file).st_mode
  except (FileNotFoundError, NotADirectoryError):
    return "a broken link" if os.path.islink(file) else None
  except OSError as e:
    return f"not readable ({e.strerror})"
  if stat.S_ISREG(mode):
    return None
  kinds = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO (named pipe)",
           stat.S_ISSOCK: "a socket", stat.S_ISCHR: "a character device",
           stat.S_ISBLK: "a block device"}
  return next((name for test, name in kinds.items() if test(mode)), "no regular file")


def read_json(file: str, error: type[ValueError] = ModulesError, kind: type | None = None,
              required: bool = False, files: FolderFiles | None = None) -> Any:
  """The JSON value in `file` (checked to be a `kind`, dict or list, where given); None where
  there is no such file, unless `required`. Raises `error` (the caller's type) in one line
  naming the file where it is no regular file (a directory, a FIFO), not UTF-8, not JSON or
  nested too deeply for Python's parser. Through `files`, where given: a file it read already
  is not opened again."""
  return (files or FolderFiles()).read_json(file, error, kind, required)


class FolderFiles:
  """The JSON files one load of a model folder reads (modules.json, the modules' config.json,
  config_sentence_transformers.json, the tokenizer's options …), each opened at most once: what
  the first reader found (the value, that the file is not there, or what is wrong with it) is
  kept, and each later reader of the file gets it, checked as that reader expects (its error
  class, a JSON object or list, whether the file must be there). A file changed since (another
  inode, size or time of change) is read again. A load hands one to every reader of its
  folder; a reader given none reads the file itself."""

  def __init__(self):
    # file -> (its stat's signature, its value, what is wrong with it)
    self._found: dict[str, tuple[tuple, Any, str | None]] = {}

  def read_json(self, file: str, error: type[ValueError] = ModulesError,
                kind: type | None = None, required: bool = False) -> Any:
    """`read_json`'s value of `file`, read once."""
    key, signature = os.path.normpath(os.path.abspath(file)), file_signature(file)
    if key not in self._found or self._found[key][0] != signature:
      self._found[key] = (signature, *_parse(file))
    _, value, wrong = self._found[key]
    if wrong is not None:
      raise error(f"{file}: {wrong}")
    if value is _ABSENT:
      if required:
        raise error(f"{file}: no such file")
      return None
    if kind is not None and not isinstance(value, kind):
      raise error(f"{file}: holds a {type(value).__name__}, expected a JSON "
                  f"{'object' if kind is dict else 'list'}")
    return value


_ABSENT = object()  # a file that is not there, as FolderFiles keeps it


def file_signature(file: str) -> tuple:
  """What tells the file `file` from another or a changed one: its inode, size and times of
  change; () where there is none."""
  try:
    stat = os.stat(file)
  except OSError:
    return ()
  return stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def _parse(file: str) -> tuple[Any, str | None]:
  """(the JSON value in `file`, or _ABSENT where there is no such file; None) or (None, what is
  wrong with it)."""
  what = not_a_file(file)
  if what is not None:
    return None, f"{what}, expected a JSON file"
  try:
    with open(file, encoding="utf-8") as f:
      return json.load(f), None
  except (FileNotFoundError, NotADirectoryError):
    return _ABSENT, None
  except RecursionError:  # json's parser recurses once per level of nesting
    return None, "not readable JSON (nested too deeply)"
  except (OSError, ValueError) as e:  # ValueError: JSONDecodeError, UnicodeDecodeError
    return None, f"not readable JSON ({(str(e).splitlines() or [''])[0]})"


def write_json(file: str, value: Any) -> None:
  """`value` as the indented JSON file `file` (its directory made where missing), as
  sentence-transformers writes a folder's files."""
  os.makedirs(os.path.dirname(file) or ".", exist_ok=True)
  with open(file, "w", encoding="utf-8") as f:
    json.dump(value, f, indent=2)


def read_modules(path: str | os.PathLike, files: FolderFiles | None = None
                 ) -> list[dict] | None:
  """The entries of the sentence-transformers folder `path`'s modules.json (objects with a
  path, each a folder inside `path`), checked as far as every reader needs; None where
  `path` holds no modules.json. Read through `files` where given."""
  path = os.fspath(path)
  file = os.path.join(path, "modules.json")
  # a modules.json that is no file (a directory, a FIFO) is refused by read_json, not taken
  # for a folder without one: sentence-transformers fails on it too
  modules = read_json(file, files=files)
  if modules is None:
    return None
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


def transformer_folder(path: str | os.PathLike, files: FolderFiles | None = None) -> str | None:
  """The folder of the Transformer module of the sentence-transformers folder `path` (its first
  module): `path` itself in newer sentence-transformers, a subfolder such as 0_Transformer in
  older ones; None where `path` holds no modules.json. Read through `files` where given."""
  path = os.fspath(path)
  modules = read_modules(path, files)
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
