r"""Text in, training windows out, in memory that does not grow with the corpus.

  python -m train.prepare --input corpus/ --include '*.txt' --out data/corpus \
      --tokenizer sentencepiece --vocab-size 8000 --seq-len 512
  python -m train.prepare --input 'dump/**/*.jsonl.zst' --input wiki.parquet --text-field text \
      --out data/docs --tokenizer my/tokenizer.json --seq-len 128   # a Hugging Face tokenizer
  python -m train --workdir runs/corpus --config.data.prepared=data/corpus

Inputs: files, directories (every file below, sorted, names starting with '.' left out) and
globs ('**' crosses directories); `--include` filters what directories and globs find. Each
plain UTF-8 text file is one document, read in blocks; each line of a JSON-lines file
(`.jsonl`, `.json`) and each row of a Parquet file is one document, its text under
`--text-field`. A `.gz`, `.bz2`, `.xz` or `.zst` ending is decompressed as the file is read.
`--input builtin:pydoc_data.topics` is the built-in corpus, a document per topic of the
standard library's pydoc_data.topics (~460 KB of English that ships with CPython).

Tokenizers (`--tokenizer`): `bytes` (a UTF-8 byte per token); a vocabulary of `--vocab-size`
trained on a sample of the corpus, in a process of its own: `sentencepiece` (unigram, byte
fallback) or, with the `tokenizers` package, `bpe` (byte-level), `unigram` or `wordpiece`;
or the path of a SentencePiece `.model` or a Hugging Face `tokenizer.json`. `--vocab-only`
writes just the trained tokenizer, for the shards to share.

Token ids (`train.tokens`): 0 pad, 1 mask, 2 the separator between documents, 3 unused, then
each of the tokenizer's ids plus 4 (so bytes are 4 + byte value, as in the built-in corpus).

Parts and shards: the inputs are numbered into parts of about `--part-mb` MB as stored
(consecutive files together; a bigger file is read as several parts, record r of it in part
r mod parts). Each part's documents are packed back to back, a separator after each, into
windows of `--seq-len` ids of its own (its last window padded); window j of part u is held out
when (j + u) mod n = n - 1, n = round(1 / `--eval-fraction`). So a part's windows do not depend
on what is prepared with it: `--shard I --num-shards N` prepares the parts u with u mod N = I,
and N shards hold exactly the windows of one prepare over all the inputs.

Output, in `--out`: `train.bin` and `eval.bin` hold the windows row after row (uint16 where the
vocabulary fits, else uint32); `dataset.json` records the tokenizer, vocabulary size, special
ids, seq_len, window counts, the shard and each input's path, size and SHA-256 as stored; the
tokenizer's file is copied beside them. Everything is written into a temporary directory
renamed to `--out` at the end, so an interrupted run (Ctrl-C: exit 130, SIGTERM: 143, its
worker processes ended with it) leaves nothing training accepts. The same inputs and
arguments give byte-identical files, whatever the number of `--workers`.
"""

from __future__ import annotations

import argparse
import bz2
import codecs
import contextlib
import fnmatch
import glob
import gzip
import hashlib
import io
import itertools
import json
import lzma
import multiprocessing
import os
import queue
import shutil
import signal
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
_PARQUET_ROWS = 1024  # rows read at a time


class PrepareError(Exception):
  """Bad input: reported as one line, without a traceback."""


# ---------------------------------------------------------------------------------------------
# Reading: --input patterns to files; each file a Source that hashes its bytes as stored while
# it reads them (decompressing as it goes); its documents come as (text, ends a document).


