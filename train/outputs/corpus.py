r"""`python -m train.embed --out DIR/`: a corpus embedded in parts, on every device of every
process, resumable (the folder's format and its reader: flax_encoder.corpus).

The input is cut into parts of --part-mb MiB: part k holds the lines that start in bytes
[k * B, (k + 1) * B) (a Parquet file: runs of its row groups of about B bytes). Process p of n
embeds the parts k with k % n == p, each over all of its devices, reading only those bytes of
the input (a compressed input cannot be entered in the middle: each process reads it through,
embedding only its parts). A part is written whole (its .npy, then its .json) or not at all, so
the same command after kill -9, preemption or Ctrl-C embeds only the parts not yet written; the
folder then holds what one uninterrupted run writes, bit for bit. Process 0 writes the
manifest when every process is done.

A run's parts carry a key of what it embeds (the model's fingerprint, the input's size and
fingerprint, the fields, prompt, dtype and part size): a folder holding another run's parts is
refused in one line rather than mixed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Iterator

import numpy as np

from flax_encoder import corpus, quantization
from train.data import examples, sources
from train.errors import RunError
from train.files import remove_left_by_killed, sha256_file, written_whole
from train.outputs.nonfinite import NonFinite

PART_MB = 16  # MiB of input a part, by default
# The sizes a part may be, in MiB: from 256 bytes (below, a line or less a part makes thousands
# of files of a small input) to 1 TiB (a part is embedded and written whole).
PART_MB_RANGE = (256 / (1 << 20), 1 << 20)
_CHUNK = 1024  # texts embedded between writes (the progress bar moves with each call)
_SAMPLE = 1 << 20  # bytes of the input's head and tail its fingerprint reads
_PROBE = ("The quick brown fox, 1234 — naïve café; 東京 ¿qué? <b>x</b> don't [MASK] "
          "e=mc^2 #hashtag @user https://example.com/a?b=c 😀")  # a fingerprint's tokenizer text
_REFRESH_S = 2.0  # how often process 0 looks for the parts the others wrote


def part_mb_problem(part_mb) -> str | None:
  """What is wrong with `part_mb` as the MiB of input of a part (PART_MB_RANGE), or None."""
  low, high = PART_MB_RANGE
  if isinstance(part_mb, bool) or not isinstance(part_mb, (int, float)) or not (
      math.isfinite(part_mb) and low <= part_mb <= high):
    return (f"{part_mb}, expected a number of MiB from {low:.6g} (256 bytes) to {high} (a part "
            f"is written whole: the unit a run resumes from and that processes share)")
  return None


def embed_parts(encoder, model: str, input_path: str, out_dir: str, text_field: str = "text",
                id_field: str = "id", prompt: str | None = None, prompt_name: str | None = None,
                dtype: str = "float32", show: bool = False, allow_nonfinite: bool = False,
                part_mb: float = PART_MB, batch_tokens: int | None = None,
                process: tuple[int, int] = (0, 1), barrier=None, precision: str = "float32",
                ranges: np.ndarray | None = None) -> tuple[int, int]:
  """Embeds this process's parts of `input_path` into the folder `out_dir` with `encoder`
  (a SentenceEncoder, its devices chosen); process 0 then writes the manifest, after
  `barrier()` (every process done). The parts hold the vectors in `precision`
  (flax_encoder.quantization; int8 and uint8 by `ranges`, which the manifest keeps). Returns
  (texts embedded now, parts written now)."""
  wrong = part_mb_problem(part_mb)
  if wrong:
    raise RunError(f"part_mb: {wrong}")
  index, count = process
  prompt_text = encoder.prompt_text(prompt, prompt_name)
  part_bytes = max(1, int(part_mb * (1 << 20)))
  reader = _reader(input_path, part_bytes, text_field, id_field)
  header = _header(encoder, model, input_path, reader, text_field, id_field, prompt_text,
                   dtype, part_bytes)
  if precision != "float32":  # a folder of the defaults' manifest as older versions wrote it
    header["model"]["precision"] = precision
    header["model"]["ranges"] = None if ranges is None else np.asarray(ranges).tolist()
  key = _prepare_folder(out_dir, header, index)
  written = _written(out_dir, key, process, say=True)
  nonfinite, embedded, made = NonFinite(), 0, 0
  chunk = _CHUNK * len(encoder.devices)
  if index == 0:
    devices = f"{len(encoder.devices)} {encoder.devices[0].platform} device" + (
        "s" if len(encoder.devices) > 1 else "")
    parts = f"{reader.count} parts" if reader.count is not None else "parts"
    print(f"embed: {parts} of {part_bytes / (1 << 20):.3g} MiB, {len(written)} written before; "
          f"{count} process{'es' if count > 1 else ''} of {devices}, "
          f"{batch_tokens or encoder.default_batch_tokens()} ids a device a call", flush=True)
  bar = _Bar(out_dir, reader, written, show and index == 0)
  with contextlib.closing(reader), bar:
    for k in reader.parts(index, count):
      items = None
      if k in written:
        if written[k] is None:  # a part of an older version, which kept no digest of its input
          reader.skip(k)
          continue
        items = list(reader.read(k))  # its input as it is now, against what it embedded
        if _input_digest(items) == written[k]:
          continue
        print(f"embed: {corpus.part_name(k)} is embedded again: its input differs from what it "
              f"embedded (the input changed since)", file=sys.stderr)
      digest = hashlib.sha256()
      with _Part(out_dir, k, key, *corpus.stored(header["model"])[::-1]) as part:
        # chunks of bounded characters too, as a file --out reads them
        read = _digesting(reader.read(k) if items is None else items, digest)
        for texts in examples.chunked(read, chunk, lambda item: (item[2],)):
          numbers, ids, strings = zip(*texts)
          vectors = encoder(list(strings), prompt=prompt_text, batch_tokens=batch_tokens,
                            progress=bar.batch(reader.done_in(k), len(texts)))
          if nonfinite.add(ids, vectors) and not allow_nonfinite:
            raise nonfinite.error(model, encoder.params, embedded + len(texts), embedded +
                                  len(texts))
          part.write(numbers, ids, quantization.quantize(vectors, precision, ranges))
          embedded += len(texts)
          bar.advance(reader.done_in(k))
        part.finish(reader.lines_in(k), reader.span(k), digest.hexdigest())
      made += 1
      bar.part_done(k)
  if nonfinite.count:
    print(f"embed: warning: {nonfinite.said(embedded)} are not finite (NaN or inf); written as "
          f"they came (--allow-nonfinite)", file=sys.stderr)
  if barrier is not None:
    barrier()
  if index == 0:
    _check_unchanged(input_path, header)
    _finish(out_dir, header, key, reader.count)
  return embedded, made


def _input_digest(items) -> str:
  """The SHA-256 of a part's texts as read: (line number, id, text) each."""
  digest = hashlib.sha256()
  for _ in _digesting(items, digest):
    pass
  return digest.hexdigest()


