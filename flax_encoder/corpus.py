"""A corpus's embeddings in parts: the folder `python -m train.embed --out DIR/` writes, read
back in input order.

    ids, vectors = read_embeddings("embeddings/")         # all of it: ids, vectors [n, dim]
    for ids, vectors in iter_embeddings("embeddings/"):   # a part at a time
      ...

The folder holds plain files:

  manifest.json     what was embedded and how: `model` (its fingerprint, dimension, pooling,
                    normalisation, max_seq_length, prompt, dtype, truncate_dim, quantize,
                    precision and, for int8 and uint8, ranges), `input` (its name, format,
                    size and fingerprint), `fields`, `part_bytes`; once every part is
                    written, `complete` true and `parts`: each one's file, rows, lines,
                    first line and SHA-256.
  part-00000.npy    float32 [rows, dim] (or `model.precision`'s: flax_encoder.quantization),
                    part 0's texts' embeddings in input order.
  part-00000.ids.json  part 0's texts: `line`, each text's line (Parquet: row) number
                    within the part, from 1; `ids`, each text's id where the input gives one
                    (null where not), or null where it gives none.
  part-00000.json   about part 0: `rows`, `lines` (the lines it holds, blank ones too), the
                    `sha256` of its .npy and .ids.json, `run` (the manifest's key). Written
                    after the other two, it marks the part done.

Part k holds the lines that start in bytes [k * part_bytes, (k + 1) * part_bytes) of the input
(decompressed, where it is compressed), or the k-th run of a Parquet file's row groups. A text's
id is the input's (`fields.id`) where it has one, else its line (row) number in the whole input,
counted from 1: the lines of the parts before its own, plus its number within its part.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator

import numpy as np

from flax_encoder import quantization
from flax_encoder.modules_json import read_json

MANIFEST = "manifest.json"
FORMAT = "flax-encoder embeddings"
VERSION = 1
# A part's .npy header, always this long: written first with room to spare, its shape filled
# in once the part's rows are counted.
HEADER_BYTES = 128


class CorpusError(ValueError):
  """A folder of parts that cannot be read as one: one line naming the file and what is wrong."""


_MARKER = re.compile(r"part-(\d+)\.json")


def part_name(index: int) -> str:
  return f"part-{index:05d}"


def done_parts(names) -> list[int]:
  """The parts whose marker (part-K.json) is among the file `names`."""
  return [int(m[1]) for m in map(_MARKER.fullmatch, names) if m]


def run_key(header: dict) -> str:
  """What identifies a run's parts: a SHA-256 of its manifest's header, less the paths (the
  input or the model moved is the same run) and what completion adds."""
  kept = {k: v for k, v in header.items() if k not in ("complete", "parts", "key")}
  kept["model"] = {k: v for k, v in kept["model"].items() if k != "path"}
  kept["input"] = {k: v for k, v in kept["input"].items() if k != "path"}
  return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def npy_header(rows: int, dim: int, dtype=np.float32) -> bytes:
  """The HEADER_BYTES of a [rows, dim] .npy file of `dtype` (little-endian)."""
  import io
  out = io.BytesIO()
  descr = np.lib.format.dtype_to_descr(np.dtype(dtype).newbyteorder("<"))
  np.lib.format.write_array_header_1_0(out, {"descr": descr, "fortran_order": False,
                                             "shape": (rows, dim)})
  header = out.getvalue()
  # numpy pads its header to a multiple of 64 bytes: pad it on to HEADER_BYTES
  return header[:-1] + b" " * (HEADER_BYTES - len(header)) + b"\n"


def sha256_of(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while block := f.read(1 << 24):
      digest.update(block)
  return digest.hexdigest()


def _json(path: str) -> dict:
  return read_json(path, CorpusError, dict, required=True)


# What the manifest says of each part, and its type.
_PART = {"file": str, "rows": int, "first_line": int, "sha256": str, "ids_sha256": str}


def read_manifest(directory: str) -> dict:
  """The manifest of a folder of parts, checked as far as the readers read it; CorpusError
  naming the file and the field where it is not one, or not complete."""
  file = os.path.join(directory, MANIFEST)
  manifest = _json(file)
  if manifest.get("format") != FORMAT:
    raise CorpusError(f"{file}: format {manifest.get('format')!r}, expected {FORMAT!r}")
  if not manifest.get("complete"):
    done = len(done_parts(os.listdir(directory)))
    raise CorpusError(f"{directory}: incomplete ({done} parts written so far): run the same "
                      f"`python -m train.embed` again to finish it")
  model, parts = manifest.get("model"), manifest.get("parts")
  dim = model.get("dim") if isinstance(model, dict) else None
  if not _integer(dim) or dim < 1:
    raise CorpusError(f"{file}: model.dim={_excerpt(dim)}, expected an integer >= 1")
  if model.get("precision", "float32") not in quantization.PRECISIONS:
    raise CorpusError(f"{file}: model.precision={_excerpt(model['precision'])}, expected one of "
                      f"{quantization.PRECISIONS}")
  if not isinstance(parts, list):
    raise CorpusError(f"{file}: parts={_excerpt(parts)}, expected a list of the parts")
  for i, part in enumerate(parts):
    if not isinstance(part, dict):
      raise CorpusError(f"{file}: parts[{i}]={_excerpt(part)}, expected an object")
    for key, kind in _PART.items():
      value = part.get(key)
      if not (_integer(value) and value >= 0 if kind is int else isinstance(value, kind)):
        raise CorpusError(f"{file}: parts[{i}].{key}={_excerpt(value)}, expected "
                          f"{'an integer >= 0' if kind is int else 'a string'}")
    if part["file"] != os.path.basename(part["file"]) or not part["file"].endswith(".npy"):
      raise CorpusError(f"{file}: parts[{i}].file={part['file']!r}, expected the name of a "
                        f".npy file of the folder")
  return manifest


def _integer(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _excerpt(value) -> str:
  said = repr(value)
  return said if len(said) <= 60 else said[:57] + "..."


def stored(model: dict) -> tuple[np.dtype, int]:
  """(dtype, values a row) of the parts of a manifest's `model`: float32 [dim], or its
  precision's."""
  precision = model.get("precision", "float32")
  return np.dtype(quantization.DTYPES[precision]), quantization.width(model["dim"], precision)


