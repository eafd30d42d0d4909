"""Labelled examples for fine-tuning: JSON lines in, token ids and labels out.

Each line of a training or held-out file (JSON lines, `.gz`/`.zst`/... compressed, or the rows
of a Parquet file: whatever train.prepare reads) is an object. For a label per text
(`prepare_examples`): the text under "text", an optional second text under "text_pair", and
its label under "label": a class (a string or an integer; every label of a file of one kind;
the sorted labels of the training file are the classes, a held-out label outside them is an
error) or, for regression, a number. For a tag per word (`prepare_tagged`): the words under
"tokens" and their tags under "tags", lists of the same length (the tags classes as above).
Both write, into a directory:

  {train,eval}.tokens.bin  int ids [n, seq_len]: the text's ids (then the separator and the
                           pair's; or the words' ids), truncated to seq_len (the longer text
                           first) and padded
  {train,eval}.labels.bin  each example's class (int32 [n]) or number (float32 [n]); for tags,
                           int32 [n, seq_len]: a word's tag at its first id, -1 elsewhere
  dataset.json             the classes or tags, the tokenizer, counts (truncated ones too) and
                           each input's size and SHA-256, as train.prepare records them
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


LABEL_KINDS = ("class", "number", "tag")


def recorded_kind(kind: str) -> str | None:
  """What dataset.json records of a label kind: nothing (None) for classes, as it did before
  there were other kinds."""
  return None if kind == "class" else kind


def label_kind(meta: dict) -> str:
  """The label kind of the examples whose dataset.json is `meta`."""
  return meta.get("label_kind") or "class"


def read_labels(path: str, label_field: str) -> list:
  """The sorted classes of a file's labels, every line checked."""
  source, labels, kind = sources.Source(path), set(), None
  for number, record in _records(source):
    label = record.get(label_field, _MISSING)
    if label is _MISSING:
      raise RunError(f"{path}:{number}: no {label_field!r} field, expected every line to have "
                     f"a label")
    if isinstance(label, float):
      raise RunError(f"{path}:{number}: label {label!r} is a number with a fraction, expected "
                     f"a string or an integer (a number per text is regression: "
                     f"configs/regress.py)")
    kind = _class_kind(label, kind, f"{path}:{number}: label")
    labels.add(label)
  return _classes(path, labels, "label", "classes")


def _class_kind(label, kind: type | None, where: str) -> type:
  """The kind of a class `label` (str or int), which must be `kind` where that is known."""
  if isinstance(label, bool) or not isinstance(label, (str, int)):
    raise RunError(f"{where} {label!r} is a {type(label).__name__}, expected a string or an "
                   f"integer")
  if kind is not None and type(label) is not kind:
    raise RunError(f"{where} {label!r} is a {type(label).__name__}, but the ones before it "
                   f"are {kind.__name__}s: expected one kind")
  return type(label)


def _classes(path: str, labels: set, what: str, plural: str) -> list:
  if not labels:
    raise RunError(f"{path}: no examples, expected JSON lines with a text and a {what}")
  if len(labels) < 2:
    raise RunError(f"{path}: every example has the {what} {labels.pop()!r}, expected at least "
                   f"two {plural}")
  return sorted(labels)


def _number(label, where: str, field: str) -> float:
  """A regression target: a finite number (not a bool, not a string)."""
  if label is _MISSING:
    raise RunError(f"{where}: no {field!r} field, expected every line to have a number")
  if isinstance(label, bool) or not isinstance(label, (int, float)):
    raise RunError(f"{where}: label {label!r} is a {type(label).__name__}, expected a number "
                   f"(a regression target)")
  if not np.isfinite(label):
    raise RunError(f"{where}: label {label!r}, expected a finite number")
  return float(label)


_MISSING = object()


def _records(source: sources.Source) -> Iterator[tuple[int, dict]]:
  try:
    yield from source.records()
  except sources.PrepareError as e:
    raise RunError(str(e)) from None
  except FileNotFoundError:
    raise RunError(f"{source.path}: no such file") from None


def _examples(source: sources.Source, fields: dict, classes: dict | None) -> Iterator[tuple]:
  """(text, pair or None, class index, or the number where `classes` is None) of each line,
  checked."""
  for number, record in _records(source):
    text, pair = record.get(fields["text"]), record.get(fields["pair"])
    if not isinstance(text, str):
      raise RunError(f"{source.path}:{number}: no string {fields['text']!r} field, expected "
                     f"the text to classify")
    if pair is not None and not isinstance(pair, str):
      raise RunError(f"{source.path}:{number}: {fields['pair']!r} is a "
                     f"{type(pair).__name__}, expected a string")
    label = record.get(fields["label"], _MISSING)
    if classes is None:
      yield text, pair, _number(label, f"{source.path}:{number}", fields["label"])
      continue
    if label not in classes:
      raise RunError(f"{source.path}:{number}: label {label!r} is not one of the training "
                     f"file's classes {list(classes)[:10]}")
    yield text, pair, classes[label]