def expand(patterns: list[str], include: list[str] | None = None) -> list[str]:
  """The files `patterns` name, in order, each once: a file as given; a directory, every file
  below it (in sorted order, names starting with '.' left out); a glob (`**` crossing
  directories), what it matches, a matched directory again every file below it. Files found
  below a directory or by a glob are kept only if their name matches one of `include`
  (fnmatch patterns such as '*.c'), where given."""
  paths = []
  for pattern in patterns:
    if pattern == BUILTIN:
      paths.append(pattern)
      continue
    found = _below(pattern) if os.path.isdir(pattern) else None
    if found is None and glob.has_magic(pattern):
      found = [f for match in sorted(glob.glob(pattern, recursive=True))
               for f in (_below(match) if os.path.isdir(match) else [match])]
      if not found:
        raise PrepareError(f"--input {pattern!r} matches no file")
    if found is None:
      if not os.path.isfile(pattern):
        raise PrepareError(f"--input {pattern!r}: no such file")
      paths.append(pattern)
      continue
    kept = [f for f in found
            if not include or any(fnmatch.fnmatch(os.path.basename(f), i) for i in include)]
    if not kept:
      raise PrepareError(f"--input {pattern!r}: no file below it matches --include "
                         f"{' '.join(include or [])}")
    paths.extend(kept)
  return list(dict.fromkeys(paths))


def _below(directory: str) -> list[str]:
  files = []
  for root, dirs, names in os.walk(directory):
    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    files.extend(os.path.join(root, n) for n in sorted(names) if not n.startswith("."))
  return files


def _builtin_topics() -> list[str]:
  from pydoc_data.topics import topics
  return [topics[name] for name in sorted(topics)]


COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")


def stored_format(path: str) -> tuple[str, str | None]:
  """(what the file holds: 'text', 'jsonl' or 'parquet'; its compression or None), from its
  name: a `.gz`, `.bz2`, `.xz` or `.zst` ending, before it `.jsonl` / `.json` or `.parquet`."""
  name = path.lower()
  compression = next((c for c in COMPRESSIONS if name.endswith(c)), None)
  if compression:
    name = name[:-len(compression)]
  if name.endswith(".parquet"):
    return "parquet", compression
  return ("jsonl" if name.endswith((".jsonl", ".json")) else "text"), compression


class _Hashing(io.RawIOBase):
  """A binary file read through, its bytes added to `digest` as they are read."""

  def __init__(self, file, digest):
    self._file, self._digest = file, digest

  def readable(self) -> bool:
    return True

  def readinto(self, buffer) -> int:
    n = self._file.readinto(buffer)
    self._digest.update(memoryview(buffer)[:n])
    return n


def _decompressing(raw, compression: str | None):
  """A buffered binary stream of what `raw` holds, decompressed."""
  if compression == ".gz":
    return gzip.GzipFile(fileobj=raw)
  if compression == ".bz2":
    return bz2.BZ2File(raw)
  if compression == ".xz":
    return lzma.LZMAFile(raw)
  if compression == ".zst":
    import zstandard
    return io.BufferedReader(
        zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True))
  return io.BufferedReader(raw, _CHUNK_CHARS)


