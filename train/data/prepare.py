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
`--input builtin:pydoc_data.topics` is the built-in corpus, a document per topic of CPython
3.11's pydoc_data.topics (~460 KB of English, shipped in train/builtin: the same text on
every Python).

Tokenizers (`--tokenizer`): `bytes` (a UTF-8 byte per token); a vocabulary of `--vocab-size`
trained on a sample of the corpus, in a process of its own: `sentencepiece` (unigram, byte
fallback) or, with the `tokenizers` package, `bpe` (byte-level), `unigram` or `wordpiece`;
or the path of a SentencePiece `.model` or a Hugging Face `tokenizer.json`. `--vocab-only`
writes just the trained tokenizer, for the shards to share.

Token ids (`train.data.tokens`): 0 pad, 1 mask, 2 the separator between documents, 3 unused, then
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
import contextlib
import dataclasses
import itertools
import json
import multiprocessing
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator

import numpy as np
from tqdm import tqdm

from train.cli import HelpFormatter
from train.data.sources import BUILTIN, PrepareError, Source, documents, expand, plan, shard_of
from train.data.tokens import (FIRST_TOKEN_ID, PAD_ID, PROJECT_IDS, SEPARATOR_ID, UNKNOWN_WARNING,
                               SpecialIds, Tokenizer, TokenizerSpec, hf_special_ids,
                               hf_tokenizer_file)
from train.data.vocabulary import TRAINED, pieces, tokenizer_in
from train.files import temporary_directory

__all__ = ["BUILTIN", "FORMAT", "PrepareError", "Source", "expand", "prepare", "main"]

FORMAT = "flax-encoder windows 1"
_CHUNK_CHARS = 1 << 20  # characters of text per unit of work
_UNITS_IN_FLIGHT = 4  # per worker: bounds the memory held by the work queue


# ---------------------------------------------------------------------------------------------
# Reading (train.data.sources): the documents of the inputs, grouped into units of work.


def _pieces(documents: Iterator[tuple[int, str, bool]]) -> Iterator[tuple[int, str, bool]]:
  """The documents with a text of more than _CHUNK_CHARS characters (a JSON line, a Parquet
  row) in pieces of at most that many, as a plain file is read in blocks: the tokenizers hold
  130 to 200 bytes per character they encode at once."""
  for part, text, end in documents:
    if len(text) <= _CHUNK_CHARS:
      yield part, text, end
      continue
    *before, last = pieces(text, _CHUNK_CHARS)
    for piece in before:
      yield part, piece, False
    yield part, last, end


def _chunks(documents: Iterator[tuple[int, str, bool]]) -> Iterator[tuple[list, ...]]:
  """Documents grouped into units of work of about _CHUNK_CHARS characters: (parts, texts,
  ends, begins): each text's part, and whether it ends and begins its document."""
  parts, texts, ends, begins, size = [], [], [], [], 0
  inside = set()  # the parts whose last text did not end its document
  for part, text, end in _pieces(documents):
    parts.append(part)
    texts.append(text)
    ends.append(end)
    begins.append(part not in inside)
    (inside.discard if end else inside.add)(part)
    size += len(text)
    if size >= _CHUNK_CHARS:
      yield parts, texts, ends, begins
      parts, texts, ends, begins, size = [], [], [], [], 0
  if texts:
    yield parts, texts, ends, begins


# ---------------------------------------------------------------------------------------------
# Tokenizing, in this process or in a pool of workers.


@dataclasses.dataclass(frozen=True)
class Framing:
  """How documents become ids: the tokenizer's ids + `offset`, `start` before each document and
  `end` after it, `pad` after a part's last one. This project's: + 4, nothing before and the
  separator after; a Hugging Face checkpoint's own: + 0 and its template ([CLS] … [SEP])."""

  offset: int = FIRST_TOKEN_ID
  start: tuple[int, ...] = ()
  end: tuple[int, ...] = (SEPARATOR_ID,)
  pad: int = PAD_ID
  specials: SpecialIds = PROJECT_IDS


