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

Token ids: 0 pad, 1 mask, 2 the separator between documents, 3 unused, then each of the
tokenizer's ids plus 4 (so bytes are 4 + byte value, as in the built-in corpus).

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
import dataclasses
import glob
import hashlib
import io
import json
import multiprocessing
import os
import shutil
import sys
from collections.abc import Iterator

import numpy as np
from tqdm import tqdm

PAD_ID, MASK_ID, SEPARATOR_ID = 0, 1, 2
FIRST_TOKEN_ID = 4  # tokenizer id i is stored as FIRST_TOKEN_ID + i
FORMAT = "flax-encoder windows 1"
BUILTIN = "builtin:pydoc_data.topics"
_CHUNK_CHARS = 1 << 20  # characters of text per unit of work; bytes read at once
_UNITS_IN_FLIGHT = 4  # per worker: bounds the memory held by the work queue


class PrepareError(Exception):
  """Bad input: reported as one line, without a traceback."""


# ---------------------------------------------------------------------------------------------
# Tokenizers: (kind, file) -> encode(list[str]) -> list[list[int]], the tokenizer's own ids.


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
  kind: str  # "bytes", "sentencepiece" or "huggingface"
  path: str | None = None  # the model file, for the last two

  def load(self):
    if self.kind == "bytes":
      return None
    if self.kind == "sentencepiece":
      import sentencepiece as spm
      return spm.SentencePieceProcessor(model_file=self.path)
    from tokenizers import Tokenizer
    return Tokenizer.from_file(self.path)

  def vocab_size(self) -> int:
    tokenizer = self.load()
    if tokenizer is None:
      return 256
    if self.kind == "sentencepiece":
      return tokenizer.get_piece_size()
    return tokenizer.get_vocab_size()


_tokenizer = None  # this worker's, loaded once


def _init_worker(spec: TokenizerSpec) -> None:
  global _tokenizer
  _tokenizer = (spec, spec.load())


def _encode(unit: tuple[list[str], list[bool]]) -> np.ndarray:
  """The ids of a unit of texts, a separator after each that ends a document, as one array."""
  texts, ends = unit
  spec, tokenizer = _tokenizer
  if spec.kind == "bytes":
    ids = [np.frombuffer(t.encode("utf-8"), np.uint8) for t in texts]
  elif spec.kind == "sentencepiece":
    ids = tokenizer.encode(texts)
  else:
    ids = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
  separator = np.array([SEPARATOR_ID], np.int32)
  pieces = []
  for piece, end in zip(ids, ends):
    pieces.append(np.asarray(piece, np.int32) + FIRST_TOKEN_ID)
    if end:
      pieces.append(separator)
  return np.concatenate(pieces) if pieces else np.zeros(0, np.int32)


# ---------------------------------------------------------------------------------------------
# Reading: units of (texts, ends) where ends[i] says text i closes a document.


@dataclasses.dataclass
class Input:
  path: str
  bytes: int = 0
  sha256: str = ""


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


def _lines(path: str, digest) -> Iterator[tuple[int, str]]:
  """(line number, text) of a UTF-8 file, hashing its bytes as they are read."""
  offset = 0
  with open(path, "rb") as f:
    for number, raw in enumerate(f, 1):
      digest.update(raw)
      try:
        yield number, raw.decode("utf-8")
      except UnicodeDecodeError as e:
        _invalid_utf8(path, offset + e.start, e.reason)
      offset += len(raw)


def _blocks(path: str, digest) -> Iterator[str]:
  """The text of a UTF-8 file in blocks of about _CHUNK_CHARS, hashing its bytes."""
  decoder = codecs.getincrementaldecoder("utf-8")()
  offset = 0
  with open(path, "rb") as f:
    while True:
      block = f.read(_CHUNK_CHARS)
      digest.update(block)
      held = len(decoder.getstate()[0])  # the start of a character split by the last block
      try:
        text = decoder.decode(block, final=not block)
      except UnicodeDecodeError as e:
        _invalid_utf8(path, offset - held + e.start, e.reason)
      offset += len(block)
      if text:
        yield text
      if not block:
        return


def _invalid_utf8(path: str, at: int, reason: str):
  with open(path, "rb") as f:
    line = f.read(at).count(b"\n") + 1
  raise PrepareError(f"{path}:{line}: invalid UTF-8 at byte {at} of the file ({reason})")


def _builtin_topics() -> list[str]:
  from pydoc_data.topics import topics
  return [topics[name] for name in sorted(topics)]


def _size(path: str) -> int:
  if path == BUILTIN:
    return sum(len(t.encode("utf-8")) for t in _builtin_topics())
  return os.path.getsize(path)


