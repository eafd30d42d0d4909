r"""The inputs of a prepare, as they are stored: files, directories, globs, compressed or not,
text, JSON lines or Parquet; each a `Source` that reads its documents while hashing its bytes
as stored, so that `dataset.json` records what was read.

`train.prepare` packs them into windows; `train.data.examples` and `train.predict` read labelled
records from them, `train.embed` texts; `train.data.dataset` checks that a run's inputs are still
what it was trained on. A record is parsed in one place (`record_of_line`, `text_of`), so every
command refuses a bad line in the same words.
"""

from __future__ import annotations

import bz2
import codecs
import contextlib
import fnmatch
import functools
import glob
import gzip
import hashlib
import io
import json
import lzma
import os
from collections.abc import Iterator

from train.files import sha256_file

BUILTIN = "builtin:pydoc_data.topics"
_READ_BYTES = 1 << 20  # bytes read at once
_PARQUET_ROWS = 1024  # rows read at a time


class PrepareError(Exception):
  """Bad input: reported as one line, without a traceback."""


def expand(patterns: list[str], include: list[str] | None = None) -> list[str]:
  """The files `patterns` name, in order, each real file once: a file as given; a directory,
  every file below it (in sorted order, names starting with '.' left out); a glob (`**`
  crossing directories), what it matches, a matched directory again every file below it.
  Symbolic links to files are read; links to directories are not followed below a directory
  or by `**`, so a link loop is never gone round. Files found below a directory or by a glob
  are kept only if their name matches one of `include` (fnmatch patterns such as '*.c'),
  where given."""
  paths = []
  for pattern in patterns:
    if pattern == BUILTIN:
      paths.append(pattern)
      continue
    found = _below(pattern) if os.path.isdir(pattern) else None
    if found is None and glob.has_magic(pattern):
      try:
        found = [f for match in _glob(pattern)
                 for f in (_below(match) if os.path.isdir(match) else [match])]
      except OSError as e:  # a directory the glob cannot list
        raise PrepareError(f"{e.filename}: cannot read it ({e.strerror})") from None
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
  for path in paths:
    if path != BUILTIN and not os.path.exists(path):
      raise PrepareError(f"--input: {path} is a symbolic link to {os.readlink(path)!r}, "
                         "which does not exist")
  real = {}  # each file once, however it was reached
  for path in paths:
    real.setdefault(path if path == BUILTIN else os.path.realpath(path), path)
  return list(real.values())


def _below(directory: str) -> list[str]:
  def unreadable(error: OSError):  # os.walk would pass over it: the corpus would lack it
    raise PrepareError(f"{error.filename}: cannot read it ({error.strerror})")

  files = []
  for root, dirs, names in os.walk(directory, onerror=unreadable):
    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    files.extend(os.path.join(root, n) for n in sorted(names) if not n.startswith("."))
  return files


def _glob(pattern: str) -> list[str]:
  """What `pattern` matches, sorted. Without `**`, as `glob.glob`; with it, matched a path
  component at a time without following links to directories (`glob.glob` follows them, and
  goes round a link loop until paths grow too long: exponentially often with two links)."""
  if "**" not in pattern:
    return sorted(glob.glob(pattern))
  parts = pattern.rstrip(os.sep).split(os.sep)
  fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part))
  root = os.sep.join(parts[:fixed]) or (os.sep if fixed else os.curdir)
  found = _matching(root, parts[fixed:]) if os.path.isdir(root) else []
  if not fixed:
    found = [os.path.relpath(f) for f in found]
  return sorted(dict.fromkeys(found))


def _matching(directory: str, parts: list[str]) -> list[str]:
  """The paths below `directory` that match the pattern components `parts`."""
  if not parts or parts == ["**"]:
    return [directory]
  head, rest = parts[0], parts[1:]
  entries = sorted((e for e in os.scandir(directory)
                    if not e.name.startswith(".") or head.startswith(".")), key=lambda e: e.name)
  if head == "**":  # no directory, or any one and then `**` again
    return _matching(directory, rest) + [
        f for e in entries if e.is_dir(follow_symlinks=False) for f in _matching(e.path, parts)]
  return [f for e in entries if fnmatch.fnmatchcase(e.name, head)
          and (not rest or e.is_dir(follow_symlinks=False)) for f in _matching(e.path, rest)]


_BUILTIN_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "builtin",
                             "pydoc_topics.json.xz")


