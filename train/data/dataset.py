"""The data a run trains on: the windows of token ids of prepared datasets, each checked
against its dataset.json (the one reader of it), or prepared here once from small files.
`train.data.pipeline` turns them into each process's rows of every batch (masking happens in the
step: train.tasks.masked_lm).

The windows come from a directory `python -m train.prepare` wrote (`config.data.prepared`), or
are prepared at start, as bytes, from small UTF-8 files (`config.data.paths`) or the built-in
corpus, the topics of CPython 3.11's pydoc_data.topics (~460 KB of English documentation,
shipped in train/builtin so that every Python reads the same text), so the default run needs
no data files. Token ids: `train.data.tokens`.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil

import jax
import numpy as np
from jax.experimental import multihost_utils

from train.data import prepare, sources, tokens
from train.data.pipeline import Concatenated, Sources
from train.data.tokens import PROJECT_IDS, SpecialIds, TokenizerSpec
from train.errors import RunError
from train.files import is_temporary, sha256_bytes, sha256_file


@dataclasses.dataclass
class Windows:
  """The training and held-out windows, [n, seq_len] each (memory-mapped when prepared)."""
  train: np.ndarray
  eval: np.ndarray
  vocab_size: int
  source: str  # where they come from, for messages
  tokenizer: TokenizerSpec  # what encoded them (its file in the prepared directory)
  identity: str = ""  # SHA-256 of the dataset.json: changes whenever the data is prepared again
  sources: Sources | None = None  # where several datasets make the training rows
  specials: SpecialIds = PROJECT_IDS  # padding, mask, separator, which ids are text


def windows(config, workdir: str, resuming: bool = False, allow_changes: bool = False) -> Windows:
  """The windows `config.data` names, at `config.train.seq_len`: the prepared directory, or
  config.data.paths (else the built-in corpus) prepared here into `workdir`/data, as bytes.

  A workdir's data is prepared once and kept. When `resuming`, files that changed since then
  are an error unless `allow_changes` (then the data is prepared again).
  """
  seq_len = config.train.seq_len
  if config.data.prepared:
    return load_prepared(config.data.prepared, seq_len, config.data.weights,
                         config.data.max_eval_windows)
  if config.data.weights:
    raise RunError(f"config.data.weights: {config.data.weights!r}, expected it unset: it weighs "
                   f"the entries of config.data.prepared, which is unset")
  paths = list(config.data.paths) or [sources.BUILTIN]
  held_out_every = prepare.held_out_every(config.data.eval_fraction)
  field = "config.data.paths"

  def build(directory):
    try:
      prepare.prepare(paths, directory, "bytes", seq_len=seq_len,
                      eval_fraction=config.data.eval_fraction, workers=1, progress=False)
    except prepare.PrepareError as e:
      raise RunError(f"{field}: {tuple(config.data.paths)}: {e}") from None

  try:
    expanded = prepare.expand(paths)
  except prepare.PrepareError as e:
    raise RunError(f"{field}: {tuple(config.data.paths)}: {e}") from None
  directory = os.path.join(workdir, "data")
  same_request = lambda meta: (meta["seq_len"] == seq_len and meta.get("held_out_every") ==
                               held_out_every and [i["path"] for i in meta["inputs"]] == expanded)
  prepare_once(directory, same_request, build, resuming, allow_changes, field)
  return load_prepared(directory, seq_len)


def prepare_once(directory: str, same_request, build, resuming: bool, allow_changes: bool,
                 field: str) -> None:
  """Leaves `directory` as it is if its dataset.json answers the same request
  (`same_request(meta)`) and every input it records is unchanged; else calls
  `build(directory)` (in process 0; the others wait for it). An input changed since a run that
  is `resuming` was trained on it is a RunError naming `field`, unless `allow_changes`."""
  error = None
  if jax.process_index() == 0:
    try:
      try:  # the workdir's own data, if there is any to keep
        meta = read_meta(directory, expected=None)
      except RunError:
        meta = None
      if meta is not None and same_request(meta):
        changed = next(((i["path"], why) for i in meta["inputs"]
                        if (why := sources.Source(i["path"]).differs_from(i))), None)
        if changed is None:
          meta = "unchanged"
        elif resuming and not allow_changes:
          raise RunError(f"{field}: {changed[0]} changed since this run prepared it into "
                         f"{directory} ({changed[1]}); its checkpoints were trained on the old "
                         f"contents: restore the file, train in a new workdir, or pass "
                         f"--allow_changes to prepare it again and resume")
      if meta != "unchanged":
        shutil.rmtree(directory, ignore_errors=True)
        build(directory)
    except RunError as e:
      error = e
  if jax.process_count() > 1:  # the verdict of process 0, for all
    failed = multihost_utils.process_allgather(np.int32(error is not None)).any()
    if failed and error is None:
      error = RunError("process 0 could not prepare the training data: see its output")
  if error is not None:
    raise error


def dataset_directory(config, workdir: str) -> str:
  """The prepared directory the run in `workdir` trains on (the first, where several)."""
  if config.data.prepared:
    return _prepared_entries(config.data.prepared)[0][1][0]
  return os.path.join(workdir, "data")


def run_tokenizer(config, workdir: str) -> TokenizerSpec:
  """The tokenizer the data of the run in `workdir` was encoded with."""
  directory = dataset_directory(config, workdir)
  meta = read_meta(directory, given=bool(config.data.prepared))
  return tokens.spec_of_dataset(directory, meta)


def read_meta(directory: str, expected: str | None = prepare.FORMAT, given: bool = False) -> dict:
  """The dataset.json of the prepared `directory`, of the format `expected` (None: any);
  RunError naming what is wrong with it: config.data.prepared where it `given` the directory,
  else the file missing from the run's own (WORKDIR/data)."""
  path = os.path.join(directory, "dataset.json")
  if not given and not os.path.isfile(path):
    raise RunError(f"{path}: missing, expected the description of the examples the run "
                   f"prepared into {directory} (written last, when they were complete)")
  if not os.path.isdir(directory):
    raise RunError(f"config.data.prepared: {directory!r}: no such directory, expected one "
                   f"python -m train.prepare wrote")
  if not os.path.isfile(path):
    raise RunError(f"config.data.prepared: {directory!r}, expected a prepared dataset: it "
                   f"holds no dataset.json, which python -m train.prepare writes last (an "
                   f"interrupted prepare leaves {directory.rstrip(os.sep)}.tmp-HOST-PID instead)")
  try:
    with open(path) as f:
      meta = json.load(f)
  except ValueError as e:
    raise RunError(f"{path}: not valid JSON ({e}); prepare the dataset again") from None
  found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
  if not isinstance(meta, dict) or expected is not None and found != expected:
    raise RunError(f"{path}: format {found!r}, expected "
                   f"{repr(expected) if expected else 'a dataset description (a JSON object)'}")
  return meta


