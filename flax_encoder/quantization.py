"""Embeddings in fewer bytes: fewer dimensions (`truncate`, a Matryoshka model's first ones) and
fewer bits a dimension (`quantize`), as sentence-transformers gives them (`truncate_dim`,
`encode(precision=...)`, `quantize_embeddings`). Pure numpy: no JAX, so a reader of a corpus's parts needs no device.

    vectors = encoder(texts)                                   # float32 [n, dim]
    codes = quantize(vectors, "int8", ranges=int8_ranges(sample))  # int8 [n, dim]
    bits = quantize(vectors, "ubinary")                        # uint8 [n, ceil(dim / 8)]

int8 and uint8 cut each dimension's range, its minimum to its maximum over a calibration
sample, into 256 buckets; binary and ubinary keep one bit a dimension (whether it is above 0),
packed 8 to a byte, binary's as int8 (the byte less 128).
"""

from __future__ import annotations

import numpy as np

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
# each precision's numpy dtype
DTYPES = {"float32": np.float32, "int8": np.int8, "uint8": np.uint8, "binary": np.int8,
          "ubinary": np.uint8}


def width(dim: int, precision: str) -> int:
  """The values a vector of `dim` dimensions takes in `precision`: a byte a dimension, or 8
  dimensions a byte for binary and ubinary."""
  return (dim + 7) // 8 if precision.endswith("binary") else dim


class QuantizationError(ValueError):
  """A precision, ranges or vectors that cannot be quantized; one line naming the argument."""


def check_precision(precision) -> str:
  if precision not in PRECISIONS:
    raise QuantizationError(f"precision={precision!r}, expected one of {PRECISIONS}")
  return precision


def int8_ranges(calibration: np.ndarray) -> np.ndarray:
  """float32 [2, dim]: each dimension's minimum and maximum over the vectors `calibration`
  [n, dim], n >= 2 (the buckets of int8 and uint8)."""
  calibration = np.asarray(calibration)
  if calibration.ndim != 2 or len(calibration) < 2:
    raise QuantizationError(f"calibration: shape {calibration.shape}, expected [n, dim] of at "
                            f"least 2 vectors (each dimension's range)")
  return np.vstack((calibration.min(0), calibration.max(0))).astype(np.float32)


def quantize(vectors: np.ndarray, precision: str, ranges: np.ndarray | None = None
             ) -> np.ndarray:
  """`vectors` (float [n, dim]) in `precision`, equal to sentence-transformers'
  `quantize_embeddings(vectors, precision, ranges)`: float32; int8 or uint8 by the buckets of
  `ranges` ([2, dim]: `int8_ranges` of a calibration sample; where None, of `vectors`
  themselves, as `encode(precision=...)` takes them); binary (int8) or ubinary (uint8), the
  sign bits packed 8 to a byte."""
  check_precision(precision)
  vectors = np.asarray(vectors)
  if not np.issubdtype(vectors.dtype, np.floating):
    raise QuantizationError(f"vectors: {vectors.dtype}, expected floats (quantized once only)")
  if precision == "float32":
    return vectors.astype(np.float32)
  if precision in ("binary", "ubinary"):
    packed = np.packbits(vectors > 0, axis=-1)
    return (packed.astype(np.int16) - 128).astype(np.int8) if precision == "binary" else packed
  if ranges is None and (vectors.ndim != 2 or len(vectors) < 2):
    raise QuantizationError(f"ranges=None with vectors of shape {vectors.shape}: expected the "
                            f"ranges of a calibration sample (int8_ranges), or at least 2 "
                            f"vectors to take them from")
  ranges = int8_ranges(vectors) if ranges is None else np.asarray(ranges, np.float32)
  if ranges.shape != (2, vectors.shape[-1]):
    raise QuantizationError(f"ranges: shape {ranges.shape}, expected (2, {vectors.shape[-1]}) "
                            f"(each dimension's minimum and maximum)")
  # sentence-transformers' arithmetic, in float32: floor((x - min) / step), step = range / 255
  starts = ranges[0]
  steps = (ranges[1] - starts) / np.float32(255)
  steps = np.where(steps == 0, np.float32(1), steps)
  codes = np.clip(np.floor((vectors - starts) / steps), 0, 255)
  return codes.astype(np.uint8) if precision == "uint8" else (codes - 128).astype(np.int8)


