"""Training data: the windows of token ids and the grain pipeline that hands each process its
rows of every batch (masking happens in the step: train.masked_lm).

The windows come from a directory `python -m train.prepare` wrote (`config.data.prepared`), or
are prepared at start, as bytes, from small UTF-8 files (`config.data.paths`) or the built-in
corpus, the standard library's pydoc_data.topics (~460 KB of English documentation that ships
with every CPython), so the default run needs no data files. Token ids: `train.tokens`.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import mmap
import os
import re
import shutil

import grain
import jax
import numpy as np
from jax.experimental import multihost_utils

from flax_encoder.sharding import batch_sharding
from train import prepare, tokens
from train.errors import RunError
from train.tokens import FIRST_TOKEN_ID, TokenizerSpec


@dataclasses.dataclass(frozen=True)
class Sources:
  """The training rows of several prepared datasets, one after the other: the entries of
  config.data.prepared (a glob entry is one source), the first row of each (and the total),
  and the weights batches draw them with (None: uniformly over all rows)."""
  names: tuple[str, ...]
  starts: tuple[int, ...]
  weights: tuple[float, ...] | None = None


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
  paths = list(config.data.paths) or [prepare.BUILTIN]
  held_out_every = round(1 / config.data.eval_fraction)
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
      meta = _existing_dataset(directory)
      if meta is not None and same_request(meta):
        changed = next(((i["path"], why) for i in meta["inputs"]
                        if (why := prepare.Source(i["path"]).differs_from(i))), None)
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


def _existing_dataset(directory: str) -> dict | None:
  """The dataset.json of the workdir's own data, or None where there is none to keep."""
  try:
    with open(os.path.join(directory, "dataset.json")) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def dataset_directory(config, workdir: str) -> str:
  """The prepared directory the run in `workdir` trains on (the first, where several)."""
  if config.data.prepared:
    return _prepared_entries(config.data.prepared)[0][1][0]
  return os.path.join(workdir, "data")


def run_tokenizer(config, workdir: str) -> TokenizerSpec:
  """The tokenizer the data of the run in `workdir` was encoded with."""
  directory = dataset_directory(config, workdir)
  return tokens.spec_of_dataset(directory, _read_dataset_json(directory))


def _read_dataset_json(directory: str) -> dict:
  path = os.path.join(directory, "dataset.json")
  if not os.path.isfile(path):
    raise RunError(f"config.data.prepared: {directory!r}, expected a prepared dataset: it "
                   f"holds no dataset.json, which python -m train.prepare writes last (an "
                   f"interrupted prepare leaves {directory.rstrip(os.sep)}.tmp-PID instead)")
  try:
    with open(path) as f:
      meta = json.load(f)
  except ValueError as e:
    raise RunError(f"{path}: not valid JSON ({e}); prepare the dataset again") from None
  if not isinstance(meta, dict) or meta.get("format") != prepare.FORMAT:
    found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
    raise RunError(f"{path}: format {found!r}, expected {prepare.FORMAT!r}")
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
  identities = [{"vocabulary": w.vocab_size, "tokenizer": _tokenizer_identity(w.tokenizer)}
                for w in loaded]
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
    identity = hashlib.sha256("".join(w.identity for w in loaded).encode()).hexdigest()
    windows = Windows(Concatenated([w.train for w in loaded]),
                      np.concatenate([w.eval[:per_directory] for w in loaded]),
                      first.vocab_size, f"{prepared} ({first.tokenizer.kind})", first.tokenizer,
                      identity)
  if len(entries) > 1 or weights:
    sizes = [sum(len(w.train) for w, d in zip(loaded, directories) if d in found)
             for _, found in entries]
    windows.sources = Sources(tuple(name for name, _ in entries),
                              tuple(int(s) for s in np.cumsum([0, *sizes])),
                              _weights(weights, entries))
  return windows


def _prepared_entries(prepared: str) -> list[tuple[str, list[str]]]:
  """(entry, its directories) of each comma-separated entry of config.data.prepared: a
  directory, or a glob of them (directories an interrupted prepare left, *.tmp-PID, left out)."""
  entries = []
  for entry in (e.strip() for e in prepared.split(",")):
    if not entry:
      raise RunError(f"config.data.prepared: {prepared!r} has an empty entry, expected "
                     f"comma-separated directories or globs")
    if glob.has_magic(entry):
      found = sorted(d for d in glob.glob(entry)
                     if os.path.isdir(d) and not re.search(r"\.tmp-\d+$", d))
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
  with open(spec.path, "rb") as f:
    return f"{spec.kind} {hashlib.sha256(f.read()).hexdigest()[:16]}"


