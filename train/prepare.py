r"""Text in, training windows out, in memory that does not grow with the corpus.

  python -m train.prepare --input 'corpus/*.txt' --out data/corpus \
      --tokenizer sentencepiece --vocab-size 8000 --seq-len 512
  python -m train.prepare --input docs.jsonl --text-field text --out data/docs \
      --tokenizer my/tokenizer.json --seq-len 128          # a Hugging Face tokenizer
  python -m train --workdir runs/corpus --config.data.prepared=data/corpus

Documents: each plain UTF-8 text file is one document, read line by line; each line of a
JSON-lines file (`.jsonl`, `.json`) is one document, its text under `--text-field`;
`--input builtin:pydoc_data.topics` is the built-in corpus, a document per topic of the
standard library's pydoc_data.topics (~460 KB of English that ships with CPython).

Tokenizers (`--tokenizer`): `bytes` (a UTF-8 byte per token); `sentencepiece` (a unigram model
trained with the `sentencepiece` package on a sample of the corpus, `--vocab-size` pieces,
with byte fallback so that any text encodes); or the path of a SentencePiece `.model` or a
Hugging Face `tokenizer.json` (the `tokenizers` package).

Token ids (`train.tokens`): 0 pad, 1 mask, 2 the separator between documents, 3 unused, then
each of the tokenizer's ids plus 4 (so bytes are 4 + byte value, as in the built-in corpus).

Output, in `--out`: documents packed back to back with the separator after each, cut into
windows of `--seq-len` ids (only the very last window is padded); every n-th window, n =
round(1 / `--eval-fraction`), goes to the held-out split. `train.bin` and `eval.bin` hold the
windows row after row (uint16 where the vocabulary fits, else uint32); `dataset.json` records
the tokenizer, vocabulary size, special ids, seq_len, window counts and each input's path, size
and SHA-256; the tokenizer's file is copied beside them. Everything is written into a temporary
directory renamed to `--out` at the end, so an interrupted run leaves nothing training accepts.
The same inputs and arguments give byte-identical files.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import dataclasses
import glob
import hashlib
import io
import itertools
import json
import multiprocessing
import os
import shutil
import sys
from collections.abc import Callable, Iterator

import numpy as np
from tqdm import tqdm

from train.tokens import (FIRST_TOKEN_ID, MASK_ID, PAD_ID, SEPARATOR_ID, Tokenizer,
                          TokenizerSpec)

FORMAT = "flax-encoder windows 1"
BUILTIN = "builtin:pydoc_data.topics"
_CHUNK_CHARS = 1 << 20  # characters of text per unit of work; bytes read at once
_UNITS_IN_FLIGHT = 4  # per worker: bounds the memory held by the work queue


class PrepareError(Exception):
  """Bad input: reported as one line, without a traceback."""


# ---------------------------------------------------------------------------------------------
# Reading: each input is a Source that hashes its bytes as they are read; its documents come
# as (text, ends a document) pairs, a long plain-text file in several blocks.


def expand(patterns: list[str]) -> list[str]:
  paths = []
  for pattern in patterns:
    if pattern == BUILTIN:
      paths.append(pattern)
      continue
    matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
    if not matches:
      raise PrepareError(f"--input {pattern!r} matches no file")
    for path in matches:
      if not os.path.isfile(path):
        raise PrepareError(f"--input {path!r}: no such file")
      paths.append(path)
  return paths


def _builtin_topics() -> list[str]:
  from pydoc_data.topics import topics
  return [topics[name] for name in sorted(topics)]


class Source:
  """One input: reads its documents, hashing the bytes read; `record()` describes it after."""

  def __init__(self, path: str):
    self.path = path
    self._digest = hashlib.sha256()

  def size(self) -> int:
    if self.path == BUILTIN:
      return sum(len(t.encode("utf-8")) for t in _builtin_topics())
    return os.path.getsize(self.path)

  def record(self) -> dict:
    """{'path', 'bytes', 'sha256'}: what dataset.json records of it, once it has been read."""
    return {"path": self.path, "bytes": self.size(), "sha256": self._digest.hexdigest()}

  def differs_from(self, record: dict) -> str | None:
    """How this input differs from what `record` describes (the size first, then the SHA-256
    when the size matches), or None."""
    if self.path != BUILTIN and not os.path.isfile(self.path):
      return "it is gone"
    if self.size() != record["bytes"]:
      return f"{record['bytes']} bytes then, {self.size()} now"
    digest = hashlib.sha256()
    if self.path == BUILTIN:
      for text in _builtin_topics():
        digest.update(text.encode("utf-8"))
    else:
      with open(self.path, "rb") as f:
        while block := f.read(_CHUNK_CHARS):
          digest.update(block)
    return None if digest.hexdigest() == record["sha256"] else "same size, other SHA-256"

  def documents(self, text_field: str) -> Iterator[tuple[str, bool]]:
    """(text, whether it ends a document), in file order."""
    if self.path == BUILTIN:
      for text in _builtin_topics():
        self._digest.update(text.encode("utf-8"))
        yield text, True
    elif self.path.endswith((".jsonl", ".json")):
      for number, record in self.records():
        text = record.get(text_field)
        if not isinstance(text, str):
          raise PrepareError(f"{self.path}:{number}: not a JSON object with a string field "
                             f"{text_field!r} (--text-field)")
        yield text, True
    else:
      previous = None
      for block in self._blocks():
        if previous is not None:
          yield previous, False
        previous = block
      if previous is not None:
        yield previous, True

  def records(self) -> Iterator[tuple[int, dict]]:
    """(line number, JSON object) of each non-blank line of a JSON-lines file."""
    for number, line in self._lines():
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError as e:
        raise PrepareError(f"{self.path}:{number}: not valid JSON ({e})") from None
      if not isinstance(record, dict):
        raise PrepareError(f"{self.path}:{number}: not a JSON object")
      yield number, record

  def _lines(self) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 file."""
    offset = 0
    with open(self.path, "rb") as f:
      for number, raw in enumerate(f, 1):
        self._digest.update(raw)
        try:
          yield number, raw.decode("utf-8")
        except UnicodeDecodeError as e:
          self._invalid_utf8(offset + e.start, e.reason)
        offset += len(raw)

  def _blocks(self) -> Iterator[str]:
    """The text of a UTF-8 file in blocks of about _CHUNK_CHARS."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(self.path, "rb") as f:
      while True:
        block = f.read(_CHUNK_CHARS)
        self._digest.update(block)
        held = len(decoder.getstate()[0])  # the start of a character split by the last block
        try:
          text = decoder.decode(block, final=not block)
        except UnicodeDecodeError as e:
          self._invalid_utf8(offset - held + e.start, e.reason)
        offset += len(block)
        if text:
          yield text
        if not block:
          return

  def _invalid_utf8(self, at: int, reason: str):
    with open(self.path, "rb") as f:
      line = f.read(at).count(b"\n") + 1
    raise PrepareError(f"{self.path}:{line}: invalid UTF-8 at byte {at} of the file ({reason})")


def _documents(sources: list[Source], text_field: str) -> Iterator[tuple[str, bool]]:
  for source in sources:
    yield from source.documents(text_field)


def _units(documents: Iterator[tuple[str, bool]]) -> Iterator[tuple[list[str], list[bool]]]:
  """Documents grouped into units of work of about _CHUNK_CHARS characters."""
  texts, ends, size = [], [], 0
  for text, end in documents:
    texts.append(text)
    ends.append(end)
    size += len(text)
    if size >= _CHUNK_CHARS:
      yield texts, ends
      texts, ends, size = [], [], 0
  if texts:
    yield texts, ends


# ---------------------------------------------------------------------------------------------
# Tokenizing, in this process or in a pool of workers.


def unit_ids(tokenizer: Tokenizer, unit: tuple[list[str], list[bool]]) -> np.ndarray:
  """The ids of a unit of texts, a separator after each that ends a document, as one array."""
  texts, ends = unit
  separator = np.array([SEPARATOR_ID], np.int32)
  pieces = []
  for ids, end in zip(tokenizer.encode_batch(texts), ends):
    pieces.append(ids)
    if end:
      pieces.append(separator)
  return np.concatenate(pieces) if pieces else np.zeros(0, np.int32)


# A pool worker's tokenizer, loaded once when the worker starts (Pool's initializer is the only
# way to hand each worker process a state of its own).
_worker_tokenizer: Tokenizer | None = None


def _start_worker(spec: TokenizerSpec) -> None:
  global _worker_tokenizer
  _worker_tokenizer = spec.load()


def _worker_unit_ids(unit) -> np.ndarray:
  return unit_ids(_worker_tokenizer, unit)


@contextlib.contextmanager
def _encoder(spec: TokenizerSpec, workers: int):
  """Yields a function: a list of units -> their ids, in order, computed by `workers`
  processes (one: here, without a pool)."""
  if workers == 1:
    tokenizer = spec.load()
    yield lambda units: [unit_ids(tokenizer, u) for u in units]
    return
  pool = multiprocessing.get_context("spawn").Pool(workers, _start_worker, (spec,))
  try:
    yield lambda units: pool.map(_worker_unit_ids, units)
  finally:
    pool.terminate()


def _encoded(units: Iterator, encode: Callable,
             in_flight: int) -> Iterator[tuple[tuple, np.ndarray]]:
  """(unit, its ids) in order, `in_flight` units at a time (bounding the memory held)."""
  while batch := list(itertools.islice(units, in_flight)):
    yield from zip(batch, encode(batch))


# ---------------------------------------------------------------------------------------------
# The tokenizer: given as a file, or a SentencePiece model trained on a sample of the corpus.


def train_sentencepiece(sources: list[Source], text_field: str, vocab_size: int,
                        sample_mb: float) -> bytes:
  """A unigram SentencePiece model (its serialized bytes) trained on a sample of the lines:
  all of them up to `sample_mb` MB of text, else an evenly spread, deterministic subset.
  One thread: sentencepiece's multi-threaded training gives different models run to run."""
  import sentencepiece as spm

  total = sum(s.size() for s in sources)
  keep = min(1.0, sample_mb * 1e6 / max(total, 1))
  rng = np.random.default_rng(0)
  fresh = [Source(s.path) for s in sources]  # a first pass of its own: nothing is recorded
  sample = [line for text, _ in _documents(fresh, text_field)
            for line in text.splitlines() if line.strip() and rng.random() < keep]
  if not sample:
    raise PrepareError("the inputs hold no text")
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample), model_writer=model, vocab_size=vocab_size,
        model_type="unigram", byte_fallback=True, character_coverage=0.9995,
        pad_id=-1, bos_id=-1, eos_id=-1, unk_id=0, num_threads=1,
        max_sentence_length=1 << 16, train_extremely_large_corpus=False, minloglevel=2)
  except RuntimeError as e:
    raise PrepareError(f"--vocab-size {vocab_size}: sentencepiece cannot train it on this "
                       f"corpus ({str(e).strip()})") from None
  return model.getvalue()


