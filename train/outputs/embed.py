r"""Sentence embeddings of a file of texts, read and written a chunk at a time, on every
device of the process (and of every process: `python -m train.launch --program embed`).

  python -m train.embed --model all-MiniLM-L6-v2 --input texts.jsonl --out embeddings.npy
  python -m train.embed --model all-MiniLM-L6-v2 --input corpus.jsonl --out embeddings/

--model is a sentence-transformers folder (its modules: Transformer, Pooling, Dense,
Normalize; its prompts), a Hugging Face model directory (mean pooling, as
sentence-transformers gives one) or the workdir of a contrastive run (configs/embed.py: its
newest checkpoint, pooling and normalization, its texts cut as its pairs were).
--input is one of:

  .txt      one text a line (blank lines left out); a text's id is its line number
  .jsonl    JSON objects with the text under --text-field ("text"); the id under --id-field
            ("id") where the line has one (not null), else the line number
  .parquet  the same columns; the id the row number where the column is absent

(each maybe compressed: .gz, .bz2, .xz, .zst). --out is a file whose suffix names its format,
or a folder of parts (OUT_FORMATS, listed at the end of --help).

Texts are embedded 1024 at a time, fewer where they are long (packed several to a row by
`flax_encoder.embeddings.SentenceEncoder`) and each chunk is written before the next is read,
so the input may be far larger than memory. For a file --out, --input is read twice (counted,
then embedded), so it is a regular file, not a stream.

A file --out appears once every text is embedded, never half-written: an error, a full disk, Ctrl-C
or SIGTERM leave nothing behind. kill -9 leaves OUT.tmp-HOST-PID.npy (or .parquet, .jsonl),
which the next embed to the same --out removes, saying so. An embedding that is not finite
(NaN or inf: a broken model, an overflow in bfloat16) stops the command before anything is
written, naming the texts and the model's first parameter that is not finite, if one is;
--allow-nonfinite writes them and warns instead. A folder --out keeps each part written whole:
the same command continues where one was stopped, however it was.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import lzma
import os
import signal
import sys
import textwrap
from collections.abc import Callable, Iterator

import numpy as np

from flax_encoder import quantization
from train.cli import HelpFormatter
from train.data import examples, sources
from train.errors import RunError
from train.files import special_kind, unwritable_kind, written_whole
from train.outputs import corpus
from train.outputs.nonfinite import NonFinite
from train.run import multihost

_CHUNK = 1024  # texts in memory at once (the progress bar moves with each call of them)
_FOLDER = "/"  # OUT_FORMATS' key of a folder of parts, which --out names by a trailing /
CALIBRATION_TEXTS = 1000  # the texts whose vectors' ranges bucket int8 and uint8


def embed(model: str, input_path: str, out_path: str, text_field: str = "text",
          id_field: str = "id", prompt: str | None = None, prompt_name: str | None = None,
          dtype: str = "float32", show: bool = False, allow_nonfinite: bool = False,
          part_mb: float = corpus.PART_MB, batch_tokens: int | None = None,
          process: tuple[int, int] = (0, 1), barrier=None, truncate_dim: int | None = None,
          precision: str = "float32", ranges_path: str | None = None,
          calibration_texts: int = CALIBRATION_TEXTS, quantize: str | None = None) -> int:
  """Writes the embeddings of `input_path`'s texts to `out_path` (a file, or a folder of
  parts: `is_folder`) with every local device; returns how many (a folder: how many it holds
  once this process is done). An embedding that is not finite is a RunError before it is
  written, unless `allow_nonfinite` (then written, and warned of on stderr). `process`:
  (this process's index, the process count); `barrier`: waits for every process.
  `truncate_dim`: each vector's first dimensions (a Matryoshka model's). `precision`: the
  vectors as flax_encoder.quantization gives them, int8 and uint8 by the ranges in
  `ranges_path` (.npy [2, dim]), else those of the first `calibration_texts` texts, written
  beside a file (`ranges_file`) or into a folder's manifest. `quantize`: the encoder's dense
  layers in int8."""
  writer = OUT_FORMATS[check_arguments(input_path, out_path)].writer
  if writer is None:
    check_folder(out_path)
  elif process[1] > 1:
    raise RunError(f"--out {out_path}: a file, which one of {process[1]} processes cannot "
                   f"write; expected a folder (a name ending in /) the processes share")
  check_columns(input_path, text_field)
  ranges = _read_ranges(ranges_path) if precision in ("int8", "uint8") and ranges_path else None
  import jax
  encoder = load_encoder(model, dtype, truncate_dim, quantize).on_devices(jax.local_devices())
  if ranges is not None and ranges.shape != (2, encoder.dim):
    raise RunError(f"--ranges {ranges_path}: shape {ranges.shape}, expected (2, {encoder.dim}) "
                   f"(each dimension's minimum and maximum)")
  from flax_encoder.embeddings import EmbeddingError
  if prompt_name is not None and prompt_name not in encoder.prompts:
    raise RunError(f"--prompt-name {prompt_name}: not among the model's prompts "
                   f"{sorted(encoder.prompts)}")
  if precision in ("int8", "uint8") and ranges is None:
    where = " (in the manifest)" if writer is None else f", in {ranges_file(out_path)}"
    ranges = _calibrated(encoder, sources.Source(input_path), input_path, text_field, id_field,
                         prompt, prompt_name, batch_tokens, calibration_texts, where, process)
    if writer is not None:
      with written_whole(ranges_file(out_path)) as tmp:
        np.save(tmp, ranges)
  if writer is None:
    try:
      corpus.embed_parts(encoder, model, input_path, out_path, text_field, id_field, prompt,
                         prompt_name, dtype, show, allow_nonfinite, part_mb, batch_tokens,
                         process, barrier, precision, ranges)
    except EmbeddingError as e:  # another model's tokenizer, found as it runs
      raise RunError(f"--model {model}: {_tokenizer_file(encoder)}{e}") from None
    except OSError as e:  # a full disk: the resource failed, not the request (exit 1)
      raise RunError(f"--out {out_path}: cannot write it ({e.strerror or e})", 1) from None
    return corpus.texts_in(out_path) if process[0] == 0 else 0
  source = sources.Source(input_path)
  total = count_texts(source, input_path)
  from tqdm import tqdm
  count, nonfinite = 0, NonFinite()
  width = quantization.width(encoder.dim, precision)
  try:  # an error, Ctrl-C or SIGTERM (main) leave no half-written file behind
    with written_whole(out_path) as tmp, \
        writer(tmp, total, width, quantization.DTYPES[precision]) as written, \
        tqdm(desc="embed", unit="text", total=total, dynamic_ncols=True,
             disable=not show) as bar:
      for chunk in examples.chunked(texts_of(source, input_path, text_field, id_field),
                                    _CHUNK, lambda item: (item[1],)):
        ids, texts = zip(*chunk)
        try:  # the bar moves as each call's vectors are back
          vectors = encoder(list(texts), prompt=prompt, prompt_name=prompt_name,
                            batch_tokens=batch_tokens, progress=bar.update)
        except EmbeddingError as e:  # another model's tokenizer, found as it runs
          raise RunError(f"--model {model}: {_tokenizer_file(encoder)}{e}") from None
        count += len(chunk)
        # checked a chunk at a time, so that a broken model stops before hours of NaN
        if nonfinite.add(ids, vectors) and not allow_nonfinite:
          raise nonfinite.error(model, encoder.params, count, total)
        written.write(list(ids), quantization.quantize(vectors, precision, ranges))
      if count != total:
        raise RunError(f"--input {input_path}: {count} texts read, {total} counted before: "
                       f"it changed while it was read")
  except OSError as e:  # a full disk: the resource failed, not the request (exit 1)
    raise RunError(f"--out {out_path}: cannot write it ({e.strerror or e})", 1) from None
  if nonfinite.count:
    print(f"embed: warning: {nonfinite.said(count)} are not finite (NaN or inf); written as "
          f"they came (--allow-nonfinite)", file=sys.stderr)
  return count


def ranges_file(out_path: str) -> str:
  """Where an int8 or uint8 file --out's ranges are written: OUT.ranges.npy, float32 [2, dim],
  each dimension's minimum and maximum (the queries' --ranges)."""
  return os.path.splitext(out_path)[0] + ".ranges.npy"


def _read_ranges(path: str) -> np.ndarray:
  try:
    ranges = np.load(path, allow_pickle=False)
  except (OSError, ValueError) as e:
    raise RunError(f"--ranges {path}: not a readable .npy file ({e})".splitlines()[0]) from None
  if ranges.ndim != 2 or len(ranges) != 2 or not np.issubdtype(ranges.dtype, np.floating):
    raise RunError(f"--ranges {path}: {ranges.dtype} {list(ranges.shape)}, expected float "
                   f"[2, dim] (each dimension's minimum and maximum)")
  return ranges.astype(np.float32)


def _calibrated(encoder, source, input_path: str, text_field: str, id_field: str, prompt,
                prompt_name, batch_tokens, calibration_texts: int, where: str = "",
                process: tuple[int, int] = (0, 1)) -> np.ndarray:
  """The int8 ranges of the first `calibration_texts` texts' vectors (all of them, where
  there are no more: as sentence-transformers' encode(precision="int8") takes them); of
  several processes, process 0's, which every process takes (JAX's broadcast). Said, with
  `where` they are kept."""
  texts = []
  for _, text in texts_of(source, input_path, text_field, id_field):
    texts.append(text)
    if len(texts) == calibration_texts:
      break
  if len(texts) < 2:
    raise RunError(f"--input {input_path}: {len(texts)} text, expected at least 2 to take int8 "
                   f"ranges from (or --ranges)")
  ranges = quantization.int8_ranges(encoder(texts, prompt=prompt, prompt_name=prompt_name,
                               batch_tokens=batch_tokens))
  if process[1] > 1:  # the same ranges in every process's parts, to the bit
    from jax.experimental import multihost_utils
    ranges = np.asarray(multihost_utils.broadcast_one_to_all(ranges))
  if process[0] == 0:
    print(f"embed: int8 ranges of the first {len(texts)} texts{where}", file=sys.stderr)
  return ranges


def _tokenizer_file(encoder) -> str:
  """'FILE: ' of a run's tokenizer (train.data.tokens' says its file); '' for a folder's, which
  --model names."""
  spec = getattr(encoder.tokenizer, "spec", None)
  return f"{spec.path}: " if spec is not None and spec.path else ""


def count_texts(source: sources.Source, input_path: str) -> int:
  """The records of `source` (a progress bar's total); RunError naming --input where it cannot
  be read through (a compressed file cut short, say)."""
  try:
    return source.count()
  except (OSError, sources.PrepareError) as e:
    raise RunError(f"--input {input_path}: cannot read it ({getattr(e, 'strerror', None) or e})"
                   ) from None
  except EOFError as e:  # how gzip, bz2, lzma and sources' .zst reader end a cut stream
    raise RunError(f"--input {input_path}: truncated: it ends inside its compressed "
                   f"{source.compression} stream ({e})") from None
  except lzma.LZMAError as e:
    raise RunError(f"--input {input_path}: not a readable {source.compression} file ({e})"
                   ) from None


def check_columns(input_path: str, text_field: str) -> None:
  """RunError naming the columns of a Parquet --input without `text_field`, before the model
  is read."""
  if sources.stored_format(input_path)[0] != "parquet":
    return
  import pyarrow.parquet as pq
  try:
    names = pq.read_schema(input_path).names
  except Exception:  # noqa: BLE001 - count_texts says what is wrong with the file
    return
  if text_field not in names:
    raise RunError(f"--input {input_path}: no column {text_field!r} (--text-field), columns: "
                   f"{names}")


def load_encoder(model: str, dtype: str, truncate_dim: int | None = None,
                 quantize: str | None = None):
  """The SentenceEncoder of `model`, its vectors cut to `truncate_dim` and its dense layers in
  `quantize` (int8) where given; RunError naming --model (or the option) where it cannot be
  read."""
  from flax_encoder.embeddings import SentenceEncoder
  if not os.path.isdir(model):
    raise RunError(f"--model {model}: no such directory, expected a sentence-transformers "
                   f"folder, a Hugging Face model directory or a contrastive run's workdir")
  if is_workdir(model):
    encoder = _run_encoder(model, dtype)
  else:
    try:
      encoder = SentenceEncoder.load(model, dtype=dtype)
    except ValueError as e:  # the library's errors name the file and what it holds
      raise RunError(f"--model {model}: {e}") from None
  try:
    truncate_dim = quantization.check_truncate_dim(truncate_dim, encoder.model.dim)
  except ValueError:
    raise RunError(f"--truncate-dim {truncate_dim}: expected 1 to the {encoder.model.dim} "
                   f"dimensions of --model {model}") from None
  routes = encoder.router.routes.values() if encoder.router is not None else ()
  for each in (encoder, *routes):  # a Router's calls run its routes' encoders
    each.truncate_dim = truncate_dim
  if quantize is not None:
    try:
      encoder = encoder.quantized(quantize)
    except ValueError as e:  # qwix missing
      raise RunError(f"--quantize {quantize}: {e}") from None
  return encoder


def is_workdir(path: str) -> bool:
  """Whether `path` is a training run's workdir (its checkpoints, its config)."""
  return os.path.isdir(os.path.join(path, "checkpoints")) and not os.path.isfile(
      os.path.join(path, "config.json"))


def _run_encoder(workdir: str, dtype: str):
  """The SentenceEncoder of the training run `workdir`: its task's `sentence_encoder`."""
  from flax_encoder.embeddings import SentenceEncoder
  from train import tasks
  from train.run.load import load_config
  try:
    task = load_config(workdir).task.get("name", "masked_lm")
  except FileNotFoundError as e:  # train.run.load: no checkpoint to read
    raise RunError(f"--model {workdir}: {e}") from None
  definition = tasks.definition(task)
  if definition.sentence_encoder is None:
    raise RunError(f"--model {workdir}: a {task} run, which embeds no sentences; expected a "
                   f"contrastive run (configs/embed.py) or a sentence-transformers folder")
  check_run_tokenizer(workdir)
  try:
    encoder = definition.sentence_encoder(workdir, dtype)
  except OSError as e:  # a file of the run gone or unreadable since it was written
    raise RunError(f"--model {workdir}: {e.filename or workdir}: cannot read it "
                   f"({e.strerror or e})") from None
  if type(encoder) is not SentenceEncoder:  # a sparse or multi-vector model's
    raise RunError(f"--model {workdir}: a {task} run, whose vectors are not one dense vector a "
                   f"text; expected a contrastive run (configs/embed.py); export it (python -m "
                   f"train.export --layout sentence-transformers) for sentence-transformers' "
                   f"{type(encoder).__name__}")
  return encoder


def check_run_tokenizer(workdir: str) -> None:
  """RunError naming the tokenizer file of the run `workdir` (its data/tokenizer.json) where
  it is gone, not a tokenizer, or another than the one the run's data was prepared with (its
  vocabulary's size differs from the one dataset.json records)."""
  from train.data import dataset, tokens
  directory = os.path.join(workdir, "data")
  meta = dataset.read_meta(directory, None)
  spec = tokens.spec_of_dataset(directory, meta)
  if spec.path is None:  # the project's own byte ids: no file
    return
  if not os.path.isfile(spec.path):
    raise RunError(f"--model {workdir}: {spec.path}: no such file, expected the {spec.kind} "
                   f"tokenizer the run's data was prepared with")
  try:
    tokenizer = spec.load(meta["tokenizer"]["offset"])
  except Exception as e:  # noqa: BLE001 - tokenizers' errors are bare Exceptions: name the file
    said = (str(e).splitlines() or [""])[0]
    raise RunError(f"--model {workdir}: {spec.path}: not a readable {spec.kind} tokenizer "
                   f"({type(e).__name__}: {said})") from None
  if meta.get("vocab_size") not in (None, tokenizer.vocab_size):
    raise RunError(f"--model {workdir}: {spec.path}: a vocabulary of {tokenizer.vocab_size} "
                   f"ids, expected the {meta['vocab_size']} of the tokenizer the run was "
                   f"trained with (another model's tokenizer)")


def texts_of(source: sources.Source, input_path: str, text_field: str,
             id_field: str) -> Iterator[tuple[object, str]]:
  """(id, text) of each text of `source`, in order."""
  try:
    if source.format == "text":
      for number, line in source.lines():
        if line.strip():
          yield number, line.rstrip("\r\n")
      return
    unit = "row" if source.format == "parquet" else "line"
    for number, record in source.records():
      given, text = sources.text_of(record, f"--input {input_path}: {unit} {number}",
                                    text_field, id_field)
      yield (number if given is None else given), text  # null is no id
  except sources.PrepareError as e:
    raise RunError(str(e)) from None
  except OSError as e:
    raise RunError(f"--input {input_path}: cannot read it ({e.strerror or e})") from None


class _Npy:
  """[total, dim] of `dtype`: the .npy header, then each chunk's rows written after it. Its
  size is known at the start, so its space is reserved then: a disk without room for it is an
  OSError before any text is embedded. (Not a memory map: a page the full disk cannot hold
  would kill the process with SIGBUS, leaving the file behind.)"""

  def __init__(self, path: str, total: int, dim: int, dtype=np.float32):
    self.file, self.dtype = open(path, "wb"), np.dtype(dtype).newbyteorder("<")
    try:
      np.lib.format.write_array_header_1_0(self.file, {
          "descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
          "shape": (total, dim)})
      self.file.flush()
      _reserve(self.file.fileno(), self.file.tell() + total * dim * self.dtype.itemsize)
    except BaseException:
      self.file.close()
      raise

  def write(self, ids: list, embeddings: np.ndarray) -> None:
    self.file.write(np.ascontiguousarray(embeddings, self.dtype).tobytes())

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.file.close()


def _reserve(fd: int, size: int) -> None:
  """Reserves `size` bytes of the file `fd` on its disk; OSError (ENOSPC) where they are not
  there. Where the system or file system cannot reserve (macOS), a full disk is found as the
  rows are written instead."""
  try:
    os.posix_fallocate(fd, 0, size)
  except AttributeError:
    pass
  except OSError as e:
    if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
      raise


class _Parquet:
  """Row groups of (id, embedding), one a chunk."""

  def __init__(self, path: str, total: int, dim: int, dtype=np.float32):
    import pyarrow as pa
    import pyarrow.parquet as pq
    self.pa, self.type = pa, pa.from_numpy_dtype(np.dtype(dtype))
    self.schema = pa.schema([("id", pa.string()), ("embedding", pa.list_(self.type, dim))])
    self.writer = pq.ParquetWriter(path, self.schema)

  def write(self, ids: list, embeddings: np.ndarray) -> None:
    pa = self.pa
    column = pa.FixedSizeListArray.from_arrays(pa.array(embeddings.reshape(-1), self.type),
                                               embeddings.shape[1])
    self.writer.write_table(pa.table([pa.array([str(i) for i in ids], pa.string()), column],
                                     schema=self.schema))

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.writer.close()


class _Jsonl:
  def __init__(self, path: str, total: int, dim: int, dtype=np.float32):
    self.file = open(path, "w", encoding="utf-8")

  def write(self, ids: list, embeddings: np.ndarray) -> None:
    self.file.writelines(json.dumps({"id": i, "embedding": e}) + "\n"
                         for i, e in zip(ids, embeddings.tolist()))

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.file.close()


@dataclasses.dataclass(frozen=True)
class OutFormat:
  """What --out writes: its description (--help's), and the writer of a file of the format,
  `writer(path, total, dim, dtype)`, a context manager whose `write(ids, vectors)` adds a
  chunk; None for a folder of parts (train.outputs.corpus)."""
  description: str
  writer: Callable | None


# --out's suffix -> its format: a new one is an entry here.
OUT_FORMATS = {
    ".npy": OutFormat("float32 [texts, dim] (or --precision's), in input order", _Npy),
    ".parquet": OutFormat("columns id (a string) and embedding (float32 [dim], or "
                          "--precision's), in input order", _Parquet),
    ".jsonl": OutFormat('{"id": ..., "embedding": [...]} a line, in input order', _Jsonl),
    _FOLDER: OutFormat("(a name ending in /, or a directory) parts of --part-mb MiB of input "
                       "each, and a manifest (train.outputs.corpus; read back with "
                       "flax_encoder.corpus.read_embeddings): resumable, and shared by the "
                       "processes", None),
}


def file_suffixes() -> tuple[str, ...]:
  """The suffixes of OUT_FORMATS that name a file."""
  return tuple(s for s, f in OUT_FORMATS.items() if f.writer is not None)


def formats_help() -> str:
  """--help's list of OUT_FORMATS."""
  lines = ["--out, by its suffix:", ""]
  for suffix, fmt in OUT_FORMATS.items():
    shown = "DIR/" if suffix == _FOLDER else suffix
    lines += textwrap.wrap(fmt.description, 94, initial_indent=f"  {shown:<8}  ",
                           subsequent_indent=" " * 12, break_on_hyphens=False)
  return "\n".join(lines)


def check_arguments(input_path: str, out_path: str) -> str:
  """--out's format (its key in OUT_FORMATS); RunError naming the argument where the paths
  cannot be used, before the model is loaded and before the input could be overwritten."""
  kind = special_kind(input_path)
  if kind == "a directory":
    raise RunError(f"--input {input_path}: a directory, expected a .txt, .jsonl or .parquet "
                   f"file")
  if kind:  # a FIFO or /dev/stdin could be read once only, and the texts are counted first
    raise RunError(f"--input {input_path}: {kind}, expected a regular file")
  if not os.path.isfile(input_path):
    raise RunError(f"--input {input_path}: no such file")
  if is_folder(out_path):
    if os.path.isdir(input_path) or os.path.realpath(input_path).startswith(
        os.path.realpath(out_path) + os.sep):
      raise RunError(f"--out {out_path}: holds --input {input_path}, expected a folder of "
                     f"its own")
    return _FOLDER
  suffix = os.path.splitext(out_path)[1].lower()
  if suffix not in file_suffixes():
    raise RunError(f"--out {out_path}: ends in {suffix or 'no suffix'!r}, expected one of "
                   f"{', '.join(file_suffixes())}, or a folder (a name ending in /)")
  kind = unwritable_kind(out_path)
  if kind:
    raise RunError(f"--out {out_path}: {kind}, expected the name of a file to write")
  parent = os.path.dirname(os.path.abspath(out_path))
  if not os.path.isdir(parent):
    raise RunError(f"--out {out_path}: no directory {parent} to write it in")
  if os.path.exists(out_path) and os.path.samefile(input_path, out_path):
    raise RunError(f"--out {out_path}: the file --input {input_path} names, expected another "
                   f"(the embeddings would replace the texts)")
  return suffix


def is_folder(out_path: str) -> bool:
  """Whether --out names a folder of parts: a name ending in / or a directory."""
  return out_path.endswith(("/", os.sep)) or os.path.isdir(out_path)


def check_folder(out_path: str) -> None:
  """RunError where a folder --out cannot be made or written."""
  # "afile/" does not exist to the system where afile is a file: look at the name without the /
  path = out_path.rstrip("/" + os.sep) or out_path
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    raise RunError(f"--out {out_path}: no directory {parent} to make it in")
  if os.path.exists(path) and not os.path.isdir(path):
    raise RunError(f"--out {out_path}: {special_kind(path) or 'a file'}, expected a folder")


def _interrupt(signum, frame):
  raise KeyboardInterrupt(signum)


def _join(args) -> tuple[tuple[int, int], object]:
  """Joins the other processes (`multihost.join`); returns (this process's index, their count)
  and the barrier every process passes once its parts are written, which waits for the others
  as long as they live (their parts may take minutes longer than this one's)."""
  import jax
  multihost.join(args.coordinator_address, args.num_processes, args.process_id,
                 args.heartbeat_timeout_s)

  def barrier():
    try:
      multihost.barrier("embed: every part written")
    except Exception as e:  # noqa: BLE001 - jax's runtime errors: a peer is gone
      said = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
      # said now: JAX's own error poller ends this process within moments
      print(f"embed: error: --out {args.out}: another process stopped before every part was "
            f"written ({said}); the parts written are kept: the same command continues",
            file=sys.stderr, flush=True)
      os._exit(1)

  return (jax.process_index(), jax.process_count()), barrier


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m train.embed", description=__doc__,
                                   epilog=formats_help(),
                                   formatter_class=HelpFormatter)
  parser.add_argument("--model", required=True,
                      help="a sentence-transformers folder or Hugging Face model directory")
  parser.add_argument("--input", required=True, help=".txt, .jsonl or .parquet of texts")
  parser.add_argument("--out", required=True,
                      help=f"{', '.join(file_suffixes())} or a folder DIR/ (below)")
  parser.add_argument("--text-field", default="text",
                      help="the field of a .jsonl line or .parquet column holding the text")
  parser.add_argument("--id-field", default="id",
                      help="the field of a .jsonl line or .parquet column holding its id")
  parser.add_argument("--prompt", help="text put before each text (e.g. 'query: ')")
  parser.add_argument("--prompt-name", help="one of the model's prompts, by name")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                      help="what the encoder computes in (the embeddings are float32)")
  parser.add_argument("--quantize", choices=("int8",),
                      help="compute the dense layers in int8 (flax_encoder.quantized: faster "
                      "on a CPU with int8 dot products, vectors within a cosine of about 0.99 "
                      "of float32's)")
  parser.add_argument("--truncate-dim", type=int,
                      help="keep each vector's first N dimensions (a Matryoshka model's), as "
                      "sentence-transformers' truncate_dim")
  parser.add_argument("--precision", default="float32", choices=quantization.PRECISIONS,
                      help="the vectors as sentence-transformers' encode(precision=...): int8 "
                      "and uint8 by --ranges, else by the ranges of the first "
                      "--calibration-texts texts, written to OUT.ranges.npy (a folder: its "
                      "manifest); binary and ubinary one bit a dimension, 8 to a byte")
  parser.add_argument("--ranges", help="a .npy of float [2, dim]: int8's buckets (e.g. the "
                      "OUT.ranges.npy of the corpus these queries are searched in)")
  parser.add_argument("--calibration-texts", type=int, default=CALIBRATION_TEXTS,
                      help="the texts whose ranges bucket int8 and uint8 where --ranges is not "
                      "given")
  parser.add_argument("--allow-nonfinite", action="store_true",
                      help="write embeddings that are NaN or inf (warned of), not stop")
  low, high = corpus.PART_MB_RANGE
  parser.add_argument("--part-mb", type=float, default=corpus.PART_MB,
                      help=f"MiB of input a part of a folder --out holds ({low:.6g} to {high}): "
                      f"a part is embedded and written whole, the unit a stopped run resumes "
                      f"from and that several processes share (default: {corpus.PART_MB})")
  parser.add_argument("--batch-tokens", type=int,
                      help="ids a call encodes on each device (default: from its memory)")
  multihost = parser.add_argument_group("several processes (python -m train.launch gives these)")
  multihost.add_argument("--multihost", action="store_true",
                         help="join the other processes with jax.distributed.initialize()")
  multihost.add_argument("--coordinator_address", help="host:port of process 0")
  multihost.add_argument("--num_processes", type=int, help="processes in the job")
  multihost.add_argument("--process_id", type=int, help="this process's index")
  multihost.add_argument("--heartbeat_timeout_s", type=int, default=100,
                         help="seconds without a peer's heartbeat before it counts as dead")
  args = parser.parse_args(argv)
  if args.prompt is not None and args.prompt_name is not None:
    parser.error("--prompt and --prompt-name: both given, expected one")
  if args.batch_tokens is not None and not args.batch_tokens > 0:
    parser.error(f"--batch-tokens {args.batch_tokens}: expected a number > 0")
  if args.calibration_texts < 2:
    parser.error(f"--calibration-texts {args.calibration_texts}: expected at least 2")
  if args.ranges is not None and args.precision not in ("int8", "uint8"):
    parser.error(f"--ranges: given with --precision {args.precision}, expected int8 or uint8")
  wrong = corpus.part_mb_problem(args.part_mb)
  if wrong:
    parser.error(f"--part-mb {wrong}")
  process, barrier = (0, 1), None
  if args.multihost:
    try:
      process, barrier = _join(args)
    except RunError as e:
      print(f"embed: error: {e}", file=sys.stderr)
      return e.exit_code
  previous = signal.signal(signal.SIGTERM, _interrupt)
  try:
    count = embed(args.model, args.input, args.out, args.text_field, args.id_field,
                  args.prompt, args.prompt_name, args.dtype, show=True,
                  allow_nonfinite=args.allow_nonfinite, part_mb=args.part_mb,
                  batch_tokens=args.batch_tokens, process=process, barrier=barrier,
                  truncate_dim=args.truncate_dim, precision=args.precision,
                  ranges_path=args.ranges, calibration_texts=args.calibration_texts,
                  quantize=args.quantize)
  except RunError as e:
    print(f"embed: error: {e}", file=sys.stderr)
    return e.exit_code
  except KeyboardInterrupt as e:
    left = ("the parts written are kept: the same command continues"
            if is_folder(args.out) else "not written")
    print(f"embed: stopped; {args.out} {left}", file=sys.stderr)
    return 128 + (e.args[0] if e.args else signal.SIGINT)
  finally:
    signal.signal(signal.SIGTERM, previous)
  if process[0] == 0:
    print(f"{args.out}: {count} embeddings")
  return 0


if __name__ == "__main__":
  sys.exit(main())