example_ids = tokenizer_lib.example_ids  # one layout for training, predict and the library
encode_words = tokenizer_lib.encode_words


def prepare_examples(paths: dict, directory: str, tokenizer: Tokenizer, tokenizer_file,
                     seq_len: int, fields: dict, pad_id: int, separator_id: int,
                     template=None, kind: str = "class") -> dict:
  """Writes `paths` {'train': …, 'eval': …} as ids and labels into `directory` (see the module
  docstring), under a temporary name renamed at the end; returns its dataset.json. A
  `template` (flax_encoder.tokenizer.Template) lays the texts out in place of the separator.
  `kind`: the labels are classes ("class") or numbers ("number")."""
  classes = None
  if kind == "class":
    classes = {label: i for i, label in enumerate(read_labels(paths["train"], fields["label"]))}
  dtype = _ids_dtype(tokenizer)

  def encode(source):
    examples = _examples(source, fields, classes)
    while chunk := list(itertools.islice(examples, _CHUNK)):
      texts = tokenizer.encode_batch([t for t, _, _ in chunk])
      pairs = tokenizer.encode_batch([p or "" for _, p, _ in chunk])
      rows, cut = np.full((len(chunk), seq_len), pad_id, dtype), 0
      for i, (first, second, (_, pair, _)) in enumerate(zip(texts, pairs, chunk)):
        second = second if pair is not None else None
        ids, truncated = example_ids(first, second, seq_len, separator_id, template)
        rows[i, :len(ids)] = ids
        cut += truncated
      labels = np.array([c for _, _, c in chunk], np.int32 if classes else np.float32)
      yield rows, labels, cut, 0

  return _write(paths, directory, tokenizer, tokenizer_file, encode, "a text and a label", {
      "labels": list(classes) if classes else None, "label_kind": recorded_kind(kind),
      "pad_id": pad_id, "separator_id": separator_id,
      "template": template.to_dict() if template else None, "seq_len": seq_len,
      "dtype": np.dtype(dtype).name, "fields": fields})


def prepare_tagged(paths: dict, directory: str, tokenizer: Tokenizer, tokenizer_file,
                   seq_len: int, fields: dict, pad_id: int, template=None) -> dict:
  """Writes the tagged words of `paths` {'train': …, 'eval': …} into `directory` as
  `prepare_examples` writes texts, each word's tag at its first id (`encode_words`) and -1
  at every other position; returns its dataset.json, which also counts the words left
  untagged (cut off by seq_len, or tokenized to nothing)."""
  tags = {tag: i for i, tag in enumerate(read_tags(paths["train"], fields))}
  dtype = _ids_dtype(tokenizer)

  def encode(source):
    examples = _tagged(source, fields, tags)
    while chunk := list(itertools.islice(examples, _CHUNK)):
      rows = np.full((len(chunk), seq_len), pad_id, dtype)
      labels = np.full((len(chunk), seq_len), -1, np.int32)
      cut = untagged = 0
      for i, ((ids, first), (words, indices)) in enumerate(
          zip(encode_words(tokenizer, [w for w, _ in chunk], seq_len, template), chunk)):
        rows[i, :len(ids)] = ids
        seen = first >= 0
        labels[i, first[seen]] = np.asarray(indices, np.int32)[seen]
        cut += int(not seen.all())
        untagged += int((~seen).sum())
      yield rows, labels, cut, untagged

  return _write(paths, directory, tokenizer, tokenizer_file, encode, "words and their tags", {
      "labels": list(tags), "label_kind": "tag", "pad_id": pad_id,
      "template": template.to_dict() if template else None, "seq_len": seq_len,
      "dtype": np.dtype(dtype).name, "fields": fields})


def _ids_dtype(tokenizer: Tokenizer):
  return np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32