def _tokenizer_in(directory, tokenizer, vocab_size, sources, text_field, sample_mb):
  """(TokenizerSpec with its file in `directory`, that file's name or None)."""
  if tokenizer == "bytes":
    if vocab_size not in (None, 256):
      raise PrepareError(f"--vocab-size {vocab_size}: the bytes tokenizer has 256 tokens")
    return TokenizerSpec("bytes"), None
  if tokenizer == "sentencepiece":
    if vocab_size is None:
      raise PrepareError("--tokenizer sentencepiece needs --vocab-size")
    model = train_sentencepiece(sources, text_field, vocab_size, sample_mb)
    path = os.path.join(directory, "tokenizer.model")
    with open(path, "wb") as f:
      f.write(model)
    return TokenizerSpec("sentencepiece", path), "tokenizer.model"
  if not os.path.isfile(tokenizer):
    raise PrepareError(f"--tokenizer {tokenizer!r}: not 'bytes', 'sentencepiece' or a file")
  kind, name = (("huggingface", "tokenizer.json") if tokenizer.endswith(".json")
                else ("sentencepiece", "tokenizer.model"))
  path = os.path.join(directory, name)
  shutil.copyfile(tokenizer, path)
  spec = TokenizerSpec(kind, path)
  try:
    size = spec.load().size
  except Exception as e:  # noqa: BLE001 - whatever the library says, name the file
    raise PrepareError(f"--tokenizer {tokenizer!r}: not a readable {kind} tokenizer "
                       f"({type(e).__name__}: {e})") from None
  if vocab_size not in (None, size):
    raise PrepareError(f"--vocab-size {vocab_size}: {tokenizer!r} has {size} tokens")
  return spec, name