@functools.cache
def builtin_topics() -> tuple[str, ...]:
  """The built-in corpus's documents: the topics of CPython 3.11's pydoc_data.topics, in
  sorted order of their names, from the snapshot in train/builtin (each Python ships other
  text, so reading the running one's would make the default run depend on the interpreter)."""
  with lzma.open(_BUILTIN_FILE, "rt", encoding="utf-8") as f:
    topics = json.load(f)
  return tuple(topics[name] for name in sorted(topics))


# A compressed file's suffix -> a buffered binary stream of what the raw stream holds.
COMPRESSIONS = {
    ".gz": lambda raw: gzip.GzipFile(fileobj=raw),
    ".bz2": bz2.BZ2File,
    ".xz": lzma.LZMAFile,
    ".zst": lambda raw: io.BufferedReader(_ZstdFrames(raw), _READ_BYTES),
}

# What a file holds, by the suffix before its compression's; any other name is text.
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


def stored_format(path: str) -> tuple[str, str | None]:
  """(what the file holds: 'text', 'jsonl' or 'parquet'; its compression or None), from its
  name: a COMPRESSIONS ending, before it one of FORMATS."""
  name = path.lower()
  compression = next((c for c in COMPRESSIONS if name.endswith(c)), None)
  if compression:
    name = name[:-len(compression)]
  return next((f for suffix, f in FORMATS.items() if name.endswith(suffix)), "text"), compression


@contextlib.contextmanager
def decompressed(path: str) -> Iterator[io.BufferedIOBase]:
  """The bytes of the file `path`, decompressed where its name ends in one of COMPRESSIONS
  (read through, never entered in the middle), else the file itself, which can seek."""
  compression = stored_format(path)[1]
  with open(path, "rb") as stored:
    if compression is None:
      yield stored
      return
    with _decompressing(stored, compression) as f:
      yield f


def record_of_line(line: str, where: str) -> dict:
  """The JSON object a line of a JSON-lines file holds; PrepareError "`where`: ..." (the file
  and the line) where it holds none."""
  try:
    record = json.loads(line)
  except ValueError as e:
    raise PrepareError(f"{where}: not valid JSON ({e})") from None
  except RecursionError:  # json's decoder recurses once per level of nesting
    raise PrepareError(f"{where}: JSON nested too deeply to read, expected a JSON object of a "
                       f"few levels") from None
  if not isinstance(record, dict):
    raise PrepareError(f"{where}: not a JSON object")
  return record


def text_of(record: dict, where: str, text_field: str,
            id_field: str | None = None) -> tuple[object, str]:
  """(the id under `id_field`, None where absent or null; the text under `text_field`) of a
  record or a Parquet row; PrepareError "`where`: ..." where there is no text, or it is not a
  string."""
  if text_field not in record:
    raise PrepareError(f"{where}: no {text_field!r} field (--text-field), expected the text "
                       f"there")
  text = record[text_field]
  if not isinstance(text, str):
    raise PrepareError(f"{where}: {text_field!r} (--text-field) is {type(text).__name__}, "
                       f"expected a string")
  return (record.get(id_field) if id_field is not None else None), text


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
  if compression is None:
    return io.BufferedReader(raw, _READ_BYTES)
  return COMPRESSIONS[compression](raw)


class _ZstdFrames(io.RawIOBase):
  """The frames of a .zst stream decompressed one after another. A stream that ends inside a
  frame is an EOFError, as gzip, bz2 and lzma make it (zstandard's `stream_reader` ends
  quietly there, which would keep a truncated file's first part as if it were all of it)."""

  def __init__(self, raw):
    import zstandard
    self._raw, self._new_frame = raw, zstandard.ZstdDecompressor().decompressobj
    self._frame, self._in_frame = self._new_frame(), False
    self._out, self._at = b"", 0  # decompressed bytes not yet read, from offset _at

  def readable(self) -> bool:
    return True

  def readinto(self, buffer) -> int:
    while self._at == len(self._out):
      compressed = self._raw.read(_READ_BYTES)
      if not compressed:
        if self._in_frame:
          raise EOFError("the file ends inside a compressed frame: truncated")
        return 0
      self._out, self._at = self._decompress(compressed), 0
    n = min(len(buffer), len(self._out) - self._at)
    buffer[:n] = self._out[self._at:self._at + n]
    self._at += n
    return n

  def _decompress(self, compressed: bytes) -> bytes:
    out = []
    while compressed:
      out.append(self._frame.decompress(compressed))
      self._in_frame = not self._frame.eof
      compressed = b"" if self._in_frame else self._frame.unused_data
      if not self._in_frame:
        self._frame = self._new_frame()
    return b"".join(out)