class Source:
  """One input file. Reads its documents, hashing the file's bytes as stored; `record()`
  describes it after. A file too big for one part of the corpus is read as `parts` parts:
  record r (line, row, block of text) is in part r % parts, and only the parts in `keep` are
  read (the ones this shard prepares)."""

  def __init__(self, path: str, first: int = 0, parts: int = 1):
    self.path, self.first, self.parts = path, first, parts  # its parts: first ... first+parts-1
    self.keep = set(range(parts))
    self.format, self.compression = stored_format(path) if path != BUILTIN else ("text", None)
    self._digest = hashlib.sha256()

  def size(self) -> int:
    return _stored_size(self.path)

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
    same = _file_digest(self.path).hexdigest() == record["sha256"]
    return None if same else "same size, other SHA-256"

  def documents(self, text_field: str) -> Iterator[tuple[int, str, bool]]:
    """(part, text, whether it ends a document), in file order, of the parts kept."""
    if self.path == BUILTIN:
      for text in _builtin_topics():
        self._digest.update(text.encode("utf-8"))
        yield self.first, text, True
    elif self.format == "parquet":
      for part, (number, row) in self._parts(self._parquet_rows(text_field)):
        text = row[text_field]
        if not isinstance(text, str):
          raise PrepareError(f"{self.path}: row {number}: {text_field!r} (--text-field) is "
                             f"{type(text).__name__}, expected a string")
        yield part, text, True
    elif self.format == "jsonl":
      for part, (number, record) in self._parts(self.records()):
        text = record.get(text_field)
        if not isinstance(text, str):
          raise PrepareError(f"{self.path}:{number}: not a JSON object with a string field "
                             f"{text_field!r} (--text-field)")
        yield part, text, True
    else:
      previous = None
      for part, block in self._parts(self._blocks()):
        if previous is not None:
          yield *previous, self.parts > 1  # a part's blocks lie apart in the file
        previous = part, block
      if previous is not None:
        yield *previous, True

  def records(self) -> Iterator[tuple[int, dict]]:
    """(line number, JSON object) of each non-blank line of a JSON-lines file; (row number,
    {column: value}) of each row of a Parquet file."""
    if self.format == "parquet":
      yield from self._parquet_rows()
      return
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

  def _parts(self, records: Iterator) -> Iterator[tuple[int, object]]:
    """(part, record) of the records in the parts kept."""
    for r, record in enumerate(records):
      if r % self.parts in self.keep:
        yield self.first + r % self.parts, record

  @contextlib.contextmanager
  def _stream(self):
    """The file's bytes, decompressed; all of the file as stored is hashed once it is read."""
    self._digest = hashlib.sha256()
    with open(self.path, "rb") as stored:
      raw = _Hashing(stored, self._digest)
      try:
        yield _decompressing(raw, self.compression)
      except (OSError, EOFError, lzma.LZMAError) as e:
        if not self.compression:
          raise
        raise PrepareError(f"{self.path}: not a readable {self.compression} file "
                           f"({type(e).__name__}: {e})") from None
      except Exception as e:
        if type(e).__module__ == "zstd" or "Zstd" in type(e).__name__:
          raise PrepareError(f"{self.path}: not a readable .zst file ({e})") from None
        raise
      while raw.read(_CHUNK_CHARS):  # what follows the compressed stream, if anything
        pass

  def _lines(self) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 file."""
    offset = 0
    with self._stream() as f:
      for number, raw in enumerate(f, 1):
        try:
          yield number, raw.decode("utf-8")
        except UnicodeDecodeError as e:
          self._invalid_utf8(offset + e.start, e.reason)
        offset += len(raw)

  def _blocks(self) -> Iterator[str]:
    """The text of a UTF-8 file in blocks of about _CHUNK_CHARS."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with self._stream() as f:
      while True:
        block = f.read(_CHUNK_CHARS)
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
    with open(self.path, "rb") as stored, _decompressing(stored, self.compression) as f:
      line = f.read(at).count(b"\n") + 1
    where = "of the file" if not self.compression else "decompressed"
    raise PrepareError(f"{self.path}:{line}: invalid UTF-8 at byte {at} {where} ({reason})")

  def _parquet(self):
    import pyarrow.parquet as pq
    try:
      return pq.ParquetFile(self.path)
    except Exception as e:  # noqa: BLE001 - pyarrow's errors, whichever: name the file
      raise PrepareError(f"{self.path}: not a readable Parquet file ({e})") from None

  def _parquet_rows(self, text_field: str | None = None) -> Iterator[tuple[int, dict]]:
    """(row number, {column: value}) of a Parquet file's rows, a row group at a time: only
    the column `text_field`, where given. The file is hashed once read (Parquet is read by
    seeking, not as one stream)."""
    with self._parquet() as table:
      if text_field is not None and text_field not in table.schema_arrow.names:
        raise PrepareError(f"{self.path}: no column {text_field!r} (--text-field); it has "
                           f"{', '.join(table.schema_arrow.names)}")
      columns = None if text_field is None else [text_field]
      yield from enumerate((row for batch in table.iter_batches(_PARQUET_ROWS, columns=columns)
                            for row in batch.to_pylist()), 1)
    self._digest = _file_digest(self.path)


