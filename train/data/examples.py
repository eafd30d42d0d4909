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

Packed (`prepare_examples(..., max_segments=k)`, for classes: dataset.json's "packed" says so
and "rows" counts the rows), several short examples share a row of seq_len ids (`pack`):

  {train,eval}.tokens.bin    ids [rows, seq_len]: the examples one after another, then padding
  {train,eval}.segments.bin  [rows, seq_len]: which of its row's examples an id belongs to
                             (1 … k), 0 at padding (flax_encoder.packing's segment ids)
  {train,eval}.labels.bin    int32 [rows, k]: the row's examples' classes in order, then -1

Files of any size are read line by line, twice (the classes first), and written as they go;
of a text only the ids an example can hold are tokenized, a piece at a time
(`Tokenizer.encode_leading`), so that lines of any length take bounded memory. A file whose tokens are
all the tokenizer's unknown token is refused, one where more than a fifth are is warned of.
`BUILTIN` is a labelled task that ships with this checkout: which standard-library package a
few lines of its source come from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import lzma
import os
import sys
from collections.abc import Callable, Iterator

import numpy as np

from train.data import sources
from train.errors import RunError
from train.files import sha256_bytes, temporary_directory
from flax_encoder import tokenizer as tokenizer_lib
from train.data.tokens import UNKNOWN_WARNING, Tokenizer

FORMAT = "flax-encoder examples 1"
BUILTIN = "builtin:stdlib-packages"
BUILTIN_DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "builtin")
CHUNK = 2048  # examples tokenized at once
# A chunk also holds this many characters at most (but for the example that passes it): the
# tokenizers hold 130 to 200 bytes per character they encode at once.
_CHUNK_CHARS = 1 << 22


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
  for number, record in records(source):
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


_LARGEST = float(np.finfo(np.float32).max)  # the labels are stored and trained as float32


def target(label, where: str, field: str) -> float:
  """A regression target: a finite number (not a bool, not a string) that float32 holds."""
  if label is _MISSING:
    raise RunError(f"{where}: no {field!r} field, expected every line to have a number")
  if isinstance(label, bool) or not isinstance(label, (int, float)):
    raise RunError(f"{where}: label {label!r} is a {type(label).__name__}, expected a number "
                   f"(a regression target)")
  if isinstance(label, int) and abs(label) > _LARGEST:  # float() of it would overflow
    digits = str(abs(label))
    raise RunError(f"{where}: {field!r}: label {'-' * (label < 0)}{digits[:12]}… (an integer "
                   f"of {len(digits)} digits), expected a finite number of magnitude at most "
                   f"{_LARGEST:.4g} (float32)")
  if not np.isfinite(label):
    raise RunError(f"{where}: label {label!r}, expected a finite number")
  if abs(label) > _LARGEST:
    raise RunError(f"{where}: {field!r}: label {label!r}, expected a finite number of "
                   f"magnitude at most {_LARGEST:.4g} (float32)")
  return float(label)


def known(label, classes: dict) -> bool:
  """Whether `label` is one of `classes` ({class: index}): only a string or an integer is (a
  list is unhashable; True and 1.0 would pass for the class 1)."""
  return (not isinstance(label, bool) and isinstance(label, (str, int)) and label in classes)


_MISSING = object()


def records(source: sources.Source) -> Iterator[tuple[int, dict]]:
  try:
    yield from source.records()
  except sources.PrepareError as e:
    raise RunError(str(e)) from None
  except FileNotFoundError:
    raise RunError(f"{source.path}: no such file") from None


