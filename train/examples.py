"""Labelled examples for fine-tuning: JSON lines in, token ids and label indices out.

Each line of a training or held-out file (JSON lines, `.gz`/`.zst`/... compressed, or the rows
of a Parquet file: whatever train.prepare reads) is an object: the text under "text", an optional
second text under "text_pair", and its label under "label" (a string or an integer; every
label of a file of one kind). The labels of the training file, sorted, are the classes; a
held-out label outside them is an error. `prepare_examples` writes, into a directory:

  {train,eval}.tokens.bin  int ids [n, seq_len]: the text's ids (then the separator and the
                           pair's), truncated to seq_len (the longer text first) and padded
  {train,eval}.labels.bin  int32 [n]: each example's class
  dataset.json             the classes, the tokenizer, counts (truncated ones too) and each
                           input's size and SHA-256, as train.prepare records them
  tokenizer.*              the tokenizer's file, beside them

Files of any size are read line by line, twice (the classes first), and written as they go.
`BUILTIN` is a labelled task that ships with this checkout: which standard-library package a
few lines of its source come from.
"""

from __future__ import annotations

import itertools
import json
import lzma
import os
import shutil
from collections.abc import Iterator

import numpy as np

from train import sources
from train.files import sha256_bytes, temporary_directory
from train.errors import RunError
from flax_encoder import tokenizer as tokenizer_lib
from train.tokens import Tokenizer

FORMAT = "flax-encoder examples 1"
BUILTIN = "builtin:stdlib-packages"
BUILTIN_DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "builtin")
_CHUNK = 2048  # examples tokenized at once


def read_labels(path: str, label_field: str) -> list:
  """The sorted classes of a file's labels, every line checked."""
  source, labels, kind = sources.Source(path), set(), None
  for number, record in _records(source):
    label = record.get(label_field, _MISSING)
    if label is _MISSING:
      raise RunError(f"{path}:{number}: no {label_field!r} field, expected every line to have "
                     f"a label")
    if isinstance(label, bool) or not isinstance(label, (str, int)):
      what = "a number with a fraction (regression is not supported)" if isinstance(
          label, float) else f"a {type(label).__name__}"
      raise RunError(f"{path}:{number}: label {label!r} is {what}, expected a string or an "
                     f"integer")
    if kind is None:
      kind = type(label)
    elif type(label) is not kind:
      raise RunError(f"{path}:{number}: label {label!r} is a {type(label).__name__}, but the "
                     f"labels before it are {kind.__name__}s: expected one kind")
    labels.add(label)
  if not labels:
    raise RunError(f"{path}: no examples, expected JSON lines with a text and a label")
  if len(labels) < 2:
    raise RunError(f"{path}: every example has the label {labels.pop()!r}, expected at least "
                   f"two classes")
  return sorted(labels)


_MISSING = object()


def _records(source: sources.Source) -> Iterator[tuple[int, dict]]:
  try:
    yield from source.records()
  except sources.PrepareError as e:
    raise RunError(str(e)) from None
  except FileNotFoundError:
    raise RunError(f"{source.path}: no such file") from None


def _examples(source: sources.Source, fields: dict, classes: dict) -> Iterator[tuple]:
  """(text, pair or None, class index) of each line, checked."""
  for number, record in _records(source):
    text, pair = record.get(fields["text"]), record.get(fields["pair"])
    if not isinstance(text, str):
      raise RunError(f"{source.path}:{number}: no string {fields['text']!r} field, expected "
                     f"the text to classify")
    if pair is not None and not isinstance(pair, str):
      raise RunError(f"{source.path}:{number}: {fields['pair']!r} is a "
                     f"{type(pair).__name__}, expected a string")
    label = record.get(fields["label"], _MISSING)
    if label not in classes:
      raise RunError(f"{source.path}:{number}: label {label!r} is not one of the training "
                     f"file's classes {list(classes)[:10]}")
    yield text, pair, classes[label]


example_ids = tokenizer_lib.example_ids  # one layout for training, predict and the library