def _load_directory(directory: str, seq_len: int) -> Windows:
  """The windows of one prepared directory, memory-mapped, their sizes and ids checked
  against its dataset.json."""
  meta = _read_dataset_json(directory)
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
  with open(os.path.join(directory, "dataset.json"), "rb") as f:
    identity = hashlib.sha256(f.read()).hexdigest()
  return Windows(arrays["train"], arrays["eval"], meta["vocab_size"],
                 f"{directory} ({spec.kind})", spec, identity)


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


class Concatenated:
  """The rows of several arrays (memory maps) as one array [n, ...], read by index or slice
  without copying them together."""

  def __init__(self, parts: list):
    self.parts = list(parts)
    self.starts = np.cumsum([0, *(len(p) for p in self.parts)])
    self.shape = (int(self.starts[-1]), *self.parts[0].shape[1:])
    self.dtype = np.result_type(*(p.dtype for p in self.parts))

  def __len__(self) -> int:
    return self.shape[0]

  def __getitem__(self, index) -> np.ndarray:
    if isinstance(index, slice):
      index = np.arange(*index.indices(len(self)))
    index = np.asarray(index)
    part = np.searchsorted(self.starts, index, side="right") - 1
    out = np.empty((*index.shape, *self.shape[1:]), self.dtype)
    for i in np.unique(part):
      at = part == i
      out[at] = self.parts[i][index[at] - self.starts[i]]
    return out

  def __array__(self, dtype=None, copy=None):
    return np.asarray(self[:], dtype)

  def __getstate__(self):
    return {"parts": [_MappedFile.of(p) for p in self.parts]}

  def __setstate__(self, state):
    self.__init__([p.open() if isinstance(p, _MappedFile) else p for p in state["parts"]])


@dataclasses.dataclass(frozen=True)
class _MappedFile:
  """How a memory-mapped array travels to a grain worker process: its file, not its bytes."""
  file: str
  dtype: str
  shape: tuple
  offset: int

  @staticmethod
  def of(x):
    if isinstance(x, np.memmap) and isinstance(x.base, mmap.mmap):  # a whole file's map
      return _MappedFile(x.filename, x.dtype.str, x.shape, x.offset)
    return x if isinstance(x, Concatenated) else np.asarray(x)

  def open(self) -> np.memmap:
    return np.memmap(self.file, self.dtype, "r", self.offset, self.shape)


class _ReadRows(grain.transforms.Map):
  """A batch of row indices -> this process's rows of those rows of `source`, an array or a
  dict of arrays with one leading axis (one fancy index each); with `starts` (Sources.starts),
  also how many rows of the whole batch each source gave."""

  def __init__(self, source, rows: slice, starts: tuple[int, ...] | None = None):
    self.source, self.rows, self.starts = source, rows, starts

  def map(self, indices):
    indices = np.asarray(indices)
    at = indices[self.rows]
    rows = jax.tree.map(lambda x: np.asarray(x[at]), self.source)
    if self.starts is None:
      return rows
    of = np.searchsorted(self.starts, indices, side="right") - 1
    return rows, np.bincount(of, minlength=len(self.starts) - 1)

  def __getstate__(self):
    return {"source": jax.tree.map(_MappedFile.of, self.source), "rows": self.rows,
            "starts": self.starts}

  def __setstate__(self, state):
    self.rows, self.starts = state["rows"], state["starts"]
    self.source = jax.tree.map(lambda x: x.open() if isinstance(x, _MappedFile) else x,
                               state["source"])