def _examples(source: sources.Source, fields: dict, classes: dict | None) -> Iterator[tuple]:
  """(line number, text, pair or None, class index, or the number where `classes` is None)
  of each line, checked."""
  for number, record in records(source):
    text, pair = record.get(fields["text"]), record.get(fields["pair"])
    if not isinstance(text, str):
      raise RunError(f"{source.path}:{number}: no string {fields['text']!r} field, expected "
                     f"the text to classify")
    if pair is not None and not isinstance(pair, str):
      raise RunError(f"{source.path}:{number}: {fields['pair']!r} is a "
                     f"{type(pair).__name__}, expected a string")
    label = record.get(fields["label"], _MISSING)
    if classes is None:
      yield number, text, pair, target(label, f"{source.path}:{number}", fields["label"])
      continue
    if not known(label, classes):
      raise RunError(f"{source.path}:{number}: label {label!r} is not one of the training "
                     f"file's classes {list(classes)[:10]}")
    yield number, text, pair, classes[label]


example_ids = tokenizer_lib.example_ids  # one layout for training, predict and the library
encode_words = tokenizer_lib.encode_words


def characters(example) -> int:
  """The characters of an example: a (text, pair or None), or a list of words (each tokenized
  after a space)."""
  if isinstance(example, tuple):
    return sum(len(text) for text in example if text is not None)
  return sum(1 + len(word) for word in example)


def chunked(items: Iterator, size: int, example: Callable) -> Iterator[list]:
  """`items` in lists of `size` at most, and of _CHUNK_CHARS characters of their examples
  (`example` of an item) but for the item that passes it: a chunk held and tokenized takes
  bounded memory however long the lines."""
  chunk, held = [], 0
  for item in items:
    chunk.append(item)
    held += characters(example(item))
    if len(chunk) == size or held >= _CHUNK_CHARS:
      yield chunk
      chunk, held = [], 0
  if chunk:
    yield chunk


@dataclasses.dataclass
class _Counts:
  """What a file's examples came to: how many, in how many rows, how many truncated to seq_len
  ids, with words left untagged; their text ids, how many of
  those the tokenizer's unknown token, and the first line that had one (line number, text)."""

  examples: int = 0
  rows: int = 0
  truncated: int = 0
  untagged: int = 0
  tokens: int = 0
  unknown: int = 0
  example: tuple | None = None

  def tokenized(self, number: int, text: str, ids: np.ndarray, unk_id: int | None) -> None:
    """Counts the text ids `ids` that line `number` made of `text`, and its unknown ones."""
    self.tokens += len(ids)
    unknown = 0 if unk_id is None else int(np.count_nonzero(ids == unk_id))
    self.unknown += unknown
    if unknown and self.example is None:
      self.example = number, text[:60]


def prepare_examples(paths: dict, directory: str, tokenizer: Tokenizer, tokenizer_file,
                     seq_len: int, fields: dict, pad_id: int, separator_id: int,
                     template=None, kind: str = "class", max_segments: int | None = None) -> dict:
  """Writes `paths` {'train': …, 'eval': …} as ids and labels into `directory` (see the module
  docstring), under a temporary name renamed at the end; returns its dataset.json. A
  `template` (flax_encoder.tokenizer.Template) lays the texts out in place of the separator.
  `kind`: the labels are classes ("class") or numbers ("number"). `max_segments`: the
  examples (classes) are packed, that many a row at most (`pack`); None: one a row."""
  laid = (*template.start, *template.between, *template.end) if template else (separator_id,)
  check_ids(tokenizer, pad_id, laid)
  classes = None
  if kind == "class":
    classes = {label: i for i, label in enumerate(read_labels(paths["train"], fields["label"]))}
  elif max_segments is not None:
    raise ValueError(f"max_segments: {max_segments}, expected None for {kind!r} labels: only "
                     f"classes are packed")
  dtype = ids_dtype(tokenizer)

  def encode(source, counts):
    for chunk in chunked(_examples(source, fields, classes), CHUNK, lambda e: e[1:3]):
      # One id more than an example holds, so that example_ids knows what it truncates.
      texts = tokenizer.encode_leading([t for _, t, _, _ in chunk], seq_len + 1)
      pairs = tokenizer.encode_leading([p or "" for _, _, p, _ in chunk], seq_len + 1)
      laid = []
      for first, second, (number, text, pair, _) in zip(texts, pairs, chunk):
        second = second if pair is not None else None
        ids, truncated = example_ids(first, second, seq_len, separator_id, template)
        laid.append(ids)
        counts.truncated += truncated
        counts.tokenized(number, text, first, tokenizer.unk_id)
        if pair is not None:
          counts.tokenized(number, pair, second, tokenizer.unk_id)
      counts.examples += len(chunk)
      labels = np.array([c for *_, c in chunk], np.int32 if classes else np.float32)
      if max_segments is not None:
        yield pack(laid, labels, seq_len, max_segments, pad_id, dtype)
        continue
      rows = np.full((len(chunk), seq_len), pad_id, dtype)
      for i, ids in enumerate(laid):
        rows[i, :len(ids)] = ids
      yield {"tokens": rows, "labels": labels}

  packed = {"packed": {"max_segments": max_segments}} if max_segments is not None else {}
  return write_splits(paths, directory, tokenizer, tokenizer_file, encode, "a text and a label", {
      "labels": list(classes) if classes else None, "label_kind": recorded_kind(kind),
      "pad_id": pad_id, "separator_id": separator_id,
      "template": template.to_dict() if template else None, "seq_len": seq_len,
      "dtype": np.dtype(dtype).name, "fields": fields, **packed})


