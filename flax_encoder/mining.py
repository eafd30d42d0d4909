"""Hard negatives: for each query, the corpus's documents a model scores highest that are not
its positives, as sentence-transformers' `mine_hard_negatives` chooses them. Pure numpy, on
the candidates a search found (`flax_encoder.search.top_k` of the query and corpus vectors,
unit-normalised, as theirs are):

    scores, ids = search.top_k(dense_scores(similarity), queries, corpus, candidates(...))
    negatives, negative_scores = hard_negatives(scores, ids, positives, positive_scores, ...)

Of a query's candidates, those left out are: the query's own text where the corpus holds it,
its positives, any within `absolute_margin` of its lowest positive's score (or above it less
`relative_margin` of that score's size), any above `max_score` or below `min_score`. Of the
rest, ranked by score, the first `range_min` are passed over, and of the next ones up to
`range_max` the `num_negatives` best are kept ("top"), or that many drawn at random
("random"), best first. A query with fewer left has fewer, -1 (score -inf) filling its row.
"""

from __future__ import annotations

import numpy as np

SAMPLING = ("top", "random")


class MiningError(ValueError):
  """Options that cannot mine; one line naming the option."""


def default_range_max(range_min: int, num_negatives: int, max_positives: int,
                      filtering: bool) -> int:
  """The candidates ranked where range_max is not given: num_negatives past range_min (ten
  times as many where margins or score bounds may filter some out), plus room for the
  positives."""
  return range_min + num_negatives * (10 if filtering else 1) + max_positives


def candidates(range_max: int, max_positives: int) -> int:
  """Documents to find per query: range_max, and room for its positives and itself."""
  return range_max + max_positives + 1


def check(range_min: int, range_max: int, num_negatives: int, sampling: str) -> None:
  if num_negatives < 1:
    raise MiningError(f"num_negatives={num_negatives}, expected at least 1")
  if range_min < 0:
    raise MiningError(f"range_min={range_min}, expected 0 or more")
  if range_min >= range_max:
    raise MiningError(f"range_min={range_min}, expected below range_max={range_max}")
  if num_negatives > range_max - range_min:
    raise MiningError(f"num_negatives={num_negatives}, but only {range_max - range_min} "
                      f"candidates lie between range_min={range_min} and "
                      f"range_max={range_max}: widen the range or ask for fewer")
  if sampling not in SAMPLING:
    raise MiningError(f"sampling={sampling!r}, expected one of {SAMPLING}")


def hard_negatives(scores: np.ndarray, ids: np.ndarray, positives: list[list[int]],
                   positive_scores: list[np.ndarray], own: np.ndarray, *, range_max: int,
                   range_min: int = 0, num_negatives: int = 3,
                   absolute_margin: float | None = None, relative_margin: float | None = None,
                   max_score: float | None = None, min_score: float | None = None,
                   sampling: str = "top", seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """(int64 [q, num_negatives] corpus indices, -1 where none is left; float32 [q,
  num_negatives] their scores, -inf there) of each query's hard negatives.

  Args:
    scores, ids: [q, c] each query's candidates, best first (ids -1: none).
    positives: each query's positives, as corpus indices.
    positive_scores: each query's positives' scores (the margins are from the lowest).
    own: [q] the corpus index of each query's own text, -1 where the corpus lacks it.
  """
  check(range_min, range_max, num_negatives, sampling)
  scores = np.array(scores, np.float32)
  ids = np.asarray(ids, np.int64)
  scores[ids < 0] = -np.inf
  scores[ids == np.asarray(own, np.int64)[:, None]] = -np.inf
  for q, found in enumerate(positives):
    scores[q, np.isin(ids[q], found)] = -np.inf
  lowest = np.array([np.min(s) for s in positive_scores], np.float32)[:, None]
  # float32 throughout, as sentence-transformers compares them
  if absolute_margin is not None:
    scores[scores + np.float32(absolute_margin) > lowest] = -np.inf
  if relative_margin is not None:
    scores[scores > lowest - np.abs(lowest) * np.float32(relative_margin)] = -np.inf
  if max_score is not None:
    scores[scores > np.float32(max_score)] = -np.inf
  if min_score is not None:
    scores[scores < np.float32(min_score)] = -np.inf
  order = np.argsort(-scores, axis=1, kind="stable")[:, range_min:range_max]
  ranked, ranked_ids = np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)
  if sampling == "random":
    rng = np.random.default_rng(seed)
    left = np.maximum(np.isfinite(ranked).sum(1), num_negatives)
    drawn = np.stack([np.sort(rng.choice(n, num_negatives, replace=False)) for n in left]
                     ) if len(left) else np.zeros((0, num_negatives), np.int64)
    ranked, ranked_ids = (np.take_along_axis(ranked, drawn, 1),
                          np.take_along_axis(ranked_ids, drawn, 1))
  kept, kept_ids = ranked[:, :num_negatives], ranked_ids[:, :num_negatives].copy()
  kept_ids[~np.isfinite(kept)] = -1
  return kept_ids, kept