# ---------------------------------------------------------------------------------------------
# Packing into windows.


class _WindowWriter:
  """Packs ids into seq_len windows and writes each to its split's file: every
  `held_out_every`-th window to eval.bin, the others to train.bin."""

  def __init__(self, directory: str, seq_len: int, dtype, held_out_every: int):
    self.seq_len, self.dtype, self.held_out_every = seq_len, dtype, held_out_every
    self.files = {s: open(os.path.join(directory, f"{s}.bin"), "wb") for s in ("train", "eval")}
    self.counts = {"train": 0, "eval": 0}
    self.pending = np.zeros(0, np.int32)
    self.text_tokens = 0  # ids other than separators

  def add(self, ids: np.ndarray) -> None:
    self.text_tokens += int(np.count_nonzero(ids != SEPARATOR_ID))
    flat = np.concatenate([self.pending, ids])
    full = len(flat) // self.seq_len * self.seq_len
    self._write(flat[:full].reshape(-1, self.seq_len))
    self.pending = flat[full:]

  def close(self) -> None:
    if len(self.pending):
      last = np.full(self.seq_len, PAD_ID, np.int32)
      last[:len(self.pending)] = self.pending
      self._write(last[None])
    for f in self.files.values():
      f.close()

  def _write(self, windows: np.ndarray) -> None:
    start = self.counts["train"] + self.counts["eval"]
    every = self.held_out_every
    held_out = np.arange(start, start + len(windows)) % every == every - 1
    for split, rows in (("train", windows[~held_out]), ("eval", windows[held_out])):
      self.files[split].write(rows.astype(self.dtype).tobytes())
      self.counts[split] += len(rows)