def process_rows(batch_size: int) -> slice:
  """This process's contiguous share of a global batch's rows (what its devices hold)."""
  n, i = jax.process_count(), jax.process_index()
  return slice(i * batch_size // n, (i + 1) * batch_size // n)


class TrainBatches:
  """An endless, deterministic iterator of this process's rows of the training batches.

  `source` is an array of rows (windows of ids) or a dict of arrays with one leading axis
  (examples: ids and labels); a batch is of the same kind. Global batch k holds rows
  k * batch_size ... (k + 1) * batch_size - 1 of an order that grain reshuffles every epoch;
  each process reads only its own rows of it (`process_rows`), with `workers` grain worker
  processes (0: threads of this process). The state is the number of batches delivered, so a
  run resumes exactly with any count of processes or workers.

  With `sources` (the rows of several datasets), `shares()` tells how many of the rows
  delivered came from each; with their weights, each source is reshuffled every epoch of its
  own and grain's mixing draws from them in those proportions.
  """

  def __init__(self, source, batch_size: int, seed: int, workers: int = 0,
               rows: slice | None = None, sources: Sources | None = None):
    count = len(jax.tree.leaves(source)[0])
    if count < batch_size:
      raise RunError(f"config.train.batch_size: {batch_size}, expected at most the "
                     f"{count} training rows")
    if workers < 0:
      raise RunError(f"config.data.workers: {workers}, expected an integer >= 0")
    self.workers, self.sources = workers, sources
    self._counts = None if sources is None else np.zeros(len(sources.names), np.int64)
    rows = process_rows(batch_size) if rows is None else rows
    if sources is not None and sources.weights:
      indices = grain.MapDataset.mix(
          [grain.MapDataset.range(start, stop).shuffle(seed=_seed(seed, i)).repeat()
           for i, (start, stop) in enumerate(zip(sources.starts, sources.starts[1:]))],
          sources.weights)
    else:
      indices = grain.MapDataset.range(count).shuffle(seed=seed).repeat()
    self._dataset = (indices
                     .batch(batch_size, drop_remainder=True)
                     .map(_ReadRows(source, rows, sources and sources.starts)))
    self._iterator = None
    self._start(0)

  def _start(self, position: int) -> None:
    self.close()
    self.position = position
    dataset = self._dataset[position:].to_iter_dataset(
        grain.ReadOptions(num_threads=1, prefetch_buffer_size=8))
    if self.workers:
      dataset = dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=self.workers))
    self._iterator = iter(dataset)

  def __iter__(self):
    return self

  def __next__(self) -> np.ndarray:
    if self._iterator is None:
      raise ValueError("TrainBatches: next() after close()")
    # A worker's batch arrives in shared memory; a copy leaves its release to grain.
    batch = jax.tree.map(np.array, next(self._iterator))
    if self._counts is not None:
      batch, counts = batch
      self._counts += counts
    self.position += 1
    return batch

  def shares(self) -> dict[str, float]:
    """The fraction of the rows delivered since the last call that each source gave, by its
    name ({} with one source)."""
    if self._counts is None or not self._counts.sum():
      return {}
    shares = self._counts / self._counts.sum()
    self._counts[:] = 0
    return {f"share {name}": float(s) for name, s in zip(self.sources.names, shares)}

  def get_state(self) -> dict:
    return {"batches": self.position}

  def set_state(self, state: dict) -> None:
    if set(state) != {"batches"}:
      raise RunError(f"the checkpoint's data position {state} is not a count of batches: it "
                       f"was written by another version of train.data; train in a new workdir")
    self._start(state["batches"])

  def close(self) -> None:
    """Stops the worker processes and prefetching threads (now, not at interpreter exit)."""
    if self._iterator is not None:
      self._iterator.close()
      self._iterator = None


def _seed(seed: int, source: int) -> int:
  """A shuffle seed of each source of its own, from the run's."""
  return int(np.random.SeedSequence([seed, source]).generate_state(1)[0])


def eval_batches(rows, batch_size: int, fill=0) -> list:
  """This process's rows of the held-out rows (an array, or a dict of arrays) in equal-sized
  batches; the last batch is filled up with rows of `fill` (a value, or a dict of values:
  padding, that no metric counts), so every batch has one shape."""
  count = len(jax.tree.leaves(rows)[0])
  extra = -count % batch_size
  fills = fill if isinstance(fill, dict) else jax.tree.map(lambda _: fill, rows)
  padded = jax.tree.map(lambda x, f: np.concatenate(
      [np.asarray(x), np.full((extra, *x.shape[1:]), f, x.dtype)]), rows, fills)
  mine = process_rows(batch_size)
  return [jax.tree.map(lambda x: x[i:i + batch_size][mine], padded)
          for i in range(0, count + extra, batch_size)]


def most_frequent_token(examples: np.ndarray, sample: int = 100_000) -> int:
  """The commonest token (not a special id) in the first `sample` windows: the guess of the
  baseline that always guesses one token."""
  head = np.asarray(examples[:sample])
  return int(np.argmax(np.bincount(head[head >= FIRST_TOKEN_ID].astype(np.int64))))


def to_devices(rows, mesh: jax.sharding.Mesh):
  """This process's rows of a global batch (an array, or a dict of them) -> global jax.Arrays
  split along the batch over `mesh`'s devices."""
  sharding = batch_sharding(mesh)
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), rows)
