"""A batch of pairs packed for the contrastive step: the texts of each device's pairs laid
one after another in rows of seq_len ids, as train.embed packs a corpus.

The batch's B pairs are split over its `shards` (the devices the batch is split over), B /
shards each. A shard's texts (anchors, positives and hard negatives) are packed first-fit,
longest first, into `rows` rows of its own, at most `segments_per_row(seq_len)` texts a row;
every shard has the same count of rows, the smallest of a few fixed counts (`row_counts`)
that holds the fullest shard's texts, so that the step compiles for a few shapes only. Each
text's embedding is then found at its slot, row * segments + its segment - 1, of the flat
[all rows * segments] embeddings the step pools.

The count of rows depends only on the lengths of the batch's texts, which every process
knows (`text_lengths`, read once from the prepared rows), so processes that each pack only
their own shards agree on it, and a resumed run packs each batch as before.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from flax_encoder.embeddings import PackedRows, assign_rows, fill_rows, segments_per_row

TEXTS = ("anchor", "positive", "negative")
SHRINK = 0.9  # each row count of `row_counts` is at most this fraction of the next
_CHUNK_ROWS = 1 << 16  # prepared rows measured at a time


def text_lengths(rows: dict, pad_id: int) -> dict[str, np.ndarray]:
  """{text: int32 [n]}: the ids of each prepared text of `rows` ({'anchor': [n, seq_len], …})
  up to its last non-padding one (0: a line without a hard negative)."""
  lengths = {}
  for name in TEXTS:
    if name not in rows:
      continue
    ids = rows[name]
    out = np.zeros(len(ids), np.int32)
    for start in range(0, len(ids), _CHUNK_ROWS):
      real = np.asarray(ids[start:start + _CHUNK_ROWS]) != pad_id
      last = real.shape[1] - np.argmax(real[:, ::-1], axis=1)
      out[start:start + len(real)] = np.where(real.any(axis=1), last, 0)
    lengths[name] = out
  return lengths


def row_counts(most: int, multiple: int) -> list[int]:
  """The counts of rows a shard may have, ascending: `most` (rounded up to a multiple of
  `multiple`), then each about SHRINK times the next, each a multiple of `multiple`."""
  counts, n = [], -(-most // multiple) * multiple
  while n >= multiple and (not counts or n < counts[-1]):
    counts.append(n)
    n = int(np.ceil(n * SHRINK / multiple)) * multiple
    if n == counts[-1]:
      n -= multiple
  return counts[::-1]


@dataclasses.dataclass(frozen=True)
class PairPacker:
  """Packs batches of pairs (module docstring). `lengths`: `text_lengths` of the training
  rows; `batch_size`: pairs in a global batch, split over `shards`; `multiple`: each shard's
  rows are a multiple of it (GradCache's chunks, which take rows c, c + k, … of a shard)."""

  lengths: dict
  seq_len: int
  pad_id: int
  batch_size: int
  shards: int
  multiple: int = 1
  teacher: bool = False  # each pair's teacher scores ([batch, 2] float32) go with it

  @property
  def segments(self) -> int:
    return segments_per_row(self.seq_len)

  @property
  def counts(self) -> list[int]:
    texts = len(self.lengths) * self.batch_size // self.shards  # one text a row at most
    return row_counts(texts, self.multiple)

  def _plan(self, indices: np.ndarray, shard: int) -> tuple[list, np.ndarray, int]:
    """Shard `shard`'s texts, (name, its pair in the shard, its length): anchors, positives,
    then the negatives that lines have; each one's row (first-fit); the rows they fill."""
    per = self.batch_size // self.shards
    mine = indices[shard * per:(shard + 1) * per]
    texts = [(name, j, int(n)) for name in TEXTS if name in self.lengths
             for j, n in enumerate(self.lengths[name][mine]) if n]
    row_of, kinds = assign_rows([n for *_, n in texts], [self.seq_len], [self.segments])
    return texts, row_of, len(kinds)

  def _count(self, plans: list) -> int:
    """The rows every shard has: the fewest of `counts` that hold the fullest shard's."""
    need = max(used for *_, used in plans)
    return next(n for n in self.counts if n >= need)

  def rows(self, indices) -> int:
    """The rows each shard has in the batch of global pair indices `indices`."""
    indices = np.asarray(indices)
    return self._count([self._plan(indices, s) for s in range(self.shards)])

  def spec(self, rows: int) -> dict:
    """The global shapes and dtypes of a packed batch whose shards have `rows` rows each."""
    total = (self.shards * rows, self.seq_len)
    spec = {name: jax.ShapeDtypeStruct(total, np.int32)
            for name in ("tokens", "segment_ids", "positions")}
    for name in self.lengths:
      spec[f"{name}_slot"] = jax.ShapeDtypeStruct((self.batch_size,), np.int32)
    if "negative" in self.lengths:
      spec["has_negative"] = jax.ShapeDtypeStruct((self.batch_size,), np.uint8)
    if self.teacher:
      spec["teacher"] = jax.ShapeDtypeStruct((self.batch_size, 2), np.float32)
    return spec

  def __call__(self, indices, rows: dict, first_pair: int) -> dict:
    """This process's part of the packed batch: `rows` are its pairs' ids ({'anchor': [b,
    seq_len], …}), pairs first_pair … first_pair + b - 1 of the batch of global indices
    `indices`; its shards' rows, and each of its pairs' slots in the global batch."""
    indices = np.asarray(indices)
    plans = [self._plan(indices, s) for s in range(self.shards)]  # every process's: the count
    count = self._count(plans)
    per = self.batch_size // self.shards
    local = len(rows["anchor"])
    if first_pair % per or local % per:
      raise ValueError(f"pairs {first_pair} … {first_pair + local - 1}: not whole shards of "
                       f"{per} pairs")
    names = [name for name in TEXTS if name in self.lengths]
    parts, slots = [], {name: np.zeros(local, np.int32) for name in names}
    for i in range(local // per):
      shard = first_pair // per + i
      texts, row_of, used = plans[shard]
      ids = [np.asarray(rows[name][i * per + j][:n]) for name, j, n in texts]
      packed = _fill(ids, row_of, used, self.seq_len, self.pad_id)
      extra = count - used
      pad = lambda x, fill: np.concatenate([x, np.full((extra, self.seq_len), fill, x.dtype)])
      parts.append((pad(packed.tokens, self.pad_id), pad(packed.segment_ids, 0),
                    pad(packed.positions, 0)))
      first_slot = shard * count * self.segments
      for (name, j, _), (row, segment) in zip(texts, packed.where):
        slots[name][i * per + j] = first_slot + row * self.segments + segment
    out = {key: np.concatenate([p[k] for p in parts])
           for k, key in enumerate(("tokens", "segment_ids", "positions"))}
    out.update({f"{name}_slot": slots[name] for name in names})
    if "has_negative" in rows:
      out["has_negative"] = np.asarray(rows["has_negative"], np.uint8)
    if self.teacher:
      out["teacher"] = np.asarray(rows["teacher"], np.float32)
    return out


def pack_held_out(rows: dict, pad_id: int, seq_len: int) -> dict:
  """The held-out pairs `rows` ({'anchor': [n, seq_len], 'positive': …}) packed once, first-fit:
  'tokens', 'segment_ids', 'positions' [r, seq_len] and 'target' [r, segments], the text at
  each row's segment (anchor i: i, positive i: n + i; -1: none)."""
  lengths = text_lengths(rows, pad_id)
  ids = [np.asarray(row[:n]) for name in ("anchor", "positive")
         for row, n in zip(rows[name], lengths[name])]
  segments = segments_per_row(seq_len)
  row_of, kinds = assign_rows([len(x) for x in ids], [seq_len], [segments])
  packed = _fill(ids, row_of, len(kinds), seq_len, pad_id)
  target = np.full((len(kinds), segments), -1, np.int32)
  target[packed.where[:, 0], packed.where[:, 1]] = np.arange(len(ids))
  return {"tokens": packed.tokens, "segment_ids": packed.segment_ids,
          "positions": packed.positions, "target": target}


def _fill(ids: list, row_of: np.ndarray, used: int, seq_len: int, pad_id: int) -> PackedRows:
  """`ids` laid into the `used` rows `row_of` assigns (flax_encoder.embeddings.fill_rows): a pad
  id within a text (a literal "<pad>") is the text's, as the unpacked encoder takes it."""
  return fill_rows(ids, range(len(ids)), row_of, range(used), seq_len, pad_id)