@contextlib.contextmanager
def temporary_directory(out: str):
  """A fresh directory beside `out`, renamed to `out` if the block completes, else removed."""
  tmp = f"{out.rstrip(os.sep)}.tmp-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    yield tmp
    os.rename(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def prepare(patterns: list[str], out: str, tokenizer: str = "bytes", vocab_size: int | None = None,
            seq_len: int = 512, eval_fraction: float = 0.01, text_field: str = "text",
            workers: int = 1, sample_mb: float = 100.0, progress: bool = True) -> dict:
  """Writes the prepared dataset to `out` (see the module docstring); returns its dataset.json."""
  if seq_len < 2:
    raise PrepareError(f"--seq-len must be >= 2, got {seq_len}")
  if not 0 < eval_fraction < 1:
    raise PrepareError(f"--eval-fraction must lie in (0, 1), got {eval_fraction}")
  if workers < 1:
    raise PrepareError(f"--workers must be >= 1, got {workers}")
  if os.path.exists(out):
    raise PrepareError(f"--out {out!r} already exists; remove it or choose another directory")
  sources = [Source(p) for p in expand(patterns)]
  held_out_every = round(1 / eval_fraction)
  with temporary_directory(out) as tmp:
    spec, tokenizer_file = _tokenizer_in(tmp, tokenizer, vocab_size, sources, text_field,
                                         sample_mb)
    tokenizer_vocab = spec.load().size
    vocab = FIRST_TOKEN_ID + tokenizer_vocab
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
    windows = _WindowWriter(tmp, seq_len, dtype, held_out_every)
    total = sum(s.size() for s in sources)
    with (tqdm(total=total, unit="B", unit_scale=True, desc="prepare", disable=not progress)
          as bar, _encoder(spec, workers) as encode):
      units = _units(_documents(sources, text_field))
      for (texts, _), ids in _encoded(units, encode, workers * _UNITS_IN_FLIGHT):
        windows.add(ids)
        bar.update(sum(len(t.encode("utf-8")) for t in texts))
    windows.close()
    if not windows.text_tokens:
      raise PrepareError("the inputs hold no text")
    if not windows.counts["eval"]:
      raise PrepareError(f"{windows.counts['train']} window(s) of {seq_len} tokens are too few "
                         f"to hold out one in {held_out_every} (--eval-fraction "
                         f"{eval_fraction})")
    meta = {
        "format": FORMAT,
        "tokenizer": {"kind": spec.kind, "file": tokenizer_file, "vocab_size": tokenizer_vocab},
        "vocab_size": vocab,
        "special_ids": {"pad": PAD_ID, "mask": MASK_ID, "separator": SEPARATOR_ID},
        "first_token_id": FIRST_TOKEN_ID,
        "seq_len": seq_len,
        "dtype": np.dtype(dtype).name,
        "windows": windows.counts,
        "held_out_every": held_out_every,
        "tokens": windows.text_tokens,
        "inputs": [s.record() for s in sources],
    }
    with open(os.path.join(tmp, "dataset.json"), "w") as f:
      json.dump(meta, f, indent=1)
  return meta


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m train.prepare", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--input", action="append", required=True,
                      help="a text or JSON-lines file, or a glob; repeatable")
  parser.add_argument("--out", required=True, help="the directory to create")
  parser.add_argument("--tokenizer", default="bytes",
                      help="bytes, sentencepiece, or a .model / tokenizer.json file")
  parser.add_argument("--vocab-size", type=int, default=None)
  parser.add_argument("--seq-len", type=int, default=512)
  parser.add_argument("--eval-fraction", type=float, default=0.01)
  parser.add_argument("--text-field", default="text", help="the JSON-lines field with the text")
  parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--sample-mb", type=float, default=100.0,
                      help="MB of text sentencepiece trains on")
  args = parser.parse_args(argv)
  try:
    meta = prepare(args.input, args.out, args.tokenizer, args.vocab_size, args.seq_len,
                   args.eval_fraction, args.text_field, args.workers, args.sample_mb)
  except PrepareError as e:
    print(f"prepare: error: {e}", file=sys.stderr)
    return 2
  print(f"{args.out}: {meta['windows']['train']} training and {meta['windows']['eval']} "
        f"held-out windows of {meta['seq_len']} tokens, vocabulary {meta['vocab_size']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
