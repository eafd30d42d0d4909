"""A family's knowledge lives in its module (flax_encoder/families/): the library outside that
folder and the PyTorch bridge names no family, so adding one edits no shared file. Also what the
families now say for the rest: their tokenizers and their presets."""

import ast
import io
import os
import re
import sys
import tokenize

import pytest

from flax_encoder import EncoderConfig, families
from tests.runs import ROOT

LIBRARY = os.path.join(ROOT, "flax_encoder")
# the folders of the library where families are named: theirs and the PyTorch bridge's
OWN = ("families", "pytorch")
# parts of a model_type that name no family by themselves
GENERIC = {"v2", "v3", "embeddings", "xlm"}
# outside names that hold a family's word but name no family: sentence-transformers' settings
# files of a Transformer module (sentence_bert_config.json …)
NOT_A_FAMILY = re.compile(r"sentence_[a-z-]+_config")
WORDS = {word for family in families.FAMILIES.values()
         for name in (family.name, *family.model_types)
         for word in re.split(r"[^a-z0-9]+", name.lower()) if word} - GENERIC


def _docstrings(tree: ast.Module) -> set[tuple[int, int]]:
  """Where each docstring of a module, class or function starts (its token's start)."""
  starts = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      first = node.body[0] if node.body else None
      if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
          and isinstance(first.value.value, str)):
        starts.add((first.value.lineno, first.value.col_offset))
  return starts


# The tokens that hold words: names, strings and, from Python 3.12, an f-string's text.
_WORDS_IN = tuple(getattr(tokenize, kind) for kind in ("NAME", "STRING", "FSTRING_MIDDLE")
                  if hasattr(tokenize, kind))


def naming_a_family(source: str) -> list[tuple[int, str]]:
  """(line, word) of each identifier or string literal of `source` holding a family's name or
  model_type as a whole word (split at anything but letters and digits, case aside);
  comments and docstrings aside."""
  docstrings = _docstrings(ast.parse(source))
  found = []
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type == tokenize.STRING and token.start in docstrings:
      continue
    if token.type not in _WORDS_IN:
      continue  # comments among them
    text = NOT_A_FAMILY.sub(" ", token.string)
    for word in sorted(set(re.split(r"[^a-z0-9]+", text.lower())) & WORDS):
      if (token.start[0], word) not in found:
        found.append((token.start[0], word))
  return found


def _offenders() -> list[str]:
  offenders = []
  for folder, subfolders, files in os.walk(LIBRARY):
    subfolders[:] = sorted(d for d in subfolders
                           if not (folder == LIBRARY and d in OWN) and d != "__pycache__")
    for name in sorted(f for f in files if f.endswith(".py")):
      path = os.path.join(folder, name)
      with open(path, encoding="utf-8") as f:
        found = naming_a_family(f.read())
      offenders += [f"{os.path.relpath(path, ROOT)}:{line}: {word}" for line, word in found]
  return offenders


def test_the_scan_sees_names_and_strings_but_not_comments_or_docstrings():
  source = ('"""A BERT docstring."""\n'
            'def f(x):\n'
            '  """bert."""\n'
            '  # roberta in a comment\n'
            '  kind = "nomic_bert"\n'
            '  return x.modernbert, "sentence_bert_config.json", "ColBERT", f"{x} deberta-v2"\n')
  assert naming_a_family(source) == [(5, "bert"), (5, "nomic"), (6, "modernbert"),
                                     (6, "deberta")]


def test_no_library_file_outside_the_families_names_a_family():
  offenders = _offenders()
  print("\n".join(offenders))
  assert not offenders, "a family named outside flax_encoder/families/:\n" + "\n".join(offenders)


def test_each_tokenizer_class_is_claimed_once_and_each_model_type_has_one():
  claimed = [name for family in families.FAMILIES.values()
             for name in family.tokenizers.token_types]
  assert len(claimed) == len(set(claimed))
  for model_type in families.MODEL_TYPES:
    assert families.tokenizer_class(model_type) in families.TOKEN_TYPE_CLASSES, model_type
  assert families.tokenizer_class("xlnet") is None
  assert families.TOKEN_TYPE_CLASSES["BertTokenizer"] is True
  assert families.tokenizer_class("xlm-roberta") == "XLMRobertaTokenizer"
  assert families.get("mpnet").tokenizers.classes == {"mpnet": "MPNetTokenizer"}


def test_the_tokenizers_from_a_familys_own_files_are_found_through_the_families():
  assert [slow.files for slow in families.SLOW_TOKENIZERS] == [("spm.model",)]


def test_importing_the_tokenizers_imports_no_jax():
  import subprocess
  code = ("import sys, flax_encoder.hf_tokenizer; "
          "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax')))")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       check=True).stdout
  assert out.strip() == "[]"


def test_each_familys_preset_is_its_modules_and_none_is_encoder_configs():
  for family in families.FAMILIES.values():
    config = family.preset(64, pad_id=0)
    assert isinstance(config, EncoderConfig) and config.vocab_size == 64, family.name
  for name in ("bert", "roberta", "distilbert", "albert", "mpnet", "modernbert"):
    assert not hasattr(EncoderConfig, name), name
