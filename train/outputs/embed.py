r"""Sentence embeddings of a file of texts, read and written a chunk at a time.

  python -m train.embed --model all-MiniLM-L6-v2 --input texts.jsonl --out embeddings.npy

--model is a sentence-transformers folder (its modules: Transformer, Pooling, Dense,
Normalize; its prompts), a Hugging Face model directory (mean pooling, as
sentence-transformers gives one) or the workdir of a contrastive run (configs/embed.py: its
newest checkpoint, pooling and normalization, its texts cut as its pairs were).
--input is one of:

  .txt      one text a line (blank lines left out); a text's id is its line number
  .jsonl    JSON objects with the text under --text-field ("text"); the id under --id-field
            ("id") where the line has one, else the line number
  .parquet  the same columns; the id the row number where the column is absent

(each maybe compressed: .gz, .bz2, .xz, .zst). --out, by its suffix:

  .npy      float32 [texts, dim], in input order
  .parquet  columns id (a string) and embedding (float32 [dim]), in input order
  .jsonl    {"id": ..., "embedding": [...]} a line, in input order

Texts are embedded 4096 at a time, fewer where they are long (packed several to a row by
`flax_encoder.embeddings.SentenceEncoder`) and each chunk is written before the next is read,
so the input may be far larger than memory. --out appears once every text is embedded, never
half-written; Ctrl-C or SIGTERM leave nothing behind.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Iterator

import numpy as np

from train.data import examples, sources
from train.errors import RunError
from train.files import unwritable_kind, written_whole

_CHUNK = 4096  # texts in memory at once
OUT_FORMATS = (".npy", ".parquet", ".jsonl")


def embed(model: str, input_path: str, out_path: str, text_field: str = "text",
          id_field: str = "id", prompt: str | None = None, prompt_name: str | None = None,
          dtype: str = "float32", show: bool = False) -> int:
  """Writes the embeddings of `input_path`'s texts to `out_path`; returns how many."""
  suffix = check_arguments(input_path, out_path)
  encoder = load_encoder(model, dtype)
  if prompt_name is not None and prompt_name not in encoder.prompts:
    raise RunError(f"--prompt-name {prompt_name}: not among the model's prompts "
                   f"{sorted(encoder.prompts)}")
  source = sources.Source(input_path)
  try:
    total = source.count()
  except (OSError, sources.PrepareError) as e:
    raise RunError(f"--input {input_path}: cannot read it ({getattr(e, 'strerror', None) or e})"
                   ) from None
  from tqdm import tqdm
  count = 0
  try:  # an error, Ctrl-C or SIGTERM (main) leave no half-written file behind
    with written_whole(out_path) as tmp, _WRITERS[suffix](tmp, total, encoder.dim) as writer, \
        tqdm(desc="embed", unit="text", total=total, dynamic_ncols=True,
             disable=not show) as bar:
      for chunk in examples.chunked(texts_of(source, input_path, text_field, id_field),
                                    _CHUNK, lambda item: (item[1],)):
        ids, texts = zip(*chunk)
        writer.write(list(ids), encoder(list(texts), prompt=prompt, prompt_name=prompt_name))
        count += len(chunk)
        bar.update(len(chunk))
      if count != total:
        raise RunError(f"--input {input_path}: {count} texts read, {total} counted before: "
                       f"it changed while it was read")
  except OSError as e:
    raise RunError(f"--out {out_path}: cannot write it ({e.strerror or e})") from None
  return count


def load_encoder(model: str, dtype: str):
  """The SentenceEncoder of `model`; RunError naming --model where it cannot be read."""
  from flax_encoder.embeddings import SentenceEncoder
  if not os.path.isdir(model):
    raise RunError(f"--model {model}: no such directory, expected a sentence-transformers "
                   f"folder, a Hugging Face model directory or a contrastive run's workdir")
  if is_workdir(model):
    return _run_encoder(model, dtype)
  try:
    return SentenceEncoder.load(model, dtype=dtype)
  except ValueError as e:  # the library's errors name the file and what it holds
    raise RunError(f"--model {model}: {e}") from None


def is_workdir(path: str) -> bool:
  """Whether `path` is a training run's workdir (its checkpoints, its config)."""
  return os.path.isdir(os.path.join(path, "checkpoints")) and not os.path.isfile(
      os.path.join(path, "config.json"))


def _run_encoder(workdir: str, dtype: str):
  """The SentenceEncoder of the training run `workdir`: its task's `sentence_encoder`."""
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
  return definition.sentence_encoder(workdir, dtype)


