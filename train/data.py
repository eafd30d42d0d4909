"""Masked-token data: the training windows, the byte tokenizer and the grain pipelines.

The windows come from a directory `python -m train.prepare` wrote (`config.data.prepared`), or
are prepared at start, as bytes, from small UTF-8 files (`config.data.paths`) or the built-in
corpus, the standard library's pydoc_data.topics (~460 KB of English documentation that ships
with every CPython), so the default run needs no data files. Token ids: 0 = pad, 1 = mask,
2 = the separator between documents, 3 unused, then the tokenizer's ids + 4 (4 + b for byte b).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import grain
import jax
import numpy as np
from jax.experimental import multihost_utils

from flax_encoder.sharding import batch_sharding
from train import prepare

PAD_ID, MASK_ID = prepare.PAD_ID, prepare.MASK_ID
NUM_SPECIAL = prepare.FIRST_TOKEN_ID  # ids below it are never targets
VOCAB_SIZE = 256 + NUM_SPECIAL  # of the byte tokenizer


@dataclasses.dataclass
class Windows:
  """The training and held-out windows, [n, seq_len] each (memory-mapped when prepared)."""
  train: np.ndarray
  eval: np.ndarray
  vocab_size: int
  source: str  # where they come from, for messages
  tokenizer: str = "bytes"  # the kind train.prepare records: bytes, sentencepiece, huggingface


def windows(config, workdir: str) -> Windows:
  """The windows `config.data` names, at `config.train.seq_len`: the prepared directory, or
  config.data.paths (else the built-in corpus) prepared here into `workdir`/data, bytes."""
  seq_len = config.train.seq_len
  if config.data.prepared:
    return load_prepared(config.data.prepared, seq_len)
  directory = os.path.join(workdir, "data")
  if jax.process_index() == 0:  # the same bytes every time, so a resumed run reads the same
    shutil.rmtree(directory, ignore_errors=True)
    try:
      prepare.prepare(list(config.data.paths) or [prepare.BUILTIN], directory, "bytes",
                      seq_len=seq_len, eval_fraction=config.data.eval_fraction, workers=1,
                      progress=False)
    except prepare.PrepareError as e:
      raise ValueError(f"config.data.paths={tuple(config.data.paths)}: {e}") from None
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("training data prepared")
  return load_prepared(directory, seq_len)


def load_prepared(directory: str, seq_len: int) -> Windows:
  """The windows of a directory `python -m train.prepare` completed, memory-mapped."""
  path = os.path.join(directory, "dataset.json")
  if not os.path.isfile(path):
    raise ValueError(f"config.data.prepared={directory!r} is not a prepared dataset: it holds "
                     f"no dataset.json, which python -m train.prepare writes last (an "
                     f"interrupted prepare leaves {directory.rstrip(os.sep)}.tmp-PID instead)")
  with open(path) as f:
    meta = json.load(f)
  if meta.get("format") != prepare.FORMAT:
    raise ValueError(f"{path}: format {meta.get('format')!r}, expected {prepare.FORMAT!r}")
  if meta["seq_len"] != seq_len:
    raise ValueError(f"config.train.seq_len={seq_len} differs from the windows of "
                     f"{directory!r}, prepared with --seq-len {meta['seq_len']}")
  dtype = np.dtype(meta["dtype"])
  arrays = {}
  for name in ("train", "eval"):
    file = os.path.join(directory, f"{name}.bin")
    rows = meta["windows"][name]
    size = os.path.getsize(file) if os.path.exists(file) else None
    if size != rows * seq_len * dtype.itemsize:
      raise ValueError(f"{file} holds {size} bytes, but dataset.json records {rows} windows "
                       f"of {seq_len} {dtype.name} ids: truncated, or not this dataset's")
    arrays[name] = np.memmap(file, dtype, "r", shape=(rows, seq_len))
  kind = meta["tokenizer"]["kind"]
  return Windows(arrays["train"], arrays["eval"], meta["vocab_size"], f"{directory} ({kind})",
                 kind)


def encode(text: str) -> np.ndarray:
  """UTF-8 bytes of `text` as token ids (int32)."""
  return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32) + NUM_SPECIAL


def decode(ids) -> str:
  data = bytes(int(i) - NUM_SPECIAL for i in np.asarray(ids).ravel() if i >= NUM_SPECIAL)
  return data.decode("utf-8", errors="replace")


def mask_tokens(tokens: np.ndarray, mask_rate: float, rng: np.random.Generator,
                vocab_size: int = VOCAB_SIZE) -> dict:
  """BERT-style corruption of `mask_rate` of the positions that hold a token (not padding, not
  a separator).

  Of the chosen positions 80% become MASK_ID, 10% a random token, 10% stay unchanged.

  Returns:
    {'inputs': corrupted ids, 'targets': original ids, 'weights': 1.0 at chosen positions}.
  """
  tokens = np.asarray(tokens, np.int32)
  real = tokens >= NUM_SPECIAL
  chosen = real & (rng.random(tokens.shape) < mask_rate)
  action = rng.random(tokens.shape)
  inputs = np.where(chosen & (action < 0.8), MASK_ID, tokens)
  random_tokens = rng.integers(NUM_SPECIAL, vocab_size, size=tokens.shape)
  inputs = np.where(chosen & (action >= 0.8) & (action < 0.9), random_tokens, inputs)
  return {"inputs": inputs.astype(np.int32), "targets": tokens.astype(np.int32),
          "weights": chosen.astype(np.float32)}


@dataclasses.dataclass
class MaskTokens(grain.transforms.RandomMap):
  mask_rate: float
  vocab_size: int

  def random_map(self, element, rng: np.random.Generator):
    return mask_tokens(element, self.mask_rate, rng, self.vocab_size)


def train_batches(examples: np.ndarray, batch_size: int, mask_rate: float, seed: int,
                  vocab_size: int = VOCAB_SIZE) -> grain.DatasetIterator:
  """An endless, deterministic iterator of masked batches; its state is checkpointable."""
  if len(examples) < batch_size:
    raise ValueError(f"config.train.batch_size={batch_size} exceeds the {len(examples)} "
                     f"training examples")
  dataset = (grain.MapDataset.source(examples)
             .shuffle(seed=seed)
             .repeat()
             .random_map(MaskTokens(mask_rate, vocab_size), seed=seed + 1)
             .batch(batch_size, drop_remainder=True))
  return iter(dataset.to_iter_dataset())


def eval_batches(examples: np.ndarray, batch_size: int, mask_rate: float, seed: int,
                 vocab_size: int = VOCAB_SIZE) -> list[dict]:
  """The held-out split, masked once with a fixed seed, in equal-sized batches.

  The last batch is filled up with all-pad rows of weight 0, so every batch has one shape.
  """
  masked = mask_tokens(examples, mask_rate, np.random.default_rng(seed), vocab_size)
  n = len(examples)
  fill = -n % batch_size
  padded = {k: np.concatenate([v, np.zeros((fill,) + v.shape[1:], v.dtype)])
            for k, v in masked.items()}
  return [{k: v[i:i + batch_size] for k, v in padded.items()}
          for i in range(0, n + fill, batch_size)]


def most_frequent_token(examples: np.ndarray, sample: int = 100_000) -> int:
  """The commonest token (not a special id) in the first `sample` windows: the guess of the
  baseline that always guesses one token."""
  head = np.asarray(examples[:sample])
  return int(np.argmax(np.bincount(head[head >= NUM_SPECIAL].astype(np.int64))))


def to_devices(batch: dict, mesh: jax.sharding.Mesh) -> dict:
  """A host batch -> global jax.Arrays split along the batch over `mesh`'s devices.

  Every process loads the same batch and contributes its own contiguous share of the rows.
  """
  n, count = jax.process_count(), len(batch["inputs"])
  rows = slice(jax.process_index() * count // n, (jax.process_index() + 1) * count // n)
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v[rows]) for k, v in batch.items()}