def truncate(vectors: np.ndarray, dim: int | None) -> np.ndarray:
  """The first `dim` dimensions of each of `vectors` (all where None), as
  sentence-transformers' truncate_dim takes them: after the model's last module (a Normalize
  among them), so that a normalized model's truncated vectors are no longer of length 1."""
  return vectors if dim is None else vectors[..., :dim]


def check_truncate_dim(truncate_dim, dim: int, error: type[ValueError] = QuantizationError
                       ) -> int | None:
  """`truncate_dim` (None: no truncation) checked against the model's `dim`: an integer from 1
  to `dim`; `error` (the caller's type) in one line otherwise."""
  if truncate_dim is None:
    return None
  if isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int) or not (
      1 <= truncate_dim <= dim):
    raise error(f"truncate_dim={truncate_dim!r}, expected an integer from 1 to the model's "
                f"dimensions {dim}")
  return truncate_dim


_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], np.uint8)  # bits set in a byte


def hamming(queries: np.ndarray, corpus: np.ndarray) -> np.ndarray:
  """int [q, n]: the bits in which each of `queries` differs from each of `corpus` (both
  ubinary: uint8 [., bytes])."""
  queries, corpus = np.asarray(queries, np.uint8), np.asarray(corpus, np.uint8)
  if queries.ndim != 2 or corpus.ndim != 2 or queries.shape[1] != corpus.shape[1]:
    raise QuantizationError(f"ubinary vectors of shapes {queries.shape} and {corpus.shape}, "
                            f"expected [q, bytes] and [n, bytes] of the same bytes")
  out = np.empty((len(queries), len(corpus)), np.int32)
  rows = max(1, (1 << 26) // max(1, corpus.size))  # queries a step: about 64 MiB of XOR
  for start in range(0, len(queries), rows):
    xor = np.bitwise_xor(queries[start:start + rows, None, :], corpus[None])
    out[start:start + rows] = _POPCOUNT[xor].sum(-1, dtype=np.int32)
  return out


def search(queries: np.ndarray, corpus: np.ndarray, top_k: int = 10,
           rescore_multiplier: int = 2) -> tuple[np.ndarray, np.ndarray]:
  """(float [q, k] scores, int [q, k] corpus indices) of the `top_k` best of `corpus` (ubinary
  vectors, `quantize(..., "ubinary")`) for each of `queries` (float32 vectors of the same
  model), as sentence-transformers' quantized search does it (semantic_search_faiss with an
  exact binary index): the `top_k * rescore_multiplier` nearest in Hamming distance (the
  lower index first among equals), then rescored by the float query's dot product with each
  candidate's bits (0 or 1 a dimension) and the best `top_k` of those kept."""
  queries = np.asarray(queries)
  if queries.ndim != 2 or not np.issubdtype(queries.dtype, np.floating):
    raise QuantizationError(f"queries: {queries.dtype} {list(queries.shape)}, expected float "
                            f"[q, dim] (rescored in full precision)")
  for name, value in (("top_k", top_k), ("rescore_multiplier", rescore_multiplier)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise QuantizationError(f"{name}={value!r}, expected an integer >= 1")
  k = min(top_k * rescore_multiplier, len(corpus))
  distances = hamming(quantize(queries, "ubinary"), corpus)
  # the k smallest distances, ties to the lower index: a stable sort of each row
  candidates = np.argsort(distances, axis=1, kind="stable")[:, :k]
  bits = np.unpackbits(np.asarray(corpus, np.uint8)[candidates], axis=-1)[..., :queries.shape[1]]
  scores = np.einsum("ij,ikj->ik", queries.astype(np.float64), bits.astype(np.float64))
  best = np.argsort(-scores, axis=1, kind="stable")[:, :top_k]
  rows = np.arange(len(queries))[:, None]
  return scores[rows, best], candidates[rows, best]