def texts_of(source: sources.Source, input_path: str, text_field: str,
             id_field: str) -> Iterator[tuple[object, str]]:
  """(id, text) of each text of `source`, in order."""
  try:
    if source.format == "text":
      for number, line in source.lines():
        if line.strip():
          yield number, line.rstrip("\r\n")
      return
    for number, record in source.records():
      text = record.get(text_field)
      if not isinstance(text, str):
        where = f"row {number}" if source.format == "parquet" else f"line {number}"
        raise RunError(f"--input {input_path}: {where}: {text_field!r} (--text-field) is "
                       f"{type(text).__name__}, expected a string")
      yield record.get(id_field, number), text
  except sources.PrepareError as e:
    raise RunError(str(e)) from None
  except OSError as e:
    raise RunError(f"--input {input_path}: cannot read it ({e.strerror or e})") from None


class _Npy:
  """float32 [total, dim], filled a chunk at a time through a memory map of the file."""

  def __init__(self, path: str, total: int, dim: int):
    self.array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32,
                                           shape=(total, dim))
    self.at = 0

  def write(self, ids: list, embeddings: np.ndarray) -> None:
    self.array[self.at:self.at + len(embeddings)] = embeddings
    self.at += len(embeddings)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.array.flush()
    del self.array  # closes the map before the file is renamed or removed


class _Parquet:
  """Row groups of (id, embedding), one a chunk."""

  def __init__(self, path: str, total: int, dim: int):
    import pyarrow as pa
    import pyarrow.parquet as pq
    self.pa = pa
    self.schema = pa.schema([("id", pa.string()), ("embedding", pa.list_(pa.float32(), dim))])
    self.writer = pq.ParquetWriter(path, self.schema)

  def write(self, ids: list, embeddings: np.ndarray) -> None:
    pa = self.pa
    column = pa.FixedSizeListArray.from_arrays(pa.array(embeddings.reshape(-1), pa.float32()),
                                               embeddings.shape[1])
    self.writer.write_table(pa.table([pa.array([str(i) for i in ids], pa.string()), column],
                                     schema=self.schema))

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.writer.close()


class _Jsonl:
  def __init__(self, path: str, total: int, dim: int):
    self.file = open(path, "w", encoding="utf-8")

  def write(self, ids: list, embeddings: np.ndarray) -> None:
    self.file.writelines(json.dumps({"id": i, "embedding": e}) + "\n"
                         for i, e in zip(ids, embeddings.tolist()))

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.file.close()


_WRITERS = {".npy": _Npy, ".parquet": _Parquet, ".jsonl": _Jsonl}


def check_arguments(input_path: str, out_path: str) -> str:
  """--out's format (its suffix); RunError naming the argument where the paths cannot be used,
  before the model is loaded and before the input could be overwritten."""
  if os.path.isdir(input_path):
    raise RunError(f"--input {input_path}: a directory, expected a .txt, .jsonl or .parquet "
                   f"file")
  if not os.path.isfile(input_path):
    raise RunError(f"--input {input_path}: no such file")
  suffix = os.path.splitext(out_path)[1].lower()
  if suffix not in OUT_FORMATS:
    raise RunError(f"--out {out_path}: ends in {suffix or 'no suffix'!r}, expected one of "
                   f"{', '.join(OUT_FORMATS)}")
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


def _interrupt(signum, frame):
  raise KeyboardInterrupt(signum)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m train.embed", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", required=True,
                      help="a sentence-transformers folder or Hugging Face model directory")
  parser.add_argument("--input", required=True, help=".txt, .jsonl or .parquet of texts")
  parser.add_argument("--out", required=True, help=".npy, .parquet or .jsonl")
  parser.add_argument("--text-field", default="text")
  parser.add_argument("--id-field", default="id")
  parser.add_argument("--prompt", help="text put before each text (e.g. 'query: ')")
  parser.add_argument("--prompt-name", help="one of the model's prompts, by name")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  args = parser.parse_args(argv)
  if args.prompt is not None and args.prompt_name is not None:
    parser.error("--prompt and --prompt-name: both given, expected one")
  previous = signal.signal(signal.SIGTERM, _interrupt)
  try:
    count = embed(args.model, args.input, args.out, args.text_field, args.id_field,
                  args.prompt, args.prompt_name, args.dtype, show=True)
  except RunError as e:
    print(f"embed: error: {e}", file=sys.stderr)
    return e.exit_code
  except KeyboardInterrupt as e:
    print(f"embed: stopped; {args.out} not written", file=sys.stderr)
    return 128 + (e.args[0] if e.args else signal.SIGINT)
  finally:
    signal.signal(signal.SIGTERM, previous)
  print(f"{args.out}: {count} embeddings")
  return 0


if __name__ == "__main__":
  sys.exit(main())
