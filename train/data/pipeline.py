"""The input pipeline: grain hands each process its own rows of every global batch, read
from memory-mapped arrays (in worker processes, if asked), exactly resumable from the count of
batches a checkpoint records; and the rows onto the devices.
"""

from __future__ import annotations

import dataclasses
import mmap

import grain
import jax
import numpy as np

from flax_encoder.sharding import batch_sharding
from train.errors import RunError


@dataclasses.dataclass(frozen=True)
class Sources:
  """The training rows of several prepared datasets, one after the other: the entries of
  config.data.prepared (a glob entry is one source), the first row of each (and the total),
  and the weights batches draw them with (None: uniformly over all rows)."""
  names: tuple[str, ...]
  starts: tuple[int, ...]
  weights: tuple[float, ...] | None = None


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
  dict of arrays with one leading axis (one fancy index each), packed by `pack` where given;
  with `starts` (Sources.starts), also how many rows of the whole batch each source gave."""

  def __init__(self, source, rows: slice, starts: tuple[int, ...] | None = None, pack=None):
    self.source, self.rows, self.starts, self.pack = source, rows, starts, pack

  def map(self, indices):
    indices = np.asarray(indices)
    at = indices[self.rows]
    rows = jax.tree.map(lambda x: np.asarray(x[at]), self.source)
    if self.pack is not None:
      rows = self.pack(indices, rows, self.rows.indices(len(indices))[0])
    if self.starts is None:
      return rows
    of = np.searchsorted(self.starts, indices, side="right") - 1
    return rows, np.bincount(of, minlength=len(self.starts) - 1)

  def __getstate__(self):
    return {"source": jax.tree.map(_MappedFile.of, self.source), "rows": self.rows,
            "starts": self.starts, "pack": self.pack}

  def __setstate__(self, state):
    self.rows, self.starts, self.pack = state["rows"], state["starts"], state["pack"]
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

  With `pack` (train.tasks.packed_pairs.PairPacker), each batch is its packing of the rows:
  pack(the global batch's row indices, this process's rows, its first row in the batch).
  """

  def __init__(self, source, batch_size: int, seed: int, workers: int = 0,
               rows: slice | None = None, sources: Sources | None = None, pack=None):
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
    self._indices = indices.batch(batch_size, drop_remainder=True)
    self._dataset = self._indices.map(_ReadRows(source, rows, sources and sources.starts, pack))
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

  def batch_indices(self, position: int) -> np.ndarray:
    """The row indices of global batch `position` (counting from 0)."""
    return np.asarray(self._indices[position])

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
                     f"was written by another version of train.data.pipeline; train in a new "
                     f"workdir")
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


def to_devices(rows, mesh: jax.sharding.Mesh):
  """This process's rows of a global batch (an array, or a dict of them) -> global jax.Arrays
  split along the batch over `mesh`'s devices."""
  sharding = batch_sharding(mesh)
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), rows)