def chunk_ids(tokenizer: Tokenizer, chunk: tuple[list, ...],
              framing: Framing = Framing()) -> list[tuple[int, np.ndarray]]:
  """(part, ids) of a chunk's texts, framed (`framing.start` before each that begins a
  document, `framing.end` after each that ends one), one array per part in the order the
  parts come."""
  parts, texts, ends, begins = chunk
  start, end = (np.array(ids, np.int32) for ids in (framing.start, framing.end))
  pieces = {}
  for part, ids, ending, beginning in zip(parts, tokenizer.encode_batch(texts), ends, begins):
    pieces.setdefault(part, []).extend(([start] if beginning else []) + [ids] +
                                       ([end] if ending else []))
  return [(part, np.concatenate(p)) for part, p in pieces.items()]


# A pool worker's tokenizer, loaded once when the worker starts (Pool's initializer is the only
# way to hand each worker process a state of its own).
_worker: tuple[Tokenizer, Framing] | None = None


def _start_worker(spec: TokenizerSpec, framing: Framing) -> None:
  global _worker
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
  _worker = spec.load(framing.offset), framing


def _worker_chunk_ids(chunk):
  return chunk_ids(_worker[0], chunk, _worker[1])


@contextlib.contextmanager
def _encoder(spec: TokenizerSpec, workers: int, framing: Framing):
  """Yields a function: a list of chunks -> their ids, in order, computed by `workers`
  processes (one: here, without a pool)."""
  if workers == 1:
    tokenizer = spec.load(framing.offset)
    yield lambda chunks: [chunk_ids(tokenizer, c, framing) for c in chunks]
    return
  pool = multiprocessing.get_context("spawn").Pool(workers, _start_worker, (spec, framing))
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