def iter_embeddings(directory: str, verify: bool = True) -> Iterator[tuple[list, np.ndarray]]:
  """(ids, [rows, dim] vectors: float32, or the manifest's model.precision) of each part in
  input order. `verify`: each part's SHA-256 is checked against the manifest's first."""
  manifest = read_manifest(directory)
  dtype, dim = stored(manifest["model"])
  for part in manifest["parts"]:
    path = os.path.join(directory, part["file"])
    ids_file = path[:-len(".npy")] + ".ids.json"
    for file in (path, ids_file):
      if not os.path.isfile(file):
        raise CorpusError(f"{file}: no such file, which {MANIFEST} lists: the folder lost it "
                          f"since it was written")
    if verify and sha256_of(path) != part["sha256"]:
      raise CorpusError(f"{path}: its SHA-256 differs from the manifest's: changed or damaged "
                        f"since it was written")
    try:
      vectors = np.load(path)
    except (OSError, ValueError, EOFError) as e:
      raise CorpusError(f"{path}: not a .npy file numpy reads ({e})") from None
    if vectors.shape != (part["rows"], dim) or vectors.dtype != dtype:
      raise CorpusError(f"{path}: {vectors.dtype} {list(vectors.shape)}, expected {dtype} "
                        f"[{part['rows']}, {dim}]")
    if verify and sha256_of(ids_file) != part["ids_sha256"]:
      raise CorpusError(f"{ids_file}: its SHA-256 differs from the manifest's: changed or "
                        f"damaged since it was written")
    about = _json(ids_file)
    lines, given = about.get("line"), about.get("ids")
    if not (isinstance(lines, list) and len(lines) == part["rows"] and all(map(_integer, lines))):
      raise CorpusError(f"{ids_file}: line={_excerpt(lines)}, expected the line numbers of its "
                        f"{part['rows']} texts")
    if given is not None and not (isinstance(given, list) and len(given) == len(lines)):
      raise CorpusError(f"{ids_file}: ids={_excerpt(given)}, expected null or the ids of its "
                        f"{part['rows']} texts")
    given = given or [None] * len(lines)
    ids = [i if i is not None else part["first_line"] + line for i, line in zip(given, lines)]
    yield ids, vectors


def read_embeddings(directory: str, verify: bool = True) -> tuple[list, np.ndarray]:
  """(ids, [texts, dim] vectors: float32, or the precision the folder was written in: its
  manifest's model.precision, int8's ranges its model.ranges) of a folder `python -m
  train.embed --out DIR/` wrote, in input order. CorpusError in one line where the folder is
  incomplete or damaged."""
  ids, parts = [], []
  for part_ids, vectors in iter_embeddings(directory, verify):
    ids += part_ids
    parts.append(vectors)
  dtype, dim = stored(read_manifest(directory)["model"])
  return ids, np.concatenate(parts) if parts else np.zeros((0, dim), dtype)
