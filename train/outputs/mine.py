r"""Hard negatives for (anchor, positive) lines, mined from a corpus with a model.

  python -m train.mine --model all-MiniLM-L6-v2 --input pairs.jsonl --out mined.jsonl

Each line of --input is a JSON object with an anchor and a positive ("anchor", "positive":
--anchor-field, --positive-field). The corpus is the positives, and the texts of --corpus
(.txt, a text a line; .jsonl or .parquet, the --corpus-field of each) where given. --beir DIR
takes a BEIR folder instead (train.evaluate's): the judged (query, document) pairs of its
--split (train), mined from its whole corpus. The model
(a sentence-transformers folder, a Hugging Face model directory or a contrastive run's workdir)
embeds the distinct anchors and the corpus, unit-normalised; each anchor is scored against
the whole corpus on every device (flax_encoder.search), and its negatives are chosen as
sentence-transformers' `mine_hard_negatives` chooses them (flax_encoder.mining: the same
options, the same negatives for "top"). With --scorer, a reranker (a CrossEncoder folder)
scores each anchor's candidates and positives instead, and the margins and bounds apply to
its scores.

Each line of --out is an input line's {"anchor", "positive", "negative": [texts, best
first]}, in input order, and "scores" ([the positive's, then each negative's]) with --scorer
or --scores: the teacher scores that distillation (config.task.loss=margin_mse, kl) reads. A
line left without a negative (all filtered out) is not written; the command says how many.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np

from flax_encoder import mining, search
from train.cli import HelpFormatter
from train.data import beir, examples, sources
from train.errors import RunError
from train.files import special_kind, unwritable_kind, written_whole


def read_pairs(path: str, anchor_field: str, positive_field: str) -> list[tuple[str, str]]:
  """(anchor, positive) of each line of `path`."""
  if special_kind(path) or not os.path.isfile(path):
    raise RunError(f"--input {path}: {special_kind(path) or 'no such file'}, expected a .jsonl "
                   f"or .parquet of {anchor_field!r} and {positive_field!r}")
  pairs = []
  for number, record in examples.records(sources.Source(path)):
    texts = []
    for field, flag in ((anchor_field, "--anchor-field"), (positive_field, "--positive-field")):
      value = record.get(field)
      if not isinstance(value, str) or not value.strip():
        got = "no such field" if field not in record else f"got {value!r}"[:60]
        raise RunError(f"{path}:{number}: {field!r} ({flag}): {got}, expected a non-empty "
                       f"string")
      texts.append(value)
    pairs.append(tuple(texts))
  if not pairs:
    raise RunError(f"--input {path}: no lines, expected (anchor, positive) lines")
  return pairs


def beir_pairs(directory: str, split: str) -> tuple[list[tuple[str, str]], list[str]]:
  """(query, document) of each judged-relevant pair of a BEIR folder's `split` (relevance 1 or
  more), in its qrels' order; and its whole corpus."""
  data = beir.read(directory, split)
  text = dict(zip(data.corpus_ids, data.documents))
  queries = dict(zip(data.query_ids, data.queries))
  pairs = [(queries[q], text[d]) for q, judged in data.qrels.items() for d, r in judged.items()
           if r >= 1 and d in text]
  if not pairs:
    raise RunError(f"--beir {directory}: no relevant (query, document) pair in qrels/{split}.tsv")
  return pairs, data.documents


def read_corpus(path: str, field: str) -> list[str]:
  """The texts of --corpus."""
  from train.outputs.embed import texts_of
  if special_kind(path) or not os.path.isfile(path):
    raise RunError(f"--corpus {path}: {special_kind(path) or 'no such file'}, expected a .txt, "
                   f".jsonl or .parquet of texts")
  try:
    source = sources.Source(path)
  except sources.PrepareError as e:
    raise RunError(f"--corpus {e}") from None
  return [text for _, text in texts_of(source, path, field, None)]