def prepare_examples(paths: dict, directory: str, tokenizer: Tokenizer, tokenizer_file,
                     seq_len: int, fields: dict, pad_id: int, separator_id: int,
                     template=None) -> dict:
  """Writes `paths` {'train': …, 'eval': …} as ids and labels into `directory` (see the module
  docstring), under a temporary name renamed at the end; returns its dataset.json. A
  `template` (flax_encoder.tokenizer.Template) lays the texts out in place of the separator."""
  classes = {label: i for i, label in enumerate(read_labels(paths["train"], fields["label"]))}
  dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
  counts, truncated, inputs = {}, {}, []
  with temporary_directory(directory) as tmp:
    for split, path in paths.items():
      source = sources.Source(path)
      counts[split] = truncated[split] = 0
      with open(os.path.join(tmp, f"{split}.tokens.bin"), "wb") as ids_file, open(
          os.path.join(tmp, f"{split}.labels.bin"), "wb") as labels_file:
        examples = _examples(source, fields, classes)
        while chunk := list(itertools.islice(examples, _CHUNK)):
          texts = tokenizer.encode_batch([t for t, _, _ in chunk])
          pairs = tokenizer.encode_batch([p or "" for _, p, _ in chunk])
          rows = np.full((len(chunk), seq_len), pad_id, dtype)
          for i, (first, second, (_, pair, _)) in enumerate(zip(texts, pairs, chunk)):
            second = second if pair is not None else None
            ids, cut = example_ids(first, second, seq_len, separator_id, template)
            rows[i, :len(ids)] = ids
            truncated[split] += cut
          ids_file.write(rows.tobytes())
          labels_file.write(np.array([c for _, _, c in chunk], np.int32).tobytes())
          counts[split] += len(chunk)
      if not counts[split]:
        raise RunError(f"{path}: no examples, expected JSON lines with a text and a label")
      inputs.append(source.record())
    if tokenizer_file:
      shutil.copyfile(tokenizer.spec.path, os.path.join(tmp, tokenizer_file))
    meta = {"format": FORMAT, "labels": list(classes),
            "tokenizer": {"kind": tokenizer.spec.kind, "file": tokenizer_file,
                          "offset": tokenizer.offset},
            "vocab_size": tokenizer.vocab_size, "pad_id": pad_id, "separator_id": separator_id,
            "template": template.to_dict() if template else None,
            "seq_len": seq_len, "dtype": np.dtype(dtype).name, "examples": counts,
            "truncated": truncated, "fields": fields, "inputs": inputs}
    with open(os.path.join(tmp, "dataset.json"), "w") as f:
      json.dump(meta, f, indent=1)
  return meta


def load_examples(directory: str) -> dict:
  """{'train': {'tokens', 'labels'}, 'eval': …} memory-mapped, with 'meta' (dataset.json)
  and 'identity' (its SHA-256)."""
  path = os.path.join(directory, "dataset.json")
  with open(path, "rb") as f:
    raw = f.read()
  meta = json.loads(raw)
  if meta.get("format") != FORMAT:
    raise RunError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
  dtype = np.dtype(meta["dtype"])
  loaded = {"meta": meta, "identity": sha256_bytes(raw)}
  for split, n in meta["examples"].items():
    tokens = np.memmap(os.path.join(directory, f"{split}.tokens.bin"), dtype, "r",
                       shape=(n, meta["seq_len"]))
    loaded[split] = {"tokens": tokens,
                     "labels": np.memmap(os.path.join(directory, f"{split}.labels.bin"),
                                         np.int32, "r", shape=(n,))}
  return loaded


# ---------------------------------------------------------------------------------------------
# The built-in task: which standard-library package a few lines of its source come from.


def write_builtin(directory: str) -> dict:
  """Writes train.jsonl and eval.jsonl of the built-in task into `directory`; returns their
  paths. The examples are a snapshot shipped in train/builtin (train/builtin/snapshot.py made
  it), the same on every Python: runs of whole lines of at most 120 bytes of the sources of
  nine standard-library packages, 1200 per package for training and 120 held out."""
  os.makedirs(directory, exist_ok=True)
  paths = {split: os.path.join(directory, f"{split}.jsonl") for split in ("train", "eval")}
  for split, path in paths.items():
    with lzma.open(os.path.join(BUILTIN_DIRECTORY, f"stdlib_packages.{split}.jsonl.xz")) as f:
      data = f.read()
    with open(path + ".tmp", "wb") as f:
      f.write(data)
    os.replace(path + ".tmp", path)
  return paths
