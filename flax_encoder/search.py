"""Exact top-k search of a corpus: every query scored against every document, in chunks of
documents spread over the devices, each chunk's best k kept on its device, the chunks' merged
on the host.

    scores, ids = top_k(dense_scores("cosine"), queries, documents, k=100)   # [q, k] each

`score(queries, documents)` is any jittable function of the query arrays and one chunk of the
document arrays (a leading axis of documents) giving float32 [q, chunk] scores:
`dense_scores`, `sparse_scores` (vectors as dense rows of the vocabulary) and `maxsim_scores`
(token vectors padded to [n, t, d] with their mask) are the three kinds of model's. Of equal
scores the earlier document comes first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder import multi_vector

# Scores a chunk computes at once, at most ([queries, chunk] float32: 256 MiB)
CHUNK_SCORES = 64 * 2**20
SIMILARITIES = ("cosine", "dot", "euclidean", "manhattan")


class SearchError(ValueError):
  """A search that cannot run as asked; one line naming the argument."""


def _unit(x):
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def dense_scores(similarity: str = "cosine") -> Callable:
  """Scores of [q, d] query vectors against [c, d] documents as sentence-transformers'
  `similarity_fn_name` gives them: cosine, dot, or the negative euclidean or manhattan
  distance."""
  if similarity not in SIMILARITIES:
    raise SearchError(f"similarity={similarity!r}, expected one of {SIMILARITIES}")

  def score(queries, documents):
    q, d = queries.astype(jnp.float32), documents.astype(jnp.float32)
    if similarity == "cosine":
      q, d = _unit(q), _unit(d)
    if similarity in ("cosine", "dot"):
      return jnp.einsum("qd,cd->qc", q, d, precision=jax.lax.Precision.HIGHEST)
    if similarity == "euclidean":
      return -jnp.sqrt(jnp.maximum(jnp.sum((q[:, None] - d[None]) ** 2, -1), 0))
    return -jnp.sum(jnp.abs(q[:, None] - d[None]), -1)

  score.per_element = similarity in ("euclidean", "manhattan")  # [q, c, d] at once
  return score


def dense_pairwise(similarity: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """float32 [n]: `dense_scores`' score of a[i] against b[i] alone, in numpy."""
  if similarity not in SIMILARITIES:
    raise SearchError(f"similarity={similarity!r}, expected one of {SIMILARITIES}")
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  if similarity == "cosine":
    a, b = (x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12) for x in (a, b))
  if similarity in ("cosine", "dot"):
    return np.sum(a * b, -1)
  if similarity == "euclidean":
    return -np.sqrt(np.sum((a - b) ** 2, -1))
  return -np.sum(np.abs(a - b), -1)


def sparse_scores(similarity: str = "dot") -> Callable:
  """Scores of sparse vectors held as dense [*, vocabulary] rows: dot, or cosine (a vector
  with no active dimension scoring 0), as sentence-transformers' SparseEncoder gives them."""
  if similarity not in ("dot", "cosine"):
    raise SearchError(f"similarity={similarity!r}, expected 'dot' or 'cosine'")
  dense = dense_scores("dot")

  def score(queries, documents):
    if similarity == "dot":
      return dense(queries, documents)
    norms = lambda x: jnp.linalg.norm(x.astype(jnp.float32), axis=-1)
    nq, nd = norms(queries)[:, None], norms(documents)[None, :]
    return jnp.where(nq * nd > 0, dense(queries, documents) / jnp.maximum(nq * nd, 1e-30), 0.0)

  return score


def maxsim_scores(mean: bool = False) -> Callable:
  """ColBERT's MaxSim of ([q, s, d] query vectors, [q, s] mask) against ([c, t, d] documents,
  [c, t] mask): `flax_encoder.multi_vector.maxsim`."""

  def score(queries, documents):
    (q, q_mask), (d, d_mask) = queries, documents
    return multi_vector.maxsim(q, q_mask, d, d_mask, mean)

  return score


def _leaves_rows(tree) -> int:
  rows = {len(x) for x in jax.tree.leaves(tree)}
  if len(rows) != 1:
    raise SearchError(f"documents: arrays of {sorted(rows)} rows, expected the same")
  return rows.pop()