class Source:
  """One input file. Reads its documents, hashing the file's bytes as stored; `record()`
  describes it after. A file too big for one part of the corpus is read as `parts` parts:
  record r (line, row, block of text) is in part r % parts, and only the parts in `keep` are
  read (the ones this shard prepares)."""

  def __init__(self, path: str, first: int = 0, parts: int = 1):
    self.path, self.first, self.parts = path, first, parts  # its parts: first ... first+parts-1
    self.keep = set(range(parts))
    self.format, self.compression = stored_format(path) if path != BUILTIN else ("text", None)
    self._digest, self._sha256 = hashlib.sha256(), None

  def size(self) -> int:
    return _stored_size(self.path)

  def record(self) -> dict:
    """{'path', 'bytes', 'sha256'}: what dataset.json records of it, once it has been read."""
    return {"path": self.path, "bytes": self.size(),
            "sha256": self._sha256 or self._digest.hexdigest()}

  def differs_from(self, record: dict) -> str | None:
    """How this input differs from what `record` describes (the size first, then the SHA-256
    when the size matches), or None."""
    if self.path != BUILTIN and not os.path.isfile(self.path):
      return "it is gone"
    if self.size() != record["bytes"]:
      return f"{record['bytes']} bytes then, {self.size()} now"
    same = _stored_sha256(self.path) == record["sha256"]
    return None if same else "same size, other SHA-256"

  def documents(self, text_field: str) -> Iterator[tuple[int, str, bool]]:
    """(part, text, whether it ends a document), in file order, of the parts kept."""
    if self.path == BUILTIN:
      for text in builtin_topics():
        self._digest.update(text.encode("utf-8"))
        yield self.first, text, True
    elif self.format == "parquet":
      for part, (number, row) in self._parts(self._parquet_rows(text_field)):
        yield part, text_of(row, f"{self.path}: row {number}", text_field)[1], True
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
      if line.strip():
        yield number, record_of_line(line, f"{self.path}:{number}")

  def count(self) -> int:
    """How many records `records()` yields (a progress bar's total): the non-blank lines, read
    without parsing them, or the rows a Parquet file's metadata counts."""
    if self.format == "parquet":
      with self._parquet() as table:
        return table.metadata.num_rows
    with decompressed(self.path) as f:
      return sum(1 for line in f if line.strip())

  def _parts(self, records: Iterator) -> Iterator[tuple[int, object]]:
    """(part, record) of the records in the parts kept."""
    for r, record in enumerate(records):
      if r % self.parts in self.keep:
        yield self.first + r % self.parts, record

  @contextlib.contextmanager
  def _stream(self):
    """The file's bytes, decompressed; all of the file as stored is hashed once it is read."""
    self._digest, self._sha256 = hashlib.sha256(), None
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
      while raw.read(_READ_BYTES):  # what follows the compressed stream, if anything
        pass

  def lines(self) -> Iterator[tuple[int, str]]:
    """(line number, text with its line end) of each line of a UTF-8 text file, blank ones
    too: one text a line, as `train.embed` reads a .txt."""
    return self._lines()

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
    """The text of a UTF-8 file in blocks of about _READ_BYTES."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with self._stream() as f:
      while True:
        block = f.read(_READ_BYTES)
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
    with decompressed(self.path) as f:
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
    self._sha256 = _stored_sha256(self.path)  # Parquet is read by pyarrow, not streamed here


def _stored_size(path: str) -> int:
  if path == BUILTIN:
    return sum(len(t.encode("utf-8")) for t in builtin_topics())
  return os.path.getsize(path)


def _stored_sha256(path: str) -> str:
  """The SHA-256 of a file as stored, or of the built-in corpus's texts."""
  if path != BUILTIN:
    return sha256_file(path)
  digest = hashlib.sha256()
  for text in builtin_topics():
    digest.update(text.encode("utf-8"))
  return digest.hexdigest()


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


def documents(sources: list[Source], text_field: str) -> Iterator[tuple[int, str, bool]]:
  """(part, text, ends a document) of each source's documents, in order."""
  for source in sources:
    yield from source.documents(text_field)