def load_prepared(prepared: str, seq_len: int, weights: str | None = None,
                  max_eval: int | None = None) -> Windows:
  """The windows of the directories `python -m train.prepare` completed that `prepared` names
  (config.data.prepared: a directory, or comma-separated directories and globs), memory-mapped
  and checked against their dataset.json; several must share the tokenizer, vocabulary and
  seq_len. `weights` (config.data.weights) weighs the entries; `max_eval` held-out windows at
  most are kept, as many from each directory."""
  entries = _prepared_entries(prepared)
  directories = [d for _, found in entries for d in found]
  loaded = [_load_directory(d, seq_len) for d in directories]
  first = loaded[0]
  identities = [{"vocabulary": w.vocab_size, "tokenizer": _tokenizer_identity(w.tokenizer),
                 "special ids": w.specials} for w in loaded]
  for directory, identity in zip(directories[1:], identities[1:]):
    for what, value in identity.items():
      if value != identities[0][what]:
        raise RunError(f"config.data.prepared: {directory} and {directories[0]} differ in their "
                       f"{what} ({value} and {identities[0][what]}): prepare every part with "
                       f"the same --tokenizer file")
  per_directory = None if max_eval is None else max(1, max_eval // len(loaded))
  if len(loaded) == 1:
    windows = first
    windows.eval = windows.eval[:per_directory]
  else:
    identity = sha256_bytes("".join(w.identity for w in loaded).encode())
    windows = Windows(Concatenated([w.train for w in loaded]),
                      np.concatenate([w.eval[:per_directory] for w in loaded]),
                      first.vocab_size, f"{prepared} ({first.tokenizer.kind})", first.tokenizer,
                      identity, specials=first.specials)
  if len(entries) > 1 or weights:
    sizes = [sum(len(w.train) for w, d in zip(loaded, directories) if d in found)
             for _, found in entries]
    windows.sources = Sources(tuple(name for name, _ in entries),
                              tuple(int(s) for s in np.cumsum([0, *sizes])),
                              _weights(weights, entries))
  return windows


def _prepared_entries(prepared: str) -> list[tuple[str, list[str]]]:
  """(entry, its directories) of each comma-separated entry of config.data.prepared: a
  directory, or a glob of them (directories an interrupted prepare left, *.tmp-HOST-PID, left
  out)."""
  entries = []
  for entry in (e.strip() for e in prepared.split(",")):
    if not entry:
      raise RunError(f"config.data.prepared: {prepared!r} has an empty entry, expected "
                     f"comma-separated directories or globs")
    if glob.has_magic(entry):
      found = sorted(d for d in glob.glob(entry)
                     if os.path.isdir(d) and not is_temporary(d))
      if not found:
        raise RunError(f"config.data.prepared: {entry!r} matches no directory")
    else:
      found = [entry]
    entries.append((entry, found))
  directories = [d for _, found in entries for d in found]
  twice = next((d for d in directories if directories.count(d) > 1), None)
  if twice:
    raise RunError(f"config.data.prepared: {prepared!r} names {twice} twice")
  return entries


def _weights(weights: str | None, entries: list) -> tuple[float, ...] | None:
  if not weights:
    return None
  try:
    values = tuple(float(w) for w in weights.split(","))
  except ValueError:
    values = ()
  if len(values) != len(entries) or not all(np.isfinite(v) and v > 0 for v in values):
    raise RunError(f"config.data.weights: {weights!r}, expected {len(entries)} positive "
                   f"comma-separated numbers, one per entry of config.data.prepared "
                   f"({', '.join(e for e, _ in entries)})")
  return values


def _tokenizer_identity(spec: TokenizerSpec) -> str:
  """The tokenizer's kind and its file's SHA-256: equal for the same tokenizer."""
  if spec.path is None:
    return spec.kind
  return f"{spec.kind} {sha256_file(spec.path)[:16]}"


def _load_directory(directory: str, seq_len: int) -> Windows:
  """The windows of one prepared directory, memory-mapped, their sizes and ids checked
  against its dataset.json."""
  meta = read_meta(directory, given=True)
  if meta["seq_len"] != seq_len:
    raise RunError(f"config.train.seq_len: {seq_len}, expected the windows' length "
                   f"{meta['seq_len']} ({directory} was prepared with --seq-len "
                   f"{meta['seq_len']})")
  dtype = np.dtype(meta["dtype"])
  arrays = {}
  for name in ("train", "eval"):
    file = os.path.join(directory, f"{name}.bin")
    rows = meta["windows"][name]
    size = os.path.getsize(file) if os.path.exists(file) else None
    if size != rows * seq_len * dtype.itemsize:
      raise RunError(f"{file}: {size} bytes, expected {rows} windows of {seq_len} "
                     f"{dtype.name} ids as dataset.json records: truncated, or not this "
                     f"dataset's")
    arrays[name] = np.memmap(file, dtype, "r", shape=(rows, seq_len))
    check_ids(file, arrays[name], meta["vocab_size"])
  spec = tokens.spec_of_dataset(directory, meta)
  identity = sha256_file(os.path.join(directory, "dataset.json"))
  return Windows(arrays["train"], arrays["eval"], meta["vocab_size"],
                 f"{directory} ({spec.kind})", spec, identity,
                 specials=tokens.SpecialIds.of_meta(meta))


_CHECK_BYTES = 64 << 20  # read at a time by check_ids


def check_ids(file: str, ids: np.ndarray, vocab_size: int) -> None:
  """Raises RunError at the first id of `ids` [n, seq_len] outside [0, vocab_size): one pass
  over the file, `_CHECK_BYTES` at a time."""
  rows = max(1, _CHECK_BYTES // max(1, ids[:1].nbytes))
  for start in range(0, len(ids), rows):
    chunk = np.asarray(ids[start:start + rows])
    if chunk.size and chunk.max() >= vocab_size:
      row, position = (int(i) for i in np.argwhere(chunk >= vocab_size)[0])
      raise RunError(f"{file}: id {int(chunk[row, position])} at window {start + row}, "
                     f"position {position}, outside the vocabulary of {vocab_size} that "
                     f"dataset.json records: the file is corrupt or not this dataset's; "
                     f"prepare it again")


def most_frequent_token(examples: np.ndarray, sample: int = 100_000,
                        specials: SpecialIds = PROJECT_IDS) -> int:
  """The commonest token (text, not a special id) in the first `sample` windows: the guess of
  the baseline that always guesses one token."""
  head = np.asarray(examples[:sample])
  return int(np.argmax(np.bincount(head[specials.is_text(head)].astype(np.int64))))