def pack(examples: list[np.ndarray], labels: np.ndarray, seq_len: int, max_segments: int,
         pad_id: int, dtype) -> dict:
  """Examples' ids (each at most `seq_len`) and classes -> rows of `seq_len` ids that hold
  several of them: {'tokens': [rows, seq_len] the examples' ids one after another, then
  `pad_id`; 'segments': [rows, seq_len] 1 … k on the ids of the row's k examples, 0 at
  padding; 'labels': int32 [rows, max_segments] their classes, then -1}.

  First-fit, in the examples' order: each goes into the first row begun so far that has room
  for its ids and fewer than `max_segments` examples, else it begins a row. Of next-fit (only
  the newest row open) it fills the rows better (a short example fills a gap an earlier long
  one left), so fewer rows and less padding are computed; each row still holds its examples
  in their order, and the caller packs a bounded chunk at a time (bounded memory). An example
  of no ids takes a segment with no ids (it pools to 0, as a row of padding does alone)."""
  n = len(examples)
  room, count, rows = np.full(n, seq_len), np.zeros(n, np.int64), 0
  where = np.empty(n, np.int64)
  for i, ids in enumerate(examples):
    fits = (room[:rows] >= len(ids)) & (count[:rows] < max_segments)
    row = int(np.argmax(fits)) if fits.any() else rows
    rows += row == rows
    where[i], room[row], count[row] = row, room[row] - len(ids), count[row] + 1
  tokens = np.full((rows, seq_len), pad_id, dtype)
  segments = np.zeros((rows, seq_len), segments_dtype(max_segments))
  packed_labels = np.full((rows, max_segments), -1, np.int32)
  used, held = np.zeros(rows, np.int64), np.zeros(rows, np.int64)
  for ids, label, row in zip(examples, labels, where):
    at, k = used[row], held[row]
    tokens[row, at:at + len(ids)] = ids
    segments[row, at:at + len(ids)] = k + 1
    packed_labels[row, k] = label
    used[row], held[row] = at + len(ids), k + 1
  return {"tokens": tokens, "segments": segments, "labels": packed_labels}


def segments_dtype(max_segments: int):
  """The smallest unsigned integer dtype that holds segment ids up to `max_segments`."""
  return np.min_scalar_type(max_segments)