def _stored_size(path: str) -> int:
  if path == BUILTIN:
    return sum(len(t.encode("utf-8")) for t in _builtin_topics())
  return os.path.getsize(path)


def _file_digest(path: str):
  """The SHA-256 (a hashlib object) of a file as stored, or of the built-in corpus's texts."""
  digest = hashlib.sha256()
  if path == BUILTIN:
    for text in _builtin_topics():
      digest.update(text.encode("utf-8"))
  else:
    with open(path, "rb") as f:
      while block := f.read(_CHUNK_CHARS):
        digest.update(block)
  return digest


def plan(paths: list[str], part_bytes: int) -> list[Source]:
  """The inputs as Sources numbered into parts of the corpus: consecutive files together up to
  `part_bytes` (as stored), a bigger file split into parts of its own. The numbering depends
  only on the inputs and `part_bytes`, so every shard of a prepare agrees on it."""
  sources, part, filled = [], 0, 0  # filled: bytes in part `part` so far
  for path in paths:
    size = _stored_size(path)
    if size > part_bytes:
      part += filled > 0
      sources.append(Source(path, part, parts=-(-size // part_bytes)))
      part, filled = part + sources[-1].parts, 0
    else:
      if filled and filled + size > part_bytes:
        part, filled = part + 1, 0
      sources.append(Source(path, part))
      filled += size
  return sources


def shard_of(sources: list[Source], shard: int, num_shards: int) -> list[Source]:
  """The sources that hold parts of shard `shard` (part u % num_shards == shard), each keeping
  only those parts."""
  mine = []
  for source in sources:
    source.keep = {k for k in range(source.parts) if (source.first + k) % num_shards == shard}
    if source.keep:
      mine.append(source)
  return mine


def _documents(sources: list[Source], text_field: str) -> Iterator[tuple[int, str, bool]]:
  for source in sources:
    yield from source.documents(text_field)


def _chunks(documents: Iterator[tuple[int, str, bool]]) -> Iterator[tuple[list, list, list]]:
  """Documents grouped into units of work of about _CHUNK_CHARS characters: (parts, texts,
  ends)."""
  parts, texts, ends, size = [], [], [], 0
  for part, text, end in documents:
    parts.append(part)
    texts.append(text)
    ends.append(end)
    size += len(text)
    if size >= _CHUNK_CHARS:
      yield parts, texts, ends
      parts, texts, ends, size = [], [], [], 0
  if texts:
    yield parts, texts, ends


# ---------------------------------------------------------------------------------------------
# Tokenizing, in this process or in a pool of workers.


def chunk_ids(tokenizer: Tokenizer, chunk: tuple[list, list, list]) -> list[tuple[int, np.ndarray]]:
  """(part, ids) of a chunk's texts, a separator after each that ends a document, one array
  per part in the order the parts come."""
  parts, texts, ends = chunk
  separator = np.array([SEPARATOR_ID], np.int32)
  pieces = {}
  for part, ids, end in zip(parts, tokenizer.encode_batch(texts), ends):
    pieces.setdefault(part, []).append(ids)
    if end:
      pieces[part].append(separator)
  return [(part, np.concatenate(p)) for part, p in pieces.items()]


# A pool worker's tokenizer, loaded once when the worker starts (Pool's initializer is the only
# way to hand each worker process a state of its own).
_worker_tokenizer: Tokenizer | None = None


def _start_worker(spec: TokenizerSpec) -> None:
  global _worker_tokenizer
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
  _worker_tokenizer = spec.load()


def _worker_chunk_ids(chunk):
  return chunk_ids(_worker_tokenizer, chunk)


@contextlib.contextmanager
def _encoder(spec: TokenizerSpec, workers: int):
  """Yields a function: a list of chunks -> their ids, in order, computed by `workers`
  processes (one: here, without a pool)."""
  if workers == 1:
    tokenizer = spec.load()
    yield lambda chunks: [chunk_ids(tokenizer, c) for c in chunks]
    return
  pool = multiprocessing.get_context("spawn").Pool(workers, _start_worker, (spec,))
  try:
    yield lambda chunks: pool.map(_worker_chunk_ids, chunks)
  finally:
    pool.terminate()
    pool.join()


def _encoded(chunks: Iterator, encode: Callable, in_flight: int) -> Iterator[tuple[tuple, list]]:
  """(chunk, its ids) in order, `in_flight` chunks at a time (bounding the memory held)."""
  while batch := list(itertools.islice(chunks, in_flight)):
    yield from zip(batch, encode(batch))


def default_workers(tokenizer: str) -> int:
  """What measured fastest (BENCHMARKS.md, "Preparing a corpus"): one process for bytes (read
  faster than a second process could be fed) and SentencePiece (its batch encoding already
  uses every core; a second process was no faster); one per CPU for a `tokenizers` model
  (a second process was 12% faster)."""
  if tokenizer in ("bytes", "sentencepiece") or tokenizer.endswith(".model"):
    return 1
  return os.cpu_count() or 1


# ---------------------------------------------------------------------------------------------
# The tokenizer: given as a file, or trained on a sample of the corpus (in a process of its
# own, so that Ctrl-C stops it at once).

TRAINED = ("sentencepiece", "bpe", "wordpiece", "unigram")
# Seconds per MB of sample, measured (BENCHMARKS.md): for the estimate printed before training.
_TRAINING_SECONDS_PER_MB = {"sentencepiece": 0.8, "bpe": 0.4, "wordpiece": 0.4, "unigram": 1.0}


def sample_lines(paths: list[str], text_field: str, sample_mb: float,
                 keepends: bool = False) -> list[str]:
  """The corpus's non-blank lines (with their line ends if `keepends`), all of them up to
  `sample_mb` MB of text, else an evenly spread, deterministic subset."""
  sources = [Source(p) for p in paths]
  keep = min(1.0, sample_mb * 1e6 / max(sum(s.size() for s in sources), 1))
  rng = np.random.default_rng(0)
  return [line for _, text, _ in _documents(sources, text_field)
          for line in text.splitlines(keepends) if line.strip() and rng.random() < keep]


def train_vocabulary(kind: str, sample: list[str], vocab_size: int, path: str,
                     exact: bool = True) -> None:
  """Trains a `kind` (one of TRAINED) tokenizer of `vocab_size` ids on `sample` into `path`;
  unless `exact`, of at most `vocab_size` (SentencePiece otherwise refuses a sample too small
  for it; the others stop where the sample runs out).
  SentencePiece falls back to bytes and BPE is byte-level, so they encode any text; unigram
  and WordPiece map characters the sample never held to their unknown token."""
  if kind == "sentencepiece":
    import sentencepiece as spm
    # One thread: sentencepiece's multi-threaded training gives different models run to run.
    with open(path, "wb") as model:
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(sample), model_writer=model, vocab_size=vocab_size,
          model_type="unigram", byte_fallback=True, character_coverage=0.9995,
          pad_id=-1, bos_id=-1, eos_id=-1, unk_id=0, num_threads=1,
          max_sentence_length=1 << 16, train_extremely_large_corpus=False, minloglevel=2,
          hard_vocab_limit=exact)
    return
  from tokenizers import Tokenizer as HFTokenizer
  from tokenizers import decoders, models, pre_tokenizers, trainers
  if kind == "bpe":
    tokenizer = HFTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  elif kind == "wordpiece":
    tokenizer = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, show_progress=False,
                                        special_tokens=["[UNK]"])
  else:
    tokenizer = HFTokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, show_progress=False,
                                      special_tokens=["<unk>"], unk_token="<unk>")
  tokenizer.train_from_iterator(sample, trainer)
  tokenizer.save(path)