def _digesting(items, digest):
  """`items` ((line number, id, text) of a part), each added to `digest` as it passes."""
  for item in items:
    digest.update(json.dumps(item, ensure_ascii=False, default=repr).encode() + b"\n")
    yield item


def _check_unchanged(input_path: str, header: dict) -> None:
  """RunError where the input is no longer the file the run started on (grown, or changed
  within the bytes its fingerprint reads): the parts hold neither file's texts."""
  said = header["input"]
  try:
    size = os.path.getsize(input_path)
    same = size == said["bytes"] and _input_fingerprint(input_path) == said["fingerprint"]
  except OSError as e:
    raise RunError(f"--input {input_path}: cannot read it again ({e.strerror or e})", 1) from None
  if not same:
    raise RunError(f"--input {input_path}: changed while it was read ({said['bytes']} bytes "
                   f"when the run started, {size} now): the folder is left incomplete; run "
                   f"the command again on an input that no longer changes, into a new --out",
                   1)


def texts_in(out_dir: str) -> int:
  """The texts the complete folder `out_dir` holds."""
  return sum(part["rows"] for part in corpus.read_manifest(out_dir)["parts"])


# ---------------------------------------------------------------------------------------------
# The folder


def _header(encoder, model: str, input_path: str, reader, text_field: str, id_field: str,
            prompt: str, dtype: str, part_bytes: int) -> dict:
  """The manifest's description of the run, before its parts."""
  import jax
  from flax_encoder.embeddings import Normalize
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(encoder.params)[0]:
    digest.update(jax.tree_util.keystr(path).encode())
    digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
  digest.update(repr(encoder.model).encode())
  digest.update(repr(encoder.template).encode())
  digest.update(np.concatenate(encoder.tokenize([_PROBE])).tobytes())
  return {"format": corpus.FORMAT, "version": corpus.VERSION, "complete": False,
          "model": {"path": os.path.abspath(model), "fingerprint": digest.hexdigest(),
                    "dim": encoder.dim, "pooling": list(encoder.model.pooling.modes),
                    "normalize": any(isinstance(s, Normalize) for s in encoder.model.steps),
                    "max_seq_length": encoder.max_seq_length, "prompt": prompt,
                    "dtype": dtype,
                    # where set: a folder of the defaults has the manifest it had before them
                    **{key: value for key, value in (("truncate_dim", encoder.truncate_dim),
                                                     ("quantize", encoder.model.quantize))
                       if value is not None}},
          "input": {"path": os.path.abspath(input_path), "format": reader.format,
                    "compression": reader.compression, "bytes": os.path.getsize(input_path),
                    "fingerprint": _input_fingerprint(input_path)},
          "fields": {"text": text_field, "id": id_field}, "part_bytes": part_bytes}