def top_k(score: Callable, queries, documents, k: int, chunk: int | None = None,
          devices: Sequence[jax.Device] | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(float32 [q, k'] scores, int64 [q, k'] document indices), k' = min(k, documents): each
  query's k highest-scoring documents, best first, of equal scores the earlier document first.

  Args:
    score: the scores of the queries against one chunk of documents (`dense_scores` ...).
    queries, documents: arrays, or tuples of arrays (a leading axis of queries, documents).
    k: documents kept per query.
    chunk: documents scored at once on a device (default: CHUNK_SCORES scores at most).
    devices: where the chunks are scored, in turn (default: this process's devices).
  """
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
    raise SearchError(f"k={k!r}, expected an integer >= 1")
  n, n_queries = _leaves_rows(documents), _leaves_rows(queries)
  if n == 0 or n_queries == 0:
    return np.zeros((n_queries, 0), np.float32), np.zeros((n_queries, 0), np.int64)
  if chunk is None:
    per_document = n_queries * (max(x.shape[-1] for x in jax.tree.leaves(queries))
                                if getattr(score, "per_element", False) else 1)
    chunk = max(1, min(n, CHUNK_SCORES // per_document))
  k = min(int(k), n)
  devices = list(devices or jax.local_devices())
  placed = [jax.device_put(queries, device) for device in devices]
  best = _chunk_top_k(score, min(k, chunk))
  found = []
  for i, start in enumerate(range(0, n, chunk)):
    part = jax.tree.map(lambda x: _padded(np.asarray(x[start:start + chunk]), chunk), documents)
    device = i % len(devices)
    part = jax.device_put(part, devices[device])
    present = jax.device_put(np.arange(chunk) < n - start, devices[device])
    values, index = best(placed[device], part, present)  # dispatched: the devices work at once
    found.append((values, index + start))
  values = np.concatenate([np.asarray(v) for v, _ in found], axis=1)
  index = np.concatenate([np.asarray(i) for _, i in found], axis=1).astype(np.int64)
  order = np.lexsort((index, -values.astype(np.float64)), axis=1)[:, :k]
  return (np.take_along_axis(values, order, 1).astype(np.float32),
          np.take_along_axis(index, order, 1))


def dense_top_k(similarity: str, queries: np.ndarray, documents: np.ndarray, k: int
                ) -> tuple[np.ndarray, np.ndarray]:
  """`top_k` of `dense_scores(similarity)`; where JAX computes on the CPU and FAISS is
  installed, FAISS's exact inner-product index instead for cosine and dot, which finds the same
  documents 2.2 times as fast on a 2-core CPU (benchmarks/search.py, BENCHMARKS.md)."""
  if similarity in ("cosine", "dot") and jax.default_backend() == "cpu":
    try:
      import faiss
    except ImportError:
      faiss = None
    if faiss is not None and len(documents):
      q, d = (np.ascontiguousarray(x, np.float32) for x in (queries, documents))
      if similarity == "cosine":
        q, d = (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12) for x in (q, d))
      index = faiss.IndexFlatIP(d.shape[1])
      index.add(d)
      scores, ids = index.search(q, min(int(k), len(d)))
      order = np.lexsort((ids, -scores.astype(np.float64)), axis=1)  # ties: the earlier first
      return (np.take_along_axis(scores, order, 1).astype(np.float32),
              np.take_along_axis(ids, order, 1).astype(np.int64))
  return top_k(dense_scores(similarity), queries, documents, k)


def _padded(x: np.ndarray, rows: int) -> np.ndarray:
  return x if len(x) == rows else np.concatenate(
      [x, np.zeros((rows - len(x), *x.shape[1:]), x.dtype)])


@functools.lru_cache(maxsize=16)  # one jit per scorer and k: a call per block of queries
def _chunk_top_k(score: Callable, k: int):
  @jax.jit
  def best(queries, documents, present):
    scores = jnp.where(present[None, :], score(queries, documents).astype(jnp.float32),
                       -jnp.inf)
    return jax.lax.top_k(scores, k)  # of equal values, the lower index first

  return best