def _train_in_child(kind, paths, text_field, vocab_size, sample_mb, path, messages) -> None:
  """The child process's work: sample, train, report (('sample', MB) then ('done', None) or
  ('error', message)) through the queue `messages`."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends this process
  try:
    # The subword trainers of `tokenizers` learn pieces that hold line ends (code's indents).
    sample = sample_lines(paths, text_field, sample_mb, keepends=kind != "sentencepiece")
    if not sample:
      raise PrepareError("the inputs hold no text")
    messages.put(("sample", sum(len(line) for line in sample) / 1e6))
    train_vocabulary(kind, sample, vocab_size, path)
    messages.put(("done", None))
  except PrepareError as e:
    messages.put(("error", str(e)))
  except Exception as e:  # noqa: BLE001 - the libraries' errors: a vocabulary they refuse
    messages.put(("error", f"--vocab-size {vocab_size}: {kind} cannot train it on this corpus "
                           f"({str(e).strip()})"))


def _trained(kind: str, paths: list[str], text_field: str, vocab_size: int, sample_mb: float,
             path: str, say: Callable[[str], None]) -> None:
  """Trains the vocabulary in a child process, saying what it does; a signal to this process
  ends the child too."""
  context = multiprocessing.get_context("spawn")
  messages = context.Queue()
  child = context.Process(target=_train_in_child, args=(kind, paths, text_field, vocab_size,
                                                        sample_mb, path, messages), daemon=True)
  say(f"vocabulary: sampling up to {sample_mb:g} MB of text")
  child.start()
  try:
    while True:
      try:
        what, value = messages.get(timeout=1)
      except queue.Empty:
        if not child.is_alive():
          raise PrepareError(f"training the {kind} vocabulary failed: its process ended with "
                             f"exit code {child.exitcode}") from None
        continue
      if what == "sample":
        estimate = _TRAINING_SECONDS_PER_MB[kind] * value
        say(f"vocabulary: training {vocab_size} {kind} pieces on {value:.1f} MB of text "
            f"(about {max(estimate, 1):.0f} s)")
      elif what == "error":
        raise PrepareError(value)
      else:
        return
  finally:
    if child.is_alive():
      child.terminate()
    child.join()


def _tokenizer_in(directory, tokenizer, vocab_size, paths, text_field, sample_mb, say):
  """(TokenizerSpec with its file in `directory`, that file's name or None)."""
  if tokenizer == "bytes":
    if vocab_size not in (None, 256):
      raise PrepareError(f"--vocab-size {vocab_size}: the bytes tokenizer has 256 tokens")
    return TokenizerSpec("bytes"), None
  if tokenizer in TRAINED:
    if vocab_size is None:
      raise PrepareError(f"--tokenizer {tokenizer} needs --vocab-size")
    kind, name = (("sentencepiece", "tokenizer.model") if tokenizer == "sentencepiece"
                  else ("huggingface", "tokenizer.json"))
    path = os.path.join(directory, name)
    _trained(tokenizer, paths, text_field, vocab_size, sample_mb, path, say)
    return TokenizerSpec(kind, path), name
  if not os.path.isfile(tokenizer):
    raise PrepareError(f"--tokenizer {tokenizer!r}: not bytes, {', '.join(TRAINED)} or a file")
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
  """Packs each part's ids into seq_len windows of their own (a part's last window padded)
  and writes each window to its split's file: window j of part u is held out, to eval.bin,
  when (j + u) % held_out_every == held_out_every - 1, else goes to train.bin. So the windows
  of a part do not depend on which other parts are prepared with it."""

  def __init__(self, directory: str, seq_len: int, dtype, held_out_every: int):
    self.seq_len, self.dtype, self.held_out_every = seq_len, dtype, held_out_every
    self.files = {s: open(os.path.join(directory, f"{s}.bin"), "wb") for s in ("train", "eval")}
    self.counts = {"train": 0, "eval": 0}
    self.pending = {}  # part -> its ids not yet a full window
    self.made = {}  # part -> its windows written
    self.text_tokens = 0  # ids other than separators

  def add(self, part: int, ids: np.ndarray) -> None:
    self.text_tokens += int(np.count_nonzero(ids != SEPARATOR_ID))
    flat = np.concatenate([self.pending.get(part, np.zeros(0, np.int32)), ids])
    full = len(flat) // self.seq_len * self.seq_len
    self._write(part, flat[:full].reshape(-1, self.seq_len))
    self.pending[part] = flat[full:]

  def close(self) -> None:
    for part, ids in sorted(self.pending.items()):
      if len(ids):
        last = np.full(self.seq_len, PAD_ID, np.int32)
        last[:len(ids)] = ids
        self._write(part, last[None])
    for f in self.files.values():
      f.close()

  def _write(self, part: int, windows: np.ndarray) -> None:
    start = self.made.get(part, 0)
    self.made[part] = start + len(windows)
    every = self.held_out_every
    held_out = (np.arange(start, start + len(windows)) + part) % every == every - 1
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
            workers: int | None = None, sample_mb: float = 100.0, progress: bool = True,
            include: list[str] | None = None, shard: int = 0, num_shards: int = 1,
            part_mb: float = 256.0, vocab_only: bool = False) -> dict:
  """Writes the prepared dataset to `out` (see the module docstring); returns its dataset.json
  (with `vocab_only`, writes only the tokenizer's file; returns {'tokenizer': its path})."""
  say = (lambda message: print(message, file=sys.stderr)) if progress else (lambda _: None)
  workers = default_workers(tokenizer) if workers is None else workers
  if seq_len < 2:
    raise PrepareError(f"--seq-len must be >= 2, got {seq_len}")
  if not 0 < eval_fraction < 1:
    raise PrepareError(f"--eval-fraction must lie in (0, 1), got {eval_fraction}")
  if workers < 1:
    raise PrepareError(f"--workers must be >= 1, got {workers}")
  if not 0 <= shard < num_shards:
    raise PrepareError(f"--shard {shard} --num-shards {num_shards}: expected 0 <= shard < "
                       f"num-shards")
  if num_shards > 1 and tokenizer in TRAINED:
    raise PrepareError(f"--num-shards {num_shards} with --tokenizer {tokenizer}: every shard "
                       f"needs the same tokenizer; train it once with --vocab-only and pass "
                       f"its file as --tokenizer")
  if os.path.exists(out):
    raise PrepareError(f"--out {out!r} already exists; remove it or choose another directory")
  paths = expand(patterns, include)
  if vocab_only:
    if tokenizer not in TRAINED:
      raise PrepareError(f"--vocab-only trains a vocabulary: --tokenizer {tokenizer!r}, "
                         f"expected one of {', '.join(TRAINED)}")
    with temporary_directory(out) as tmp:
      spec, name = _tokenizer_in(tmp, tokenizer, vocab_size, paths, text_field, sample_mb, say)
    return {"tokenizer": os.path.join(out, name)}
  sources = plan(paths, max(1, int(part_mb * 1e6)))
  num_parts = max(s.first + s.parts for s in sources)
  if num_parts < num_shards:
    raise PrepareError(f"--num-shards {num_shards}: the inputs make {num_parts} part(s) of "
                       f"--part-mb {part_mb:g}; use fewer shards or smaller parts")
  sources = shard_of(sources, shard, num_shards)
  held_out_every = round(1 / eval_fraction)
  with temporary_directory(out) as tmp:
    spec, tokenizer_file = _tokenizer_in(tmp, tokenizer, vocab_size, paths, text_field,
                                         sample_mb, say)
    tokenizer_vocab = spec.load().size
    vocab = FIRST_TOKEN_ID + tokenizer_vocab
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
    windows = _WindowWriter(tmp, seq_len, dtype, held_out_every)
    # The bar counts text: the stored size is its total only for plain files read whole.
    plain = all(s.compression is None and s.format != "parquet" and len(s.keep) == s.parts
                for s in sources)
    total = sum(s.size() for s in sources) if plain else None
    desc = f"encoding ({workers} worker{'s' if workers > 1 else ''})"
    with (tqdm(total=total, unit="B", unit_scale=True, desc=desc,
               disable=not progress) as bar,
          _encoder(spec, workers) as encode):
      chunks = _chunks(_documents(sources, text_field))
      for (_, texts, _), part_ids in _encoded(chunks, encode, workers * _UNITS_IN_FLIGHT):
        for part, ids in part_ids:
          windows.add(part, ids)
        bar.update(sum(len(t.encode("utf-8")) for t in texts))
    windows.close()
    if not windows.text_tokens:
      raise PrepareError("the inputs hold no text")
    if not windows.counts["eval"] and num_shards == 1:
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
        "shard": {"index": shard, "count": num_shards, "parts": num_parts,
                  "part_bytes": max(1, int(part_mb * 1e6))},
        "inputs": [s.record() for s in sources],
    }
    with open(os.path.join(tmp, "dataset.json"), "w") as f:
      json.dump(meta, f, indent=1)
  return meta