class _Unknown:
  """How many of the ids are the tokenizer's unknown token (none for bytes, or a byte-level
  BPE) and the first text that had one: text the tokenizer cannot read."""

  def __init__(self, tokenizer: Tokenizer):
    self.tokenizer, self.id, self.count, self.example = tokenizer, tokenizer.unk_id, 0, None

  def add(self, texts: list[str], part_ids: list[tuple[int, np.ndarray]]) -> None:
    if self.id is None:
      return
    found = sum(int(np.count_nonzero(ids == self.id)) for _, ids in part_ids)
    self.count += found
    if found and self.example is None:  # once: a unit of work is about 1M characters
      self.example = next((t for t in texts if self.id in self.tokenizer.encode_batch([t])[0]),
                          texts[0])

  def check(self, tokens: int, name: str) -> None:
    """PrepareError where all `tokens` of text are unknown; a warning where more than
    UNKNOWN_WARNING of them are."""
    if not self.count:
      return
    token = self.tokenizer.piece(self.id - self.tokenizer.offset)
    if self.count >= tokens:
      raise PrepareError(f"--tokenizer {name}: every one of the {tokens} tokens of the inputs "
                         f"is its unknown token {token!r}, expected a tokenizer that reads them")
    if self.count > UNKNOWN_WARNING * tokens:
      print(f"prepare: warning: --tokenizer {name}: {self.count / tokens:.0%} of the tokens of "
            f"the inputs are its unknown token {token!r} (in {self.example[:60]!r}…): the model "
            f"will not tell apart what they stand for", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# Packing into windows.


def held_out_every(eval_fraction: float) -> int:
  """n: one window in n is held out, for a held-out fraction `eval_fraction`."""
  return round(1 / eval_fraction)


class _WindowWriter:
  """Packs each part's ids into seq_len windows of their own (a part's last window padded)
  and writes each window to its split's file: window j of part u is held out, to eval.bin,
  when (j + u) % held_out_every == held_out_every - 1, else goes to train.bin. So the windows
  of a part do not depend on which other parts are prepared with it."""

  def __init__(self, directory: str, seq_len: int, dtype, held_out_every: int,
               framing: Framing = Framing()):
    self.seq_len, self.dtype, self.held_out_every = seq_len, dtype, held_out_every
    self.framing = framing
    self.files = {s: open(os.path.join(directory, f"{s}.bin"), "wb") for s in ("train", "eval")}
    self.counts = {"train": 0, "eval": 0}
    self.pending = {}  # part -> its ids not yet a full window
    self.made = {}  # part -> its windows written
    self.text_tokens = 0  # ids other than the framing's

  def add(self, part: int, ids: np.ndarray) -> None:
    framing = self.framing
    self.text_tokens += len(ids) - int(np.count_nonzero(np.isin(ids, framing.start +
                                                                framing.end)))
    flat = np.concatenate([self.pending.get(part, np.zeros(0, np.int32)), ids])
    full = len(flat) // self.seq_len * self.seq_len
    self._write(part, flat[:full].reshape(-1, self.seq_len))
    self.pending[part] = flat[full:]

  def close(self) -> None:
    """Writes each part's last, padded window and closes the files."""
    for part, ids in sorted(self.pending.items()):
      if len(ids):
        last = np.full(self.seq_len, self.framing.pad, np.int32)
        last[:len(ids)] = ids
        self._write(part, last[None])
    self.pending = {}
    for f in self.files.values():
      f.close()

  def __enter__(self):
    return self

  def __exit__(self, *error) -> None:
    for f in self.files.values():  # after an error, unwritten data is dropped with the files
      with contextlib.suppress(OSError):
        f.close()

  def _write(self, part: int, windows: np.ndarray) -> None:
    start = self.made.get(part, 0)
    self.made[part] = start + len(windows)
    every = self.held_out_every
    held_out = (np.arange(start, start + len(windows)) + part) % every == every - 1
    for split, rows in (("train", windows[~held_out]), ("eval", windows[held_out])):
      self.files[split].write(rows.astype(self.dtype).tobytes())
      self.counts[split] += len(rows)


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
  if vocab_size is not None and vocab_size < 1:
    raise PrepareError(f"--vocab-size {vocab_size}: expected a number of tokens, 1 or more")
  if not sample_mb > 0:
    raise PrepareError(f"--sample-mb {sample_mb:g}: expected MB of text to train the "
                       f"vocabulary on, more than 0")
  if not part_mb > 0:
    raise PrepareError(f"--part-mb {part_mb:g}: expected MB of input per part, more than 0")
  if num_shards < 1:
    raise PrepareError(f"--num-shards {num_shards}: expected 1 or more")
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
  try:
    return _prepare(paths, out, tokenizer, vocab_size, seq_len, eval_fraction, text_field,
                    workers, sample_mb, progress, shard, num_shards, part_mb, vocab_only, say)
  except OSError as e:  # a full disk, say: what was written so far is gone with its directory
    if e.filename is not None:
      raise PrepareError(f"{e.filename}: {e.strerror or e}") from None
    raise PrepareError(f"--out {out}: cannot write ({e.strerror or e}); nothing was kept") \
        from None


def _prepare(paths, out, tokenizer, vocab_size, seq_len, eval_fraction, text_field, workers,
             sample_mb, progress, shard, num_shards, part_mb, vocab_only, say) -> dict:
  if vocab_only:
    if tokenizer not in TRAINED:
      raise PrepareError(f"--vocab-only trains a vocabulary: --tokenizer {tokenizer!r}, "
                         f"expected one of {', '.join(TRAINED)}")
    with temporary_directory(out) as tmp:
      spec, name = tokenizer_in(tmp, tokenizer, vocab_size, paths, text_field, sample_mb, say)
    return {"tokenizer": os.path.join(out, name)}
  sources = plan(paths, max(1, int(part_mb * 1e6)))
  num_parts = max(s.first + s.parts for s in sources)
  if num_parts < num_shards:
    raise PrepareError(f"--num-shards {num_shards}: the inputs make {num_parts} part(s) of "
                       f"--part-mb {part_mb:g}; use fewer shards or smaller parts")
  sources = shard_of(sources, shard, num_shards)
  every = held_out_every(eval_fraction)
  with temporary_directory(out) as tmp, contextlib.ExitStack() as stack:
    framing = Framing()
    if os.path.isdir(tokenizer):  # a Hugging Face model's: its own ids, template and tokenizer
      framing, tokenizer = _hf_framing(tokenizer, stack.enter_context(
          tempfile.TemporaryDirectory(prefix="tokenizer-")))
    spec, tokenizer_file = tokenizer_in(tmp, tokenizer, vocab_size, paths, text_field,
                                         sample_mb, say)
    loaded = spec.load(framing.offset)
    tokenizer_vocab, vocab = loaded.size, loaded.vocab_size
    specials = framing.specials
    bad = next((i for i in (*framing.start, *framing.end, specials.pad, specials.mask,
                            specials.separator) if i >= vocab), None)
    if bad is not None:  # the model, with as many ids, would train on NaN
      raise PrepareError(f"--tokenizer {tokenizer}: special id {bad}, expected ids below its "
                         f"vocabulary size {vocab}")
    unknown = _Unknown(loaded)
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
    windows = stack.enter_context(_WindowWriter(tmp, seq_len, dtype, every, framing))
    # The bar counts text: the stored size is its total only for plain files read whole.
    plain = all(s.compression is None and s.format != "parquet" and len(s.keep) == s.parts
                for s in sources)
    total = sum(s.size() for s in sources) if plain else None
    desc = f"encoding ({workers} worker{'s' if workers > 1 else ''})"
    with (tqdm(total=total, unit="B", unit_scale=True, desc=desc,
               disable=not progress) as bar,
          _encoder(spec, workers, framing) as encode):
      chunks = _chunks(documents(sources, text_field))
      for (_, texts, *_), part_ids in _encoded(chunks, encode, workers * _UNITS_IN_FLIGHT):
        for part, ids in part_ids:
          windows.add(part, ids)
        unknown.add(texts, part_ids)
        bar.update(sum(len(t.encode("utf-8")) for t in texts))
    windows.close()
    if not windows.text_tokens:
      raise PrepareError("the inputs hold no text")
    unknown.check(windows.text_tokens, tokenizer)
    if not windows.counts["eval"] and num_shards == 1:
      raise PrepareError(f"{windows.counts['train']} window(s) of {seq_len} tokens are too few "
                         f"to hold out one in {every} (--eval-fraction "
                         f"{eval_fraction})")
    meta = {
        "format": FORMAT,
        "tokenizer": {"kind": spec.kind, "file": tokenizer_file, "vocab_size": tokenizer_vocab},
        "vocab_size": vocab,
        "special_ids": framing.specials.to_meta(),
        "first_token_id": framing.specials.first_token,
        "seq_len": seq_len,
        "dtype": np.dtype(dtype).name,
        "windows": windows.counts,
        "held_out_every": every,
        "tokens": windows.text_tokens,
        "shard": {"index": shard, "count": num_shards, "parts": num_parts,
                  "part_bytes": max(1, int(part_mb * 1e6))},
        "inputs": [s.record() for s in sources],
    }
    with open(os.path.join(tmp, "dataset.json"), "w") as f:
      json.dump(meta, f, indent=1)
  return meta


def _hf_framing(directory: str, scratch: str) -> tuple[Framing, str]:
  """A Hugging Face model directory's (`--tokenizer DIR`) own ids and template, and its
  tokenizer.json (built in `scratch` where it has only vocabulary files)."""
  try:
    file, _ = hf_tokenizer_file(directory, scratch)
    ids, template = hf_special_ids(directory, file)
  except ValueError as e:
    raise PrepareError(f"--tokenizer {e}") from None
  return Framing(0, template.start, template.end, ids.pad, ids), file


class _Terminated(Exception):
  """SIGTERM, raised where the program is, so that what it holds is cleaned up."""


def _terminate(signum, frame):
  raise _Terminated


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m train.prepare", description=__doc__,
                                   formatter_class=HelpFormatter)
  parser.add_argument("--input", action="append", required=True,
                      help="a file, a directory or a glob ('**' crosses directories); "
                           "repeatable")
  parser.add_argument("--include", action="append", default=None,
                      help="keep only files with a matching name (e.g. '*.c') of the "
                           "directories and globs; repeatable")
  parser.add_argument("--out", required=True, help="the directory to create")
  parser.add_argument("--tokenizer", default="bytes",
                      help=f"bytes, {', '.join(TRAINED)}, or a .model / tokenizer.json file")
  parser.add_argument("--vocab-size", type=int, default=None,
                      help="the entries of a vocabulary trained on the corpus")
  parser.add_argument("--vocab-only", action="store_true",
                      help="only train the tokenizer, into --out, for sharded prepares")
  parser.add_argument("--seq-len", type=int, default=512, help="ids a training window holds")
  parser.add_argument("--eval-fraction", type=float, default=0.01,
                      help="the share of the windows held out for evaluation")
  parser.add_argument("--text-field", default="text",
                      help="the JSON-lines field or Parquet column with the text")
  parser.add_argument("--workers", type=int, default=None,
                      help="encoding processes; by default 1 for bytes and sentencepiece, "
                           "the CPU count for tokenizers' models")
  parser.add_argument("--sample-mb", type=float, default=100.0,
                      help="MB of text the vocabulary is trained on")
  parser.add_argument("--shard", type=int, default=0, help="which part of --num-shards to prepare")
  parser.add_argument("--num-shards", type=int, default=1,
                      help="the shards the parts are prepared in, by separate commands")
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
