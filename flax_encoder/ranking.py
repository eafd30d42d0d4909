"""Ranking metrics of a run against relevance judgements, as trec_eval (and so pytrec_eval,
ir-measures and BEIR) computes them. Pure numpy and Python: a run and its judgements are dicts.

    run = {"q1": {"d3": 12.5, "d7": 11.0}, ...}      # query id -> {document id: score}
    qrels = {"q1": {"d7": 1, "d9": 2}, ...}           # query id -> {document id: relevance}
    metrics(run, qrels)  # {'ndcg_at_10': ..., 'mrr_at_10': ..., 'recall_at_100': ..., 'map_at_100': ...}

A query's documents are ranked by score, highest first, ties by document id, the greater first
(trec_eval's order, so that a tie ranks the same here and there). A document is relevant where
its relevance is at least 1; nDCG gains the relevance itself (graded), the ideal ranking
holding every judged document of the query, those the run missed included. A query the run
holds but the judgements do not is left out, as trec_eval leaves it out; a judged query the run
lacks counts 0 where `judged_missing="zero"`.
"""

from __future__ import annotations

import math
import re

import numpy as np

# name -> (measure, depth): the figures `metrics` gives by default
DEFAULT = {"ndcg_at_10": ("ndcg", 10), "mrr_at_10": ("mrr", 10),
           "recall_at_100": ("recall", 100), "map_at_100": ("map", 100)}
MEASURES = ("ndcg", "mrr", "recall", "map", "precision")
_NAME = re.compile(r"^(ndcg|mrr|recall|map|precision)_at_([1-9][0-9]*)$")


class RankingError(ValueError):
  """A run, judgements or measure that cannot be read; one line naming it."""


def measure(name: str) -> tuple[str, int]:
  """'ndcg_at_10' -> ('ndcg', 10); a one-line error for a name that is not MEASURE_at_DEPTH."""
  match = _NAME.match(name)
  if not match:
    raise RankingError(f"measure {name!r}, expected one of {MEASURES} then _at_ and a depth "
                       f"(e.g. ndcg_at_10)")
  return match.group(1), int(match.group(2))


def ranked(scores: dict) -> list:
  """A query's document ids in trec_eval's order: score descending, then id descending."""
  return sorted(scores, key=lambda doc: (-float(scores[doc]), _descending(doc)))


class _descending(str):
  """A document id that sorts in reverse (trec_eval breaks a tie by strcmp, the greater first)."""

  def __lt__(self, other):
    return str.__gt__(self, other)


def query_metrics(scores: dict, judged: dict, names=tuple(DEFAULT)) -> dict:
  """Each of `names` for one query: `scores` {doc: score} of the run, `judged` {doc: relevance}."""
  order = ranked(scores)
  relevance = [judged.get(doc, 0) for doc in order]
  relevant = sum(1 for r in judged.values() if r >= 1)
  out = {}
  for name in names:
    kind, depth = measure(name)
    top = relevance[:depth]
    hits = [r >= 1 for r in top]
    if kind == "ndcg":
      ideal = sorted((r for r in judged.values() if r > 0), reverse=True)[:depth]
      idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
      dcg = sum(r / math.log2(i + 2) for i, r in enumerate(top) if r > 0)
      out[name] = dcg / idcg if idcg > 0 else 0.0
    elif kind == "mrr":
      out[name] = next((1.0 / (i + 1) for i, hit in enumerate(hits) if hit), 0.0)
    elif kind == "recall":
      out[name] = sum(hits) / relevant if relevant else 0.0
    elif kind == "map":
      precisions = np.cumsum(hits) / np.arange(1, len(hits) + 1)
      out[name] = float(np.sum(precisions[np.asarray(hits, bool)])) / relevant if relevant else 0.0
    else:  # precision: over the depth, as trec_eval's P_k counts a short ranking's missing places
      out[name] = sum(hits) / depth
  return out


