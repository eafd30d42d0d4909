"""A run as a Hugging Face directory (`python -m train.export --layout hf --out DIR`):
config.json, model.safetensors and, where the run's ids are a Hugging Face tokenizer's own,
its tokenizer files, which transformers' Auto classes load.

What the run is as transformers' model is its task's to say (`train.task.HFModel`, the
definition's `hf_model`): a classifier a *ForSequenceClassification with its classes as
id2label, a regression the same with one output and problem_type "regression", a tagger a
*ForTokenClassification, further pretraining a *ForMaskedLM, pretraining from scratch the bare
model. Which family's: the one the run recorded (it started from such a directory), else the
one its architecture derives (`flax_encoder.families.of_architecture`: rotary positions
ModernBERT, an offset RoBERTa, token types BERT, else DistilBERT); `hf_config` says what
differs where the run's encoder is no model of the family. The export keeps the starting
directory's entries the family carries (`Family.carried`: ModernBERT's special ids), its
dropout rates (the model's settings for whoever trains it next, whatever this run trained
with) and its tokenizer files, as the run took them when it started (WORKDIR/start:
`train.tasks.start.start_folder`), whatever became of the directory since.

`--layout sentence-transformers` writes that directory as the Transformer module of a
sentence-transformers folder and the modules the run's `sentence_encoder` computes after it
(`flax_encoder.embeddings.save_modules`: a contrastive run's pooling and Normalize).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys

import numpy as np

from flax_encoder import families
from train import tasks
from train.errors import RunError
from train.files import os_errors_of_safetensors, readable_as_umask_allows, temporary_directory
from train.run.load import load_config
from train.tasks.start import start_folder

# The files of a tokenizer directory besides tokenizer.json, copied where the run started.
_TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json")


def check_out(out: str, layout: str = "hf") -> str | None:
  """Why `out` cannot be the directory written, or None. A link to a new or empty directory
  is written through: its target is the directory written."""
  real = os.path.realpath(out)
  if os.path.isdir(real) and os.listdir(real):
    return f"--out {out}: a directory that holds files, expected a new or empty directory"
  if os.path.exists(real) and not os.path.isdir(real):
    return (f"--out {out}: a file, expected a new or empty directory (--layout {layout} "
            f"writes one)")
  if not os.path.isdir(os.path.dirname(real)):
    return f"--out {out}: no directory {os.path.dirname(real)} to write it in"
  return None


def _start(workdir: str, config) -> str | None:
  """The folder of what the run took from the Hugging Face directory it started from
  (config.init.hf; `start_folder`), or None."""
  return start_folder(workdir, config.init.get("hf") if "init" in config else None)


def _family(start: str | None, model) -> families.Family:
  """The family the run exports as: the one it recorded; for a run recorded before runs
  recorded it, its starting directory's; else its architecture's."""
  if model.family:
    return families.get(model.family)
  if start:
    try:
      return families.of_directory(start)
    except ValueError:
      pass  # the starting directory is gone: the architecture decides
  return families.of_architecture(model.encoder)


def export_hf(workdir: str, out: str) -> str:
  """Writes the run in `workdir` to the directory `out` (see the module docstring)."""
  config = load_config(workdir)
  write = _writer(workdir, config, "hf")
  with temporary_directory(out) as tmp, os_errors_of_safetensors():
    write(tmp)
    readable_as_umask_allows(tmp)
  return out


def export_sentence_transformers(workdir: str, out: str) -> str:
  """Writes the run in `workdir` to the directory `out` as a sentence-transformers folder:
  its hf_model at the top as the Transformer module, then the modules after it (its
  definition's `sentence_encoder`: pooling, Normalize), which SentenceTransformer(out) and
  flax_encoder.embeddings.SentenceEncoder.load(out) load."""
  config = load_config(workdir)
  task = config.task.get("name", "masked_lm")
  definition = tasks.definition(task)
  if definition.sentence_encoder is None:
    raise RunError(f"--layout sentence-transformers: a {task} run embeds no sentences "
                   f"(a contrastive run does: configs/embed.py)")
  write = _writer(workdir, config, "sentence-transformers")
  encoder = definition.sentence_encoder(workdir)
  with temporary_directory(out) as tmp, os_errors_of_safetensors():
    write(tmp)
    if not os.path.isfile(os.path.join(tmp, "tokenizer.json")):
      raise RunError(f"--layout sentence-transformers: the run's ids are this project's own "
                     f"(config.data.tokenizer={config.data.tokenizer!r}), not a Hugging Face "
                     f"tokenizer's, so there is no tokenizer.json to give it; start from one "
                     f"(config.init.hf)")
    encoder.save_modules(tmp)
    readable_as_umask_allows(tmp)
  start = _start(workdir, config)
  theirs = _max_seq_length(start, encoder.model.config.max_len)
  if theirs is not None and theirs != encoder.max_seq_length:
    print(f"export: max_seq_length {encoder.max_seq_length}, the run's config.train.seq_len "
          f"(its start, {config.init.hf}, had {theirs})", file=sys.stderr)
  return out


def _max_seq_length(start: str | None, positions: int) -> int | None:
  """The max_seq_length of the sentence-transformers folder the run started from (as taken
  into `start`, train.tasks.start.start_folder), or None where it was no such folder."""
  from flax_encoder.embeddings import read_max_seq_length
  if not start or not os.path.isfile(os.path.join(start, "sentence_bert_config.json")):
    return None
  try:
    return read_max_seq_length(start, positions)
  except ValueError:
    return None


def _writer(workdir: str, config, layout: str):
  """A function that writes the run as transformers' model of its task into a directory:
  config.json, model.safetensors and the tokenizer files. Whatever refuses the conversion
  (a RunError) is found before anything is written."""
  import safetensors.numpy

  task = config.task.get("name", "masked_lm")
  definition = tasks.definition(task)
  if definition.hf_model is None:
    raise RunError(f"--layout {layout}: a {task} run has no Hugging Face model")
  model = definition.hf_model(workdir, config)
  start = _start(workdir, config)
  cfg, family = model.encoder, _family(start, model)
  try:
    families.hf_config(cfg, family.name)  # says what differs, before anything is converted
    state, entries = model.state(family)
    contents = families.hf_config(_with_starting_rates(cfg, start), family.name,
                                  **{**_carried(start, family), **entries})
  except families.HFError as e:
    raise RunError(f"--layout {layout}: {e}") from None

  def write(directory: str) -> None:
    # Contiguous: safetensors writes an array's buffer as it lies (a transposed view's too).
    safetensors.numpy.save_file({k: np.ascontiguousarray(v, np.float32 if v.dtype.name ==
                                                         "bfloat16" else v.dtype)
                                 for k, v in state.items()},
                                os.path.join(directory, "model.safetensors"),
                                metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
      json.dump(contents, f, indent=2)
    _tokenizer(model.tokenizer, start, directory, config.train.seq_len)

  return write


def _carried(start: str | None, family: families.Family) -> dict:
  """The entries of the directory the run started from that its family carries."""
  if not family.carried or not start:
    return {}
  try:
    hf = families.read_hf_config(start)
  except ValueError:
    return {}  # the starting directory is gone: transformers' defaults
  return {k: hf[k] for k in family.carried if k in hf}


def _with_starting_rates(cfg, start: str | None):
  """`cfg` with the dropout rates of the directory the run started from, read by its family
  (transformers applies attention dropout whatever this run's kernel did); as it is where the
  run started elsewhere or the directory is gone."""
  try:
    rates = families.config_from_hf(families.read_hf_config(start), attention_impl="reference")
  except (TypeError, ValueError):  # no start (None), or the directory is gone
    return cfg
  return dataclasses.replace(cfg, dropout=rates.dropout, attention_dropout=rates.attention_dropout,
                             attention_impl="reference")


def _tokenizer(file: str | None, start: str | None, out: str, seq_len: int) -> None:
  """Copies the tokenizer.json whose ids the run's are, and the other tokenizer files the run
  took from its starting directory (`start`), its tokenizer_config.json saying the run's
  length (`model_max_length`, what transformers' tokenizer truncates to); nothing where the
  run's ids are this project's numbering."""
  if file is None:
    return
  shutil.copyfile(file, os.path.join(out, "tokenizer.json"))
  for name in _TOKENIZER_FILES:
    if start and os.path.isfile(os.path.join(start, name)):
      shutil.copyfile(os.path.join(start, name), os.path.join(out, name))
  path = os.path.join(out, "tokenizer_config.json")
  settings = {}
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      settings = json.load(f)
    if not isinstance(settings, dict):  # the run checked it; an edit since in WORKDIR/start
      raise RunError(f"{os.path.join(start, 'tokenizer_config.json')}: holds a "
                     f"{type(settings).__name__}, expected a JSON object")
  with open(path, "w", encoding="utf-8") as f:
    json.dump({**settings, "model_max_length": seq_len}, f, indent=2)