def _unit(x: np.ndarray) -> np.ndarray:
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def mine(model: str, pairs: list[tuple[str, str]], corpus: list[str] | None = None, *,
         num_negatives: int = 3, range_min: int = 0, range_max: int | None = None,
         absolute_margin: float | None = None, relative_margin: float | None = None,
         max_score: float | None = None, min_score: float | None = None,
         sampling: str = "top", seed: int = 0, scorer: str | None = None,
         dtype: str = "float32", say=lambda message: None) -> list[dict]:
  """Each pair's line of --out (in order; None for a pair left without a negative)."""
  from train.outputs.embed import load_encoder
  anchors = list(dict.fromkeys(a for a, _ in pairs))
  texts = list(dict.fromkeys([*(corpus or []), *(p for _, p in pairs)]))
  at = {text: i for i, text in enumerate(texts)}
  query_at = {a: i for i, a in enumerate(anchors)}
  positives = [[] for _ in anchors]
  for a, p in pairs:
    if at[p] not in positives[query_at[a]]:
      positives[query_at[a]].append(at[p])
  most = max(len(p) for p in positives)
  filtering = (absolute_margin is not None or relative_margin is not None or
               max_score is not None or (scorer is not None and min_score is not None))
  if range_max is None:
    range_max = mining.default_range_max(range_min, num_negatives, most, filtering)
  try:
    mining.check(range_min, range_max, num_negatives, sampling)
  except mining.MiningError as e:  # named as the option's flag: num_negatives= -> --num-negatives
    raise RunError(re.sub(r"\b([a-z_]+)=", lambda m: f"--{m.group(1).replace('_', '-')} ",
                          str(e))) from None
  encoder = load_encoder(model, dtype)
  say(f"embedding {len(texts)} corpus texts and {len(anchors)} anchors")
  documents = _unit(np.asarray(encoder.encode_document(texts), np.float32))
  queries = _unit(np.asarray(encoder.encode_query(anchors), np.float32))
  say(f"searching {len(texts)} texts for each anchor's {mining.candidates(range_max, most)} best")
  scores, ids = search.dense_top_k(encoder.similarity, queries, documents,
                                   mining.candidates(range_max, most))
  owner = np.repeat(np.arange(len(anchors)), [len(p) for p in positives])
  flat = search.dense_pairwise(encoder.similarity, queries[owner],
                               documents[np.concatenate(positives)])
  positive_scores = np.split(flat, np.cumsum([len(p) for p in positives])[:-1])
  if scorer is not None:
    scores, positive_scores = _rescored(scorer, dtype, anchors, texts, ids, positives, say)
  negatives, negative_scores = mining.hard_negatives(
      scores, ids, positives, positive_scores, np.array([at.get(a, -1) for a in anchors]),
      range_max=range_max, range_min=range_min, num_negatives=num_negatives,
      absolute_margin=absolute_margin, relative_margin=relative_margin, max_score=max_score,
      min_score=min_score, sampling=sampling, seed=seed)
  lines = []
  for a, p in pairs:
    q = query_at[a]
    kept = negatives[q] >= 0
    if not kept.any():
      lines.append(None)
      continue
    line = {"anchor": a, "positive": p, "negative": [texts[i] for i in negatives[q][kept]]}
    line["scores"] = [float(positive_scores[q][positives[q].index(at[p])]),
                      *map(float, negative_scores[q][kept])]
    lines.append(line)
  return lines