def _write(paths: dict, directory: str, tokenizer: Tokenizer, tokenizer_file, encode,
           wanted: str, meta: dict) -> dict:
  """Writes each split's chunks, as `encode(source)` yields them (ids, labels, examples
  truncated, words untagged), its tokenizer's file and dataset.json (`meta` and the counts)
  into `directory`, under a temporary name renamed at the end."""
  counts, truncated, untagged, inputs = {}, {}, {}, []
  with temporary_directory(directory) as tmp:
    for split, path in paths.items():
      source = sources.Source(path)
      counts[split] = truncated[split] = untagged[split] = 0
      with open(os.path.join(tmp, f"{split}.tokens.bin"), "wb") as ids_file, open(
          os.path.join(tmp, f"{split}.labels.bin"), "wb") as labels_file:
        for rows, labels, cut, words in encode(source):
          ids_file.write(rows.tobytes())
          labels_file.write(labels.tobytes())
          counts[split] += len(rows)
          truncated[split] += cut
          untagged[split] += words
      if not counts[split]:
        raise RunError(f"{path}: no examples, expected JSON lines with {wanted}")
      inputs.append(source.record())
    if tokenizer_file:
      shutil.copyfile(tokenizer.spec.path, os.path.join(tmp, tokenizer_file))
    meta = {"format": FORMAT, **meta,
            "tokenizer": {"kind": tokenizer.spec.kind, "file": tokenizer_file,
                          "offset": tokenizer.offset},
            "vocab_size": tokenizer.vocab_size, "examples": counts, "truncated": truncated,
            **({"untagged": untagged} if meta["label_kind"] == "tag" else {}),
            "inputs": inputs}
    with open(os.path.join(tmp, "dataset.json"), "w") as f:
      json.dump(meta, f, indent=1)
  return meta


def read_tags(path: str, fields: dict) -> list:
  """The sorted tags of a file's tagged words, every line checked."""
  tags, kind = set(), None
  for number, words, line_tags in _tagged_lines(sources.Source(path), fields):
    for tag in line_tags:
      kind = _class_kind(tag, kind, f"{path}:{number}: tag")
    tags.update(line_tags)
  return _classes(path, tags, "tag", "tags")


def _tagged_lines(source: sources.Source, fields: dict) -> Iterator[tuple[int, list, list]]:
  """(line number, words, tags) of each line, its words a list of strings and its tags a list
  as long."""
  words_field, tags_field = fields["tokens"], fields["tags"]
  for number, record in _records(source):
    where = f"{source.path}:{number}"
    words, tags = record.get(words_field, _MISSING), record.get(tags_field, _MISSING)
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
      got = "no such field" if words is _MISSING else f"got {_kind_of(words)}"
      raise RunError(f"{where}: {words_field!r}: {got}, expected a list of strings (the words)")
    if not isinstance(tags, list) or len(tags) != len(words):
      got = ("no such field" if tags is _MISSING else f"{len(tags)} tags" if
             isinstance(tags, list) else f"got {_kind_of(tags)}")
      raise RunError(f"{where}: {tags_field!r}: {got}, expected a list of one tag per word "
                     f"({len(words)})")
    yield number, words, tags


def _kind_of(value) -> str:
  """How an error names a JSON value of the wrong kind."""
  if isinstance(value, list):
    bad = next(v for v in value if not isinstance(v, str))
    return f"a list holding {bad!r}"
  return f"a {type(value).__name__}"


def _tagged(source: sources.Source, fields: dict, tags: dict) -> Iterator[tuple[list, list]]:
  """(words, tag indices) of each line, checked."""
  for number, words, line_tags in _tagged_lines(source, fields):
    unknown = next((t for t in line_tags if t not in tags), _MISSING)
    if unknown is not _MISSING:
      raise RunError(f"{source.path}:{number}: tag {unknown!r} is not one of the training "
                     f"file's tags {list(tags)[:10]}")
    yield words, [tags[t] for t in line_tags]


def load_examples(directory: str) -> dict:
  """{'train': {'tokens', 'labels'}, 'eval': …} memory-mapped, with 'meta' (dataset.json)
  and 'identity' (its SHA-256)."""
  path = os.path.join(directory, "dataset.json")
  with open(path, "rb") as f:
    raw = f.read()
  meta = json.loads(raw)
  if meta.get("format") != FORMAT:
    raise RunError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
  dtype, kind, seq_len = np.dtype(meta["dtype"]), label_kind(meta), meta["seq_len"]
  labels_dtype = np.float32 if kind == "number" else np.int32
  loaded = {"meta": meta, "identity": sha256_bytes(raw)}
  for split, n in meta["examples"].items():
    tokens = np.memmap(os.path.join(directory, f"{split}.tokens.bin"), dtype, "r",
                       shape=(n, seq_len))
    labels = np.memmap(os.path.join(directory, f"{split}.labels.bin"), labels_dtype, "r",
                       shape=(n, seq_len) if kind == "tag" else (n,))
    loaded[split] = {"tokens": tokens, "labels": labels}
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