class _Terminated(Exception):
  """SIGTERM, raised where the program is, so that what it holds is cleaned up."""


def _terminate(signum, frame):
  raise _Terminated


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m train.prepare", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--input", action="append", required=True,
                      help="a file, a directory or a glob ('**' crosses directories); "
                           "repeatable")
  parser.add_argument("--include", action="append", default=None,
                      help="keep only files with a matching name (e.g. '*.c') of the "
                           "directories and globs; repeatable")
  parser.add_argument("--out", required=True, help="the directory to create")
  parser.add_argument("--tokenizer", default="bytes",
                      help=f"bytes, {', '.join(TRAINED)}, or a .model / tokenizer.json file")
  parser.add_argument("--vocab-size", type=int, default=None)
  parser.add_argument("--vocab-only", action="store_true",
                      help="only train the tokenizer, into --out, for sharded prepares")
  parser.add_argument("--seq-len", type=int, default=512)
  parser.add_argument("--eval-fraction", type=float, default=0.01)
  parser.add_argument("--text-field", default="text",
                      help="the JSON-lines field or Parquet column with the text")
  parser.add_argument("--workers", type=int, default=None,
                      help="encoding processes; by default 1 for bytes and sentencepiece, "
                           "the CPU count for tokenizers' models")
  parser.add_argument("--sample-mb", type=float, default=100.0,
                      help="MB of text the vocabulary is trained on")
  parser.add_argument("--shard", type=int, default=0, help="which part of --num-shards to prepare")
  parser.add_argument("--num-shards", type=int, default=1)
  parser.add_argument("--part-mb", type=float, default=256.0,
                      help="MB (as stored) of input per part: the unit shards are made of")
  args = parser.parse_args(argv)
  signal.signal(signal.SIGTERM, _terminate)
  try:
    meta = prepare(args.input, args.out, args.tokenizer, args.vocab_size, args.seq_len,
                   args.eval_fraction, args.text_field, args.workers, args.sample_mb,
                   include=args.include, shard=args.shard, num_shards=args.num_shards,
                   part_mb=args.part_mb, vocab_only=args.vocab_only)
  except PrepareError as e:
    print(f"prepare: error: {e}", file=sys.stderr)
    return 2
  except (KeyboardInterrupt, _Terminated) as e:
    print(f"prepare: interrupted; {args.out} was not written", file=sys.stderr)
    return 130 if isinstance(e, KeyboardInterrupt) else 143
  if args.vocab_only:
    print(f"{meta['tokenizer']}: pass it as --tokenizer to every shard")
    return 0
  shard = f" (shard {args.shard} of {args.num_shards})" if args.num_shards > 1 else ""
  print(f"{args.out}{shard}: {meta['windows']['train']} training and "
        f"{meta['windows']['eval']} held-out windows of {meta['seq_len']} tokens, vocabulary "
        f"{meta['vocab_size']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