def _rescored(folder: str, dtype: str, anchors: list[str], texts: list[str], ids: np.ndarray,
              positives: list[list[int]], say) -> tuple[np.ndarray, list[np.ndarray]]:
  """The reranker's scores (its activation applied, as CrossEncoder.predict gives them) of each
  anchor's candidates and positives."""
  from flax_encoder.cross_encoder import Reranker
  try:
    reranker = Reranker.load(folder, dtype=dtype)
  except ValueError as e:
    raise RunError(f"--scorer {folder}: {e}") from None
  pairs = [(anchors[q], texts[i]) for q in range(len(anchors)) for i in ids[q] if i >= 0]
  pairs += [(anchors[q], texts[i]) for q in range(len(anchors)) for i in positives[q]]
  say(f"scoring {len(pairs)} (anchor, text) pairs with the reranker")
  predicted = np.asarray(reranker.predict(pairs), np.float32).reshape(len(pairs), -1)[:, 0]
  scores = np.full(ids.shape, -np.inf, np.float32)
  scores[ids >= 0] = predicted[:int((ids >= 0).sum())]
  rest = iter(predicted[int((ids >= 0).sum()):])
  return scores, [np.array([next(rest) for _ in p], np.float32) for p in positives]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m train.mine", description=__doc__,
                                   formatter_class=HelpFormatter)
  parser.add_argument("--model", required=True, help="a sentence-transformers folder, a Hugging "
                      "Face model directory or a contrastive run's workdir")
  source = parser.add_mutually_exclusive_group(required=True)
  source.add_argument("--input", help=".jsonl or .parquet of (anchor, positive)")
  source.add_argument("--beir", help="a BEIR folder instead: its --split's judged (query, "
                      "document) pairs, mined from its whole corpus")
  parser.add_argument("--split", default="train", choices=beir.SPLITS,
                      help="the qrels of --beir whose pairs are mined")
  parser.add_argument("--out", required=True, help="the mined lines, .jsonl")
  parser.add_argument("--corpus", help="more texts to mine from: .txt, .jsonl or .parquet")
  parser.add_argument("--corpus-field", default="text", help="the text field of --corpus")
  parser.add_argument("--anchor-field", default="anchor")
  parser.add_argument("--positive-field", default="positive")
  parser.add_argument("--num-negatives", type=int, default=3, help="negatives per anchor")
  parser.add_argument("--range-min", type=int, default=0,
                      help="the best candidates passed over (likely unlabelled positives)")
  parser.add_argument("--range-max", type=int, help="the candidates ranked at most (default: "
                      "range-min + num-negatives, ten times as many with a margin or bound, "
                      "+ the most positives an anchor has)")
  parser.add_argument("--margin", type=float, help="leave out candidates scoring within this "
                      "of the anchor's lowest positive (sentence-transformers' "
                      "absolute_margin)")
  parser.add_argument("--relative-margin", type=float, help="leave out candidates above the "
                      "lowest positive's score less this fraction of it")
  parser.add_argument("--max-score", type=float, help="leave out candidates scoring above it")
  parser.add_argument("--min-score", type=float, help="leave out candidates scoring below it")
  parser.add_argument("--sampling", default="top", choices=mining.SAMPLING,
                      help="the best negatives, or drawn at random from the range")
  parser.add_argument("--seed", type=int, default=0, help="the draw of --sampling random")
  parser.add_argument("--scorer", help="a reranker (CrossEncoder folder) scoring the "
                      "candidates instead of --model; its scores are written")
  parser.add_argument("--scores", action="store_true",
                      help="write each line's scores (always with --scorer)")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  args = parser.parse_args(argv)
  kind = unwritable_kind(args.out)
  if kind:
    parser.error(f"--out {args.out}: {kind}, expected the name of a file to write")
  say = lambda message: print(f"mine: {message}", file=sys.stderr, flush=True)
  try:
    corpus = None
    if args.beir:
      pairs, corpus = beir_pairs(args.beir, args.split)
    else:
      pairs = read_pairs(args.input, args.anchor_field, args.positive_field)
    if args.corpus:
      corpus = [*(corpus or []), *read_corpus(args.corpus, args.corpus_field)]
    lines = mine(args.model, pairs, corpus, num_negatives=args.num_negatives,
                 range_min=args.range_min, range_max=args.range_max,
                 absolute_margin=args.margin, relative_margin=args.relative_margin,
                 max_score=args.max_score, min_score=args.min_score, sampling=args.sampling,
                 seed=args.seed, scorer=args.scorer, dtype=args.dtype, say=say)
  except RunError as e:
    print(f"mine: error: {e}", file=sys.stderr)
    return e.exit_code
  with written_whole(args.out) as tmp, open(tmp, "w", encoding="utf-8") as f:
    for line in lines:
      if line is not None:
        if not (args.scores or args.scorer):
          line.pop("scores")
        f.write(json.dumps(line, ensure_ascii=False) + "\n")
  left = sum(line is None for line in lines)
  negatives = sum(len(line["negative"]) for line in lines if line is not None)
  print(f"{args.out}: {len(lines) - left} lines, {negatives} negatives"
        + (f"; {left} lines left without a negative, not written (widen --range-max or loosen "
           f"the margins)" if left else ""))
  return 0