def _input_fingerprint(path: str) -> str:
  """A SHA-256 of the input's first and last MiB (with its size beside it in the header):
  what tells a changed input from the same one without reading all of it."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    digest.update(f.read(_SAMPLE))
    f.seek(max(0, os.path.getsize(path) - _SAMPLE))
    digest.update(f.read(_SAMPLE))
  return digest.hexdigest()


def _prepare_folder(out_dir: str, header: dict, index: int) -> str:
  """Makes `out_dir` (process 0 writes its manifest, not yet complete) or checks that what it
  holds is this run's; returns the run's key."""
  key = corpus.run_key(header)
  manifest = os.path.join(out_dir, corpus.MANIFEST)
  if os.path.isfile(manifest):
    try:
      with open(manifest, encoding="utf-8") as f:
        before = json.load(f)
      theirs = before.get("key")
    except (OSError, ValueError, AttributeError):
      theirs = None
    if theirs != key:
      raise RunError(f"--out {out_dir}: holds the embeddings of another run "
                     f"({_difference(before if theirs else None, header)}); expected this "
                     f"command's: give another --out, or remove {out_dir} to start over")
    return key
  if os.path.isdir(out_dir):
    # the first manifest's write, killed (kill -9), left its temporary file: not another's
    remove_left_by_killed(*os.path.splitext(manifest))
    others = [n for n in os.listdir(out_dir) if not n.startswith("part-")]
    if others:
      raise RunError(f"--out {out_dir}: a directory holding {others[0]!r} and no "
                     f"{corpus.MANIFEST}, expected a new or empty directory or one this "
                     f"command wrote")
  os.makedirs(out_dir, exist_ok=True)
  if index == 0:
    _write_json(manifest, {**header, "key": key})
  return key


# What a folder's manifest records of the run that wrote it, and what each is, in the order a
# difference is said: the options before the fingerprints they change (--dtype, the weights').
_RECORDED = ((("model", "dtype"), "--dtype"), (("model", "quantize"), "--quantize"),
             (("model", "truncate_dim"), "--truncate-dim"),
             (("model", "precision"), "--precision"),
             (("model", "ranges"), "the int8 ranges (--ranges, or those of the calibration "
                                   "texts)"),
             (("model", "prompt"), "the prompt"),
             (("fields", "text"), "--text-field"), (("fields", "id"), "--id-field"),
             (("part_bytes",), "a part's bytes (--part-mb)"),
             (("input", "bytes"), "the input's size"),
             (("input", "fingerprint"), "the input's fingerprint"),
             (("model", "fingerprint"), "the model's fingerprint (its weights, modules and "
                                        "tokenizer)"),
             (("version",), "the format's version"))


def _difference(before: dict | None, header: dict) -> str:
  """What differs between the run that wrote a folder and this one: the first field of
  _RECORDED that does, with both values."""
  if before is None:
    return "its manifest.json is not this program's"
  for path, said in _RECORDED:
    then, now = _field(before, path), _field(header, path)
    if then != now:
      return f"{said} was {_brief(then)}, now {_brief(now)}"
  return "its manifest differs"


def _field(manifest: dict, path: tuple[str, ...]):
  for key in path:
    manifest = manifest.get(key) if isinstance(manifest, dict) else None
  return manifest


def _brief(value) -> str:
  """`value` as said: a fingerprint (64 hexadecimal digits) by its first 12."""
  said = repr(value)
  if isinstance(value, list):  # int8's ranges: two rows of dim values
    return said if len(said) <= 40 else said[:37] + "…"
  return said[:13] + "…'" if isinstance(value, str) and len(value) == 64 else said


# A part's marker (part-K.json): the fields the program reads of it, and their types.
_MARKER = {"part": int, "run": str, "rows": int, "dim": int, "lines": int, "sha256": str,
           "ids_sha256": str}


def _marker(path: str) -> dict | None:
  """The part's marker at `path` as a part writes it; None where it is not one (torn by a
  crash, or changed since)."""
  try:
    with open(path, encoding="utf-8") as f:
      about = json.load(f)
  except (OSError, ValueError, RecursionError):
    return None
  if not isinstance(about, dict) or not all(
      isinstance(about.get(k), kind) and not isinstance(about.get(k), bool)
      for k, kind in _MARKER.items()):
    return None
  return about


def _written(out_dir: str, key: str, process: tuple[int, int] = (0, 1),
             say: bool = False) -> dict[int, str | None]:
  """The parts already written by this run -> the SHA-256 of the input they embedded (None
  from a version that kept none); RunError naming a part of another run. This process's own
  parts (`process`: its index and the process count) are checked as `flax_encoder.corpus`
  reads them (their files' SHA-256): one torn or changed since it was written is not among
  them, and is written again, (`say`) said so. The others' parts are their processes' to
  check."""
  index, count = process
  done = {}
  for k in corpus.done_parts(os.listdir(out_dir)):
    name = corpus.part_name(k)
    stem = os.path.join(out_dir, name)
    about = _marker(stem + ".json")
    if about is not None and about["run"] != key:
      raise RunError(f"--out {out_dir}: {name}.json was written by another run (its key "
                     f"{about['run']!r}, this run's {key!r}): give another --out, or remove "
                     f"{out_dir} to start over")
    why = ("its record (.json) is not one a part writes" if about is None or about["part"] != k
           else None if k % count != index
           else next((f"its {suffix} is missing or differs from what was written"
                      for suffix, digest in ((".npy", about["sha256"]),
                                             (".ids.json", about["ids_sha256"]))
                      if _sha256(stem + suffix) != digest), None))
    if why is None:
      done[k] = about.get("input_sha256") if isinstance(about.get("input_sha256"), str) else None
    elif say and k % count == index:  # the process whose part it is says so
      print(f"embed: {name} is embedded again: {why} (torn by a crash, or changed since)",
            file=sys.stderr)
  return done


def _sha256(path: str) -> str | None:
  try:
    return sha256_file(path)
  except OSError:
    return None


def _finish(out_dir: str, header: dict, key: str, count: int) -> None:
  """The complete manifest: every part's file, rows, lines, first line and SHA-256."""
  parts, first = [], 0
  for k in range(count):
    name = corpus.part_name(k)
    about = _marker(os.path.join(out_dir, name + ".json"))
    if about is None:
      raise RunError(f"--out {out_dir}: {name}.json is missing or torn after every process "
                     f"finished: run the same command again")
    parts.append({"file": name + ".npy", "rows": about["rows"], "lines": about["lines"],
                  "first_line": first, "sha256": about["sha256"],
                  "ids_sha256": about["ids_sha256"]})
    first += about["lines"]
  _write_json(os.path.join(out_dir, corpus.MANIFEST),
              {**header, "key": key, "complete": True, "parts": parts})


def _write_json(path: str, value: dict) -> None:
  with written_whole(path) as tmp:
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(value, f, indent=1)
      f.write("\n")


class _Part:
  """Part k's .npy, written as its chunks come (its header's shape filled in at the end), then
  its .json; both appear whole or not at all."""

  def __init__(self, out_dir: str, k: int, key: str, dim: int, dtype=np.float32):
    self.path = os.path.join(out_dir, corpus.part_name(k))
    self.k, self.key, self.dim = k, key, dim
    self.dtype = np.dtype(dtype).newbyteorder("<")
    self.numbers, self.ids, self.rows = [], [], 0

  def __enter__(self):
    self._npy = written_whole(self.path + ".npy")
    self.tmp = self._npy.__enter__()
    self.file = open(self.tmp, "wb")
    self.file.write(corpus.npy_header(0, self.dim, self.dtype))
    return self

  def write(self, numbers, ids, vectors: np.ndarray) -> None:
    self.file.write(np.ascontiguousarray(vectors, self.dtype).tobytes())
    self.numbers += numbers
    self.ids += ids
    self.rows += len(vectors)

  def finish(self, lines: int, span: tuple[int, int], input_sha256: str) -> None:
    self.file.seek(0)
    self.file.write(corpus.npy_header(self.rows, self.dim, self.dtype))
    self.file.flush()
    os.fsync(self.file.fileno())
    self.file.close()
    self._npy.__exit__(None, None, None)  # renamed into place
    self.file = None
    given = any(i is not None for i in self.ids)
    _write_json(self.path + ".ids.json", {"line": list(self.numbers),
                                          "ids": list(self.ids) if given else None})
    _write_json(self.path + ".json", {
        "part": self.k, "run": self.key, "rows": self.rows, "dim": self.dim, "lines": lines,
        "span": list(span), "sha256": sha256_file(self.path + ".npy"),
        "ids_sha256": sha256_file(self.path + ".ids.json"), "input_sha256": input_sha256})

  def __exit__(self, *exc):
    if self.file is not None:  # stopped before finish: nothing of the part is left
      self.file.close()
      with contextlib.suppress(BaseException):
        self._npy.__exit__(*exc)


# ---------------------------------------------------------------------------------------------
# Reading the input by parts


def _reader(input_path: str, part_bytes: int, text_field: str, id_field: str):
  fmt, compression = sources.stored_format(input_path)
  if fmt == "parquet":
    return _RowGroups(input_path, part_bytes, text_field, id_field)
  return _Lines(input_path, fmt, compression, part_bytes, text_field, id_field)


class _Lines:
  """A .txt or .jsonl input by parts: part k the lines that start in bytes [k * B, (k+1) * B)
  (of the decompressed stream, where compressed). An uncompressed input is entered at a part's
  start; a compressed one is read through, its parts asked for in order."""

  def __init__(self, path: str, fmt: str, compression: str | None, part_bytes: int,
               text_field: str, id_field: str):
    self.path, self.format, self.compression = path, fmt, compression
    self.part_bytes, self.text_field, self.id_field = part_bytes, text_field, id_field
    self._open = contextlib.ExitStack()
    self.file = self._open.enter_context(sources.decompressed(path))
    self.at = 0  # where the next line starts
    self.ahead = None  # (start, line) read past the part asked for
    size = os.path.getsize(path)
    self.count = None if compression else -(-size // part_bytes)  # parts, once known
    self.total = None if compression else size  # the progress bar's
    self._lines, self._done = {}, {}

  def close(self) -> None:
    self._open.close()

  def parts(self, index: int, count: int) -> Iterator[int]:
    """This process's parts, in order, while there are parts."""
    k = index
    while self.count is None or k < self.count:
      yield k
      k += count

  def span(self, k: int) -> tuple[int, int]:
    return k * self.part_bytes, (k + 1) * self.part_bytes

  def lines_in(self, k: int) -> int:
    return self._lines[k]

  def done_in(self, k: int) -> int:
    """Bytes of part k read so far."""
    return self._done[k]

  def skip(self, k: int) -> None:
    """Passes over part k (already written)."""
    if self.compression:
      for _ in self._raw_lines(k):
        pass

  def _raw_lines(self, k: int) -> Iterator[tuple[int, bytes]]:
    start, stop = self.span(k)
    if not self.compression:  # enter at the first line that starts at or after `start`
      self.file.seek(max(0, start - 1))
      self.at, self.ahead = max(0, start - 1), None
      if start > 0:
        self.at += len(self.file.readline())
    while True:
      if self.ahead is None:
        try:
          line = self.file.readline()
        except (OSError, EOFError) as e:
          raise RunError(f"--input {self.path}: not a readable {self.compression} file "
                         f"({type(e).__name__}: {e})") from None
        if not line:
          self.count = -(-self.at // self.part_bytes)
          return
        self.ahead, self.at = (self.at, line), self.at + len(line)
      begins, line = self.ahead
      if begins >= stop:
        return
      self.ahead = None
      if begins >= start:
        self._done[k] = begins + len(line) - start
        yield begins, line

  def read(self, k: int) -> Iterator[tuple[int, object, str]]:
    """(line number within the part, from 1; the id where the line gives one, else None;
    the text) of part k's texts; blank lines are counted, not read."""
    self._lines[k], self._done[k] = 0, 0
    for begins, raw in self._raw_lines(k):
      self._lines[k] += 1
      number = self._lines[k]
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise RunError(f"--input {self.path}: invalid UTF-8 in the line at byte {begins}"
                       f"{' (decompressed)' if self.compression else ''} ({e.reason})") from None
      if not line.strip():
        continue
      if self.format == "text":
        yield number, None, line.rstrip("\r\n")
        continue
      where = f"--input {self.path}: the line at byte {begins}"
      try:
        id_, text = sources.text_of(sources.record_of_line(line, where), where,
                                    self.text_field, self.id_field)
      except sources.PrepareError as e:  # its number, counted now that it is needed
        said = str(e).replace(where, f"--input {self.path}: line {self._line_at(begins)} "
                                     f"(at byte {begins})", 1)
        raise RunError(said) from None
      yield number, id_, text

  def _line_at(self, begins: int) -> int:
    """The number (from 1) of the line of the input that begins at byte `begins` (of the
    decompressed stream), counting the lines before it."""
    seen, left = 0, begins
    with sources.decompressed(self.path) as f:
      while left > 0:
        block = f.read(min(left, 1 << 20))
        if not block:
          break
        seen, left = seen + block.count(b"\n"), left - len(block)
    return seen + 1


class _RowGroups:
  """A Parquet input by parts: part k the k-th run of its row groups holding about B bytes."""

  def __init__(self, path: str, part_bytes: int, text_field: str, id_field: str):
    import pyarrow.parquet as pq
    self.path, self.format, self.compression = path, "parquet", None
    self.text_field, self.id_field = text_field, id_field
    try:
      self.file = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow's errors, whichever: name the file
      raise RunError(f"--input {path}: not a readable Parquet file ({e})") from None
    names = self.file.schema_arrow.names
    if text_field not in names:
      raise RunError(f"--input {path}: no column {text_field!r} (--text-field), columns: "
                     f"{names}")
    self.columns = [text_field] + ([id_field] if id_field in names else [])
    meta = self.file.metadata
    self.groups, run, filled = [], [], 0
    for g in range(meta.num_row_groups):
      run.append(g)
      filled += meta.row_group(g).total_byte_size
      if filled >= part_bytes:
        self.groups.append(run)
        run, filled = [], 0
    if run:
      self.groups.append(run)
    self.rows = [sum(meta.row_group(g).num_rows for g in run) for run in self.groups]
    self.count, self.total = len(self.groups), meta.num_rows
    self._done = {}

  def close(self) -> None:
    self.file.close()

  def parts(self, index: int, count: int) -> Iterator[int]:
    return iter(range(index, self.count, count))

  def span(self, k: int) -> tuple[int, int]:
    first = sum(self.rows[:k])
    return first, first + self.rows[k]

  def lines_in(self, k: int) -> int:
    return self.rows[k]

  def done_in(self, k: int) -> int:
    return self._done[k]

  def skip(self, k: int) -> None:
    pass

  def read(self, k: int) -> Iterator[tuple[int, object, str]]:
    self._done[k] = 0
    number = 0
    for batch in self.file.iter_batches(row_groups=self.groups[k], columns=self.columns):
      for row in batch.to_pylist():
        number += 1
        self._done[k] = number
        where = f"--input {self.path}: row {self.span(k)[0] + number}"
        try:
          id_, text = sources.text_of(row, where, self.text_field, self.id_field)
        except sources.PrepareError as e:
          raise RunError(str(e)) from None
        yield number, id_, text


# ---------------------------------------------------------------------------------------------
# Progress


class _Bar:
  """Process 0's progress bar over the whole input: its own parts as they are read, the other
  processes' as their parts appear in the folder. Bytes of input (a Parquet file: rows; a
  compressed input: decompressed bytes, with no total until it is read through)."""

  def __init__(self, out_dir: str, reader, written: set[int], show: bool):
    self.out_dir, self.reader, self.show = out_dir, reader, show
    self.counted = set(written)  # parts whose every byte the bar counts
    self.here = 0  # bytes of the part in hand read so far
    self.looked = time.monotonic()

  def __enter__(self):
    from tqdm import tqdm
    unit = {"unit": "row"} if self.reader.format == "parquet" else {
        "unit": "B", "unit_scale": True, "unit_divisor": 1024}
    # what earlier runs embedded is where the bar starts, not progress at this run's rate
    self.bar = tqdm(desc="embed", total=self.reader.total, dynamic_ncols=True,
                    disable=not self.show, initial=sum(self._size(k) for k in self.counted),
                    **unit)
    return self

  def __exit__(self, *exc):
    self.bar.close()

  def _size(self, k: int) -> int:
    start, stop = self.reader.span(k)
    total = self.reader.total
    return (min(stop, total) if total is not None else stop) - start

  def batch(self, end: int, texts: int):
    """A call's progress for a chunk of `texts` texts of the part in hand that ends at its
    byte `end`: each call's texts move the bar their share of the chunk's bytes."""
    start, done = self.here, 0

    def progress(n: int) -> None:
      nonlocal done
      done += n
      self.advance(start + (end - start) * done // texts)
    return progress

  def advance(self, here: int) -> None:
    self.bar.update(here - self.here)
    self.here = here
    if self.show and time.monotonic() - self.looked > _REFRESH_S:
      self._look()

  def part_done(self, k: int) -> None:
    self.bar.update(self._size(k) - self.here)
    self.here = 0
    self.counted.add(k)

  def _look(self) -> None:
    """Counts the parts other processes have written since the last look."""
    self.looked = time.monotonic()
    for k in corpus.done_parts(os.listdir(self.out_dir)):
      if k not in self.counted and (self.reader.count is None or k < self.reader.count):
        self.counted.add(k)
        self.bar.update(self._size(k))