def _documents(inputs: list[Input], text_field: str) -> Iterator[tuple[str, bool]]:
  """(text, ends a document) over every input, in order."""
  for record in inputs:
    digest = hashlib.sha256()
    record.bytes = _size(record.path)
    if record.path == BUILTIN:
      for text in _builtin_topics():
        digest.update(text.encode("utf-8"))
        yield text, True
    elif record.path.endswith((".jsonl", ".json")):
      for number, line in _lines(record.path, digest):
        if not line.strip():
          continue
        try:
          text = json.loads(line)[text_field]
        except (ValueError, KeyError, TypeError):
          text = None
        if not isinstance(text, str):
          raise PrepareError(f"{record.path}:{number}: not a JSON object with a string field "
                             f"{text_field!r} (--text-field)")
        yield text, True
    else:
      previous = None
      for block in _blocks(record.path, digest):
        if previous is not None:
          yield previous, False
        previous = block
      if previous is not None:
        yield previous, True
    record.sha256 = digest.hexdigest()


def _units(documents: Iterator[tuple[str, bool]]) -> Iterator[tuple[list[str], list[bool]]]:
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
# SentencePiece training on a sample of the corpus.


def train_sentencepiece(inputs: list[Input], text_field: str, vocab_size: int,
                        sample_mb: float) -> bytes:
  """A unigram SentencePiece model (its serialized bytes) trained on a sample of the lines:
  all of them up to `sample_mb` MB of text, else an evenly spread, deterministic subset.
  One thread: sentencepiece's multi-threaded training gives different models run to run."""
  import sentencepiece as spm

  total = sum(_size(r.path) for r in inputs)
  keep = min(1.0, sample_mb * 1e6 / max(total, 1))
  rng = np.random.default_rng(0)
  sample = [line for text, _ in _documents([Input(r.path) for r in inputs], text_field)
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


# ---------------------------------------------------------------------------------------------
# Packing into windows.


class _WindowWriter:
  """Packs ids into seq_len windows and writes each to its split's file."""

  def __init__(self, directory: str, seq_len: int, dtype, eval_every: int):
    self.seq_len, self.dtype, self.eval_every = seq_len, dtype, eval_every
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
    held_out = np.arange(start, start + len(windows)) % self.eval_every == self.eval_every - 1
    for split, rows in (("train", windows[~held_out]), ("eval", windows[held_out])):
      self.files[split].write(rows.astype(self.dtype).tobytes())
      self.counts[split] += len(rows)


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
  inputs = [Input(p) for p in expand(patterns)]
  tmp = f"{out.rstrip(os.sep)}.tmp-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    spec, tokenizer_file = _tokenizer_in(tmp, tokenizer, vocab_size, inputs, text_field,
                                         sample_mb)
    tokenizer_vocab = spec.vocab_size()
    vocab = FIRST_TOKEN_ID + tokenizer_vocab
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
    windows = _WindowWriter(tmp, seq_len, dtype, eval_every=round(1 / eval_fraction))
    total = sum(_size(r.path) for r in inputs)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="prepare", disable=not progress)
    pool = (multiprocessing.get_context("spawn").Pool(workers, _init_worker, (spec,))
            if workers > 1 else None)
    if pool is None:
      _init_worker(spec)
    encode = pool.map if pool else lambda f, units: [f(u) for u in units]
    try:
      units = _units(_documents(inputs, text_field))
      while batch := [u for _, u in zip(range(workers * _UNITS_IN_FLIGHT), units)]:
        for (texts, _), ids in zip(batch, encode(_encode, batch)):
          windows.add(ids)
          bar.update(sum(len(t.encode("utf-8")) for t in texts))
    finally:
      bar.close()
      if pool:
        pool.terminate()
    windows.close()
    if not windows.text_tokens:
      raise PrepareError("the inputs hold no text")
    if not windows.counts["eval"]:
      raise PrepareError(f"{windows.counts['train']} window(s) of {seq_len} tokens are too few "
                         f"to hold out one in {round(1 / eval_fraction)} (--eval-fraction "
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
        "eval_every": round(1 / eval_fraction),
        "tokens": windows.text_tokens,
        "inputs": [dataclasses.asdict(r) for r in inputs],
    }
    with open(os.path.join(tmp, "dataset.json"), "w") as f:
      json.dump(meta, f, indent=1)
    os.rename(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return meta


def _tokenizer_in(directory, tokenizer, vocab_size, inputs, text_field, sample_mb):
  """(TokenizerSpec with its file in `directory`, that file's name or None)."""
  if tokenizer == "bytes":
    if vocab_size not in (None, 256):
      raise PrepareError(f"--vocab-size {vocab_size}: the bytes tokenizer has 256 tokens")
    return TokenizerSpec("bytes"), None
  if tokenizer == "sentencepiece":
    if vocab_size is None:
      raise PrepareError("--tokenizer sentencepiece needs --vocab-size")
    model = train_sentencepiece(inputs, text_field, vocab_size, sample_mb)
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
    size = spec.vocab_size()
  except Exception as e:  # noqa: BLE001 - whatever the library says, name the file
    raise PrepareError(f"--tokenizer {tokenizer!r}: not a readable {kind} tokenizer "
                       f"({type(e).__name__}: {e})") from None
  if vocab_size not in (None, size):
    raise PrepareError(f"--vocab-size {vocab_size}: {tokenizer!r} has {size} tokens")
  return spec, name


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