def prepare_tagged(paths: dict, directory: str, tokenizer: Tokenizer, tokenizer_file,
                   seq_len: int, fields: dict, pad_id: int, template=None) -> dict:
  """Writes the tagged words of `paths` {'train': …, 'eval': …} into `directory` as
  `prepare_examples` writes texts, each word's tag at its first id (`encode_words`) and -1
  at every other position; returns its dataset.json, which also counts the words left
  untagged (cut off by seq_len, or tokenized to nothing)."""
  check_ids(tokenizer, pad_id, (*template.start, *template.end) if template else ())
  tags = {tag: i for i, tag in enumerate(read_tags(paths["train"], fields))}
  dtype = ids_dtype(tokenizer)
  specials = (len(template.start), len(template.end)) if template else (0, 0)

  def encode(source, counts):
    for chunk in chunked(_tagged(source, fields, tags), CHUNK, lambda e: e[1]):
      rows = np.full((len(chunk), seq_len), pad_id, dtype)
      labels = np.full((len(chunk), seq_len), -1, np.int32)
      laid = encode_words(tokenizer, [words for _, words, _ in chunk], seq_len, template)
      counts.examples += len(chunk)
      for i, ((ids, first), (number, words, indices)) in enumerate(zip(laid, chunk)):
        rows[i, :len(ids)] = ids
        seen = first >= 0
        labels[i, first[seen]] = np.asarray(indices, np.int32)[seen]
        counts.truncated += int(not seen.all())
        counts.untagged += int((~seen).sum())
        text_ids = ids[specials[0]:len(ids) - specials[1]]
        counts.tokenized(number, " ".join(words[:20]), text_ids, tokenizer.unk_id)
      yield {"tokens": rows, "labels": labels}

  return write_splits(paths, directory, tokenizer, tokenizer_file, encode, "words and their tags", {
      "labels": list(tags), "label_kind": "tag", "pad_id": pad_id,
      "template": template.to_dict() if template else None, "seq_len": seq_len,
      "dtype": np.dtype(dtype).name, "fields": fields})


def ids_dtype(tokenizer: Tokenizer):
  return np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32


def check_ids(tokenizer: Tokenizer, pad_id: int, laid: tuple) -> None:
  """RunError where the padding id or one the examples are `laid` out with (the separator, a
  template's special ids) lies past the tokenizer's vocabulary: the model, which has as many
  ids, would train on NaN from its first step."""
  name = tokenizer.spec.path or "the bytes tokenizer"
  bad = next((i for i in laid if i >= tokenizer.vocab_size), None)
  if bad is not None:
    raise RunError(f"{name}: special id {bad} (around or between the texts), expected ids "
                   f"below its vocabulary size {tokenizer.vocab_size}")
  if pad_id >= tokenizer.vocab_size:
    raise RunError(f"{name}: padding id {pad_id}, expected an id below its vocabulary size "
                   f"{tokenizer.vocab_size}")


def _check_unknown(path: str, counts: _Counts, tokenizer: Tokenizer) -> None:
  """RunError where every text id of the file `path` is the tokenizer's unknown token; a
  warning where more than UNKNOWN_WARNING of them are: the model could not tell apart what
  they stand for."""
  if not counts.unknown:
    return
  name = tokenizer.spec.path
  token = tokenizer.piece(tokenizer.unk_id - tokenizer.offset)
  if counts.unknown == counts.tokens:
    raise RunError(f"{path}: every one of its {counts.tokens} tokens is the unknown token "
                   f"{token!r} of the tokenizer {name}, expected texts it can read")
  if counts.unknown > UNKNOWN_WARNING * counts.tokens:
    line, text = counts.example
    print(f"warning: {path}: {counts.unknown / counts.tokens:.0%} of its tokens are the unknown "
          f"token {token!r} of the tokenizer {name} (line {line}: {text!r}…): the model will "
          f"not tell apart what they stand for", file=sys.stderr)


def _tokenized(chunks, tokenizer: Tokenizer, path: str):
  """`chunks`, where the tokenizer failed on a text of `path` a RunError naming both."""
  try:
    yield from chunks
  except tokenizer_lib.TokenizerFailure as e:
    raise RunError(f"{path}: its tokenizer {tokenizer.spec.path}: {e}") from None


