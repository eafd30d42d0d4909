"""Byte-level masked-token data: the corpus, the tokenizer and the grain pipelines.

Token ids: 0 = pad, 1 = mask, 2 and 3 reserved (begin / end of text), 4 + b for byte b.
The built-in corpus is the standard library's pydoc_data.topics (~460 KB of English
documentation that ships with every CPython), so the default run needs no data files.
"""

from __future__ import annotations

import dataclasses

import grain
import jax
import numpy as np

from flax_encoder.sharding import batch_sharding

PAD_ID, MASK_ID = 0, 1
NUM_SPECIAL = 4
VOCAB_SIZE = 256 + NUM_SPECIAL


def encode(text: str) -> np.ndarray:
  """UTF-8 bytes of `text` as token ids (int32)."""
  return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32) + NUM_SPECIAL


def decode(ids) -> str:
  data = bytes(int(i) - NUM_SPECIAL for i in np.asarray(ids).ravel() if i >= NUM_SPECIAL)
  return data.decode("utf-8", errors="replace")


def load_documents(paths) -> list[str]:
  """The texts of `paths`, or the built-in corpus (pydoc topics, sorted by name) if empty."""
  if not paths:
    from pydoc_data.topics import topics
    return [topics[name] for name in sorted(topics)]
  documents = []
  for path in paths:
    with open(path, encoding="utf-8") as f:
      documents.append(f.read())
  return documents


def chunk(documents: list[str], seq_len: int) -> np.ndarray:
  """Each document cut into seq_len windows; a document's last window is padded with PAD_ID.

  Returns:
    int32 [examples, seq_len].
  """
  rows = []
  for doc in documents:
    ids = encode(doc)
    for start in range(0, len(ids), seq_len):
      row = np.full(seq_len, PAD_ID, np.int32)
      piece = ids[start:start + seq_len]
      row[:len(piece)] = piece
      rows.append(row)
  if not rows:
    raise ValueError("config.data.paths hold no text")
  return np.stack(rows)


def split(examples: np.ndarray, eval_fraction: float, seed: int):
  """A deterministic held-out split: (train, eval) rows."""
  if not 0 < eval_fraction < 1:
    raise ValueError(f"config.data.eval_fraction must lie in (0, 1), got {eval_fraction}")
  order = np.random.default_rng(seed).permutation(len(examples))
  n_eval = max(1, int(round(len(examples) * eval_fraction)))
  return examples[order[n_eval:]], examples[order[:n_eval]]


def mask_tokens(tokens: np.ndarray, mask_rate: float, rng: np.random.Generator) -> dict:
  """BERT-style corruption of `mask_rate` of the non-pad positions.

  Of the chosen positions 80% become MASK_ID, 10% a random byte, 10% stay unchanged.

  Returns:
    {'inputs': corrupted ids, 'targets': original ids, 'weights': 1.0 at chosen positions}.
  """
  real = tokens != PAD_ID
  chosen = real & (rng.random(tokens.shape) < mask_rate)
  action = rng.random(tokens.shape)
  inputs = np.where(chosen & (action < 0.8), MASK_ID, tokens)
  random_bytes = rng.integers(NUM_SPECIAL, VOCAB_SIZE, size=tokens.shape)
  inputs = np.where(chosen & (action >= 0.8) & (action < 0.9), random_bytes, inputs)
  return {"inputs": inputs.astype(np.int32), "targets": tokens.astype(np.int32),
          "weights": chosen.astype(np.float32)}


@dataclasses.dataclass
class MaskTokens(grain.transforms.RandomMap):
  mask_rate: float

  def random_map(self, element, rng: np.random.Generator):
    return mask_tokens(element, self.mask_rate, rng)


def train_batches(examples: np.ndarray, batch_size: int, mask_rate: float,
                  seed: int) -> grain.DatasetIterator:
  """An endless, deterministic iterator of masked batches; its state is checkpointable."""
  if len(examples) < batch_size:
    raise ValueError(f"config.train.batch_size={batch_size} exceeds the {len(examples)} "
                     f"training examples")
  dataset = (grain.MapDataset.source(examples)
             .shuffle(seed=seed)
             .repeat()
             .random_map(MaskTokens(mask_rate), seed=seed + 1)
             .batch(batch_size, drop_remainder=True))
  return iter(dataset.to_iter_dataset())


def eval_batches(examples: np.ndarray, batch_size: int, mask_rate: float,
                 seed: int) -> list[dict]:
  """The held-out split, masked once with a fixed seed, in equal-sized batches.

  The last batch is filled up with all-pad rows of weight 0, so every batch has one shape.
  """
  masked = mask_tokens(examples, mask_rate, np.random.default_rng(seed))
  n = len(examples)
  fill = -n % batch_size
  padded = {k: np.concatenate([v, np.zeros((fill,) + v.shape[1:], v.dtype)])
            for k, v in masked.items()}
  return [{k: v[i:i + batch_size] for k, v in padded.items()}
          for i in range(0, n + fill, batch_size)]


def most_frequent_token(examples: np.ndarray) -> int:
  """The commonest non-pad id: the guess of the baseline that always guesses one token."""
  counts = np.bincount(examples[examples != PAD_ID], minlength=VOCAB_SIZE)
  return int(np.argmax(counts))


def to_devices(batch: dict, mesh: jax.sharding.Mesh) -> dict:
  """A host batch -> global jax.Arrays split along the batch over `mesh`'s devices.

  Every process loads the same batch and contributes its own contiguous share of the rows.
  """
  n, count = jax.process_count(), len(batch["inputs"])
  rows = slice(jax.process_index() * count // n, (jax.process_index() + 1) * count // n)
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v[rows]) for k, v in batch.items()}