def metrics(run: dict, qrels: dict, names=tuple(DEFAULT), judged_missing: str = "skip",
            per_query: bool = False) -> dict:
  """The mean of each of `names` over the judged queries of `run` (or, with
  judged_missing="zero", over every judged query, those the run lacks scoring 0);
  `per_query=True` gives {query: {name: value}} instead."""
  if judged_missing not in ("skip", "zero"):
    raise RankingError(f"judged_missing={judged_missing!r}, expected 'skip' or 'zero'")
  for name in names:
    measure(name)
  queries = [q for q in qrels if q in run] if judged_missing == "skip" else list(qrels)
  each = {q: query_metrics(run.get(q, {}), qrels[q], names) for q in queries}
  if per_query:
    return each
  return {name: float(np.mean([m[name] for m in each.values()])) if each else 0.0
          for name in names}


def diagonal_metrics(similarity, names=("mrr_at_10", "ndcg_at_10", "recall_at_1",
                                         "recall_at_10")) -> dict:
  """The mean of each of `names` over the rows of `similarity` [queries, candidates], where
  candidate i is query i's one relevant document (relevance 1): what `metrics` gives for that
  run when the relevant candidate's id is the least of its query's. trec_eval breaks a tie by
  id, the greater first, so a candidate scored as high as the relevant one ranks above it: a
  model that scores everything alike ranks last. Vectorised, for the held-out pairs a
  training task ranks every evaluation."""
  parsed = [(name, *measure(name)) for name in names]
  similarity = np.asarray(similarity, np.float64)
  if similarity.ndim != 2 or similarity.shape[0] > similarity.shape[1]:
    raise RankingError(f"similarity of shape {similarity.shape}, expected [queries, "
                       f"candidates] with a candidate for each query")
  relevant = np.diagonal(similarity)[:, None]
  # 1-based: the candidates scored at least as high, the relevant one among them
  rank = np.maximum(np.sum(similarity >= relevant, axis=1), 1).astype(np.float64)
  per_rank = {"ndcg": lambda r: 1 / np.log2(r + 1),  # one relevant: the ideal DCG is 1
              "mrr": lambda r: 1 / r, "map": lambda r: 1 / r,  # its precision where it ranks
              "recall": lambda r: np.ones_like(r)}
  out = {}
  for name, kind, depth in parsed:
    within = rank <= depth
    gain = 1.0 / depth if kind == "precision" else per_rank[kind](rank)
    out[name] = float(np.mean(np.where(within, gain, 0.0))) if len(rank) else 0.0
  return out


def top_k(run: dict, k: int) -> dict:
  """The run with each query's first `k` documents in trec_eval's order."""
  return {q: {doc: scores[doc] for doc in ranked(scores)[:k]} for q, scores in run.items()}


def run_lines(run: dict, tag: str = "flax-encoder") -> list[str]:
  """The run as TREC run-file lines, `query Q0 document rank score tag`, each query's in
  trec_eval's order, rank from 1."""
  lines = []
  for query, scores in run.items():
    for rank, doc in enumerate(ranked(scores), 1):
      lines.append(f"{query} Q0 {doc} {rank} {float(scores[doc]):.9g} {tag}\n")
  return lines


def read_run(lines, where: str = "run") -> dict:
  """A TREC run file's lines (`query Q0 document rank score tag`) as {query: {doc: score}}."""
  run: dict = {}
  for number, line in enumerate(lines, 1):
    fields = line.split()
    if not fields:
      continue
    if len(fields) != 6:
      raise RankingError(f"{where}:{number}: {len(fields)} fields, expected 6 (query Q0 "
                         f"document rank score tag)")
    try:
      score = float(fields[4])
    except ValueError:
      raise RankingError(f"{where}:{number}: score {fields[4]!r}, expected a number") from None
    run.setdefault(fields[0], {})[fields[2]] = score
  return run