def write_splits(paths: dict, directory: str, tokenizer: Tokenizer, tokenizer_file, encode,
           wanted: str, meta: dict) -> dict:
  """Writes each split's chunks, as `encode(source, counts)` yields them ({'tokens': rows of
  ids, 'labels': …, and for packed rows 'segments'}, each into {split}.{name}.bin) and counts
  them (_Counts), its tokenizer's file and dataset.json (`meta` and the counts) into
  `directory`, under a temporary name renamed at the end."""
  counts, inputs = {}, []
  with temporary_directory(directory) as tmp:
    for split, path in paths.items():
      source, counts[split] = sources.Source(path), _Counts()
      with contextlib.ExitStack() as files:
        opened = {}
        for arrays in _tokenized(encode(source, counts[split]), tokenizer, path):
          for name, array in arrays.items():
            if name not in opened:
              opened[name] = files.enter_context(
                  open(os.path.join(tmp, f"{split}.{name}.bin"), "wb"))
            opened[name].write(array.tobytes())
          counts[split].rows += len(arrays["tokens"])
      if not counts[split].examples:
        raise RunError(f"{path}: no examples, expected JSON lines with {wanted}")
      _check_unknown(path, counts[split], tokenizer)
      inputs.append(source.record())
    if tokenizer_file:  # the bytes it was read from, not read again
      with open(os.path.join(tmp, tokenizer_file), "wb") as f:
        f.write(tokenizer.model)
    each = lambda name: {split: getattr(c, name) for split, c in counts.items()}
    meta = {"format": FORMAT, **meta,
            "tokenizer": {"kind": tokenizer.spec.kind, "file": tokenizer_file,
                          "offset": tokenizer.offset},
            "vocab_size": tokenizer.vocab_size, "examples": each("examples"),
            "truncated": each("truncated"),
            **({"untagged": each("untagged")} if meta["label_kind"] == "tag" else {}),
            **({"rows": each("rows")} if meta.get("packed") else {}),
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
  for number, record in records(source):
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


def _tagged(source: sources.Source, fields: dict, tags: dict) -> Iterator[tuple]:
  """(line number, words, tag indices) of each line, checked."""
  for number, words, line_tags in _tagged_lines(source, fields):
    unknown = next((t for t in line_tags if not known(t, tags)), _MISSING)
    if unknown is not _MISSING:
      raise RunError(f"{source.path}:{number}: tag {unknown!r} is not one of the training "
                     f"file's tags {list(tags)[:10]}")
    yield number, words, [tags[t] for t in line_tags]


def load_examples(directory: str) -> dict:
  """{'train': {'tokens', 'labels'}, 'eval': …} memory-mapped, with 'meta' (dataset.json)
  and 'identity' (its SHA-256); packed rows also have 'segment_ids' (see the module
  docstring)."""
  path = os.path.join(directory, "dataset.json")
  with open(path, "rb") as f:
    raw = f.read()
  meta = json.loads(raw)
  if meta.get("format") != FORMAT:
    raise RunError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
  dtype, kind, seq_len = np.dtype(meta["dtype"]), label_kind(meta), meta["seq_len"]
  labels_dtype = np.float32 if kind == "number" else np.int32
  loaded = {"meta": meta, "identity": sha256_bytes(raw)}
  packed = meta.get("packed")
  for split, n in (meta["rows"] if packed else meta["examples"]).items():
    read = lambda name, dtype, shape: np.memmap(os.path.join(directory, f"{split}.{name}.bin"),
                                                dtype, "r", shape=shape)
    tokens = read("tokens", dtype, (n, seq_len))
    if packed:
      segments = packed["max_segments"]
      loaded[split] = {"tokens": tokens,
                       "segment_ids": read("segments", segments_dtype(segments), (n, seq_len)),
                       "labels": read("labels", labels_dtype, (n, segments))}
      continue
    labels = read("labels", labels_dtype, (n, seq_len) if kind == "tag" else (n,))
    loaded[split] = {"tokens": tokens, "labels": labels}
  return loaded


# ---------------------------------------------------------------------------------------------
# The built-in task: which standard-library package a few lines of its source come from.


def write_builtin(directory: str) -> dict:
  """Writes train.jsonl and eval.jsonl of the built-in task into `directory`; returns their
  paths. The examples are a snapshot shipped in train/builtin (train/data/builtin/snapshot.py made
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
