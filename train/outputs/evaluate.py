r"""A model's retrieval figures on a BEIR-format set.

  python -m train.evaluate --model all-MiniLM-L6-v2 --beir scifact --out metrics.json

--model is a sentence-transformers folder (a SentenceTransformer, SparseEncoder,
MultiVectorEncoder or CrossEncoder), a Hugging Face model directory, or the workdir of a
contrastive, sparse or multi-vector run. A retriever embeds every query of the split and every
document, scores each query against the whole corpus on every device (flax_encoder.search, by
the model's similarity), and keeps each query's --top-k documents. A reranker (a CrossEncoder)
scores the --top-k documents of a first stage for each query: --first-stage, a TREC run file
or a retriever to run first. As BEIR and MTEB do, a document whose id is the query's is left
out of its ranking.

Written: --out, JSON of the figures (nDCG@10, MRR@10, Recall@100, MAP@100: trec_eval's,
flax_encoder.ranking) over the judged queries, and --run (default: --out's name with .trec),
the ranking as a TREC run file (query Q0 document rank score tag), which pytrec_eval,
ir-measures or trec_eval read to check them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from flax_encoder import ranking, search
from train.cli import HelpFormatter
from train.data import beir
from train.errors import RunError
from train.files import unwritable_kind, written_whole

KINDS = ("dense", "sparse", "multi_vector", "rerank")
QUERY_BLOCK = 1024  # queries searched at once: their vectors and scores in memory


def model_kind(model: str) -> str:
  """Which of KINDS the folder or run `model` is: a folder by its
  config_sentence_transformers.json's model_type (a Hugging Face directory without one: by
  its architecture), a run by its task."""
  from flax_encoder.modules_json import read_json
  from train.outputs.embed import is_workdir
  if not os.path.isdir(model):
    raise RunError(f"--model {model}: no such directory, expected a sentence-transformers "
                   f"folder, a Hugging Face model directory or a run's workdir")
  if is_workdir(model):
    from train.run.load import load_config
    try:
      task = load_config(model).task.get("name", "masked_lm")
    except FileNotFoundError as e:
      raise RunError(f"--model {model}: {e}") from None
    kinds = {"contrastive": "dense", "sparse": "sparse", "multi_vector": "multi_vector"}
    if task not in kinds:
      raise RunError(f"--model {model}: a {task} run, expected a contrastive, sparse or "
                     f"multi_vector run (a rerank run: export it with python -m train.export "
                     f"--layout sentence-transformers, then pass that folder)")
    return kinds[task]
  settings = read_json(os.path.join(model, "config_sentence_transformers.json"), RunError,
                       dict) or {}
  hf = read_json(os.path.join(model, "config.json"), RunError, dict) or {}
  model_type = settings.get("model_type")
  kinds = {"SparseEncoder": "sparse", "MultiVectorEncoder": "multi_vector",
           "CrossEncoder": "rerank"}
  if model_type in kinds:
    return kinds[model_type]
  if not settings and any(str(a).endswith("ForSequenceClassification")
                          for a in hf.get("architectures") or []):
    return "rerank"
  return "dense"


def load(model: str, kind: str, dtype: str):
  """The encoder of `model` (a Reranker for "rerank"); RunError naming --model where it cannot
  be read."""
  from flax_encoder.cross_encoder import Reranker
  from flax_encoder.embeddings import SentenceEncoder
  from flax_encoder.multi_vector import MultiVectorEncoder
  from flax_encoder.sparse import SparseEncoder
  from train.outputs.embed import is_workdir
  if is_workdir(model):
    from train import tasks
    from train.outputs.embed import check_run_tokenizer
    from train.run.load import load_config
    check_run_tokenizer(model)
    return tasks.definition(load_config(model).task.name).sentence_encoder(model, dtype)
  cls = {"dense": SentenceEncoder, "sparse": SparseEncoder, "multi_vector": MultiVectorEncoder,
         "rerank": Reranker}[kind]
  try:
    return cls.load(model, dtype=dtype)
  except ValueError as e:  # the library's errors name the file and what it holds
    raise RunError(f"--model {model}: {e}") from None


class _DenseRows:
  """Sparse vectors as dense rows of the vocabulary, a slice at a time (search.top_k's chunks)."""

  def __init__(self, vectors):
    self.vectors = vectors

  def __len__(self):
    return len(self.vectors)

  def __getitem__(self, at: slice):
    from flax_encoder.sparse import SparseVectors
    v = self.vectors
    start, stop, _ = at.indices(len(v))
    lo, hi = v.indptr[start], v.indptr[stop]
    return SparseVectors(v.indptr[start:stop + 1] - lo, v.indices[lo:hi], v.values[lo:hi],
                         (stop - start, v.shape[1])).toarray()


def retrieve(encoder, kind: str, queries: list[str], documents: list[str], k: int,
             progress=None) -> tuple[np.ndarray, np.ndarray]:
  """(scores float32 [q, k'], document indices [q, k']): each query's best k documents by the
  model's similarity over the whole corpus, on every device."""
  from flax_encoder.multi_vector import pad_vectors
  say = progress or (lambda message: None)
  say(f"embedding {len(documents)} documents")
  corpus = encoder.encode_document(documents)
  say(f"embedding {len(queries)} queries")
  asked = encoder.encode_query(queries)
  say(f"searching {len(documents)} documents")
  if kind == "dense":  # all queries at once: top_k bounds its memory, FAISS builds one index
    return search.dense_top_k(encoder.similarity, np.asarray(asked, np.float32),
                              np.asarray(corpus, np.float32), k)
  starts = range(0, len(queries), QUERY_BLOCK)
  if kind == "sparse":  # dense rows of the vocabulary, a block of queries at a time
    score, corpus = search.sparse_scores(encoder.similarity_fn_name), _DenseRows(corpus)
    blocks = [_DenseRows(asked)[i:i + QUERY_BLOCK] for i in starts]
  else:
    score = search.maxsim_scores(encoder.similarity_fn_name == "meanmaxsim")
    corpus = pad_vectors(corpus, "documents")
    blocks = [pad_vectors(asked[i:i + QUERY_BLOCK], "queries") for i in starts]
  found = []
  for block in blocks:
    chunk = None
    if kind == "multi_vector":  # [q, chunk, s, t] products
      (q, _), (d, _) = block, corpus
      chunk = max(1, search.CHUNK_SCORES // (q.shape[0] * q.shape[1] * d.shape[1]))
    found.append(search.top_k(score, block, corpus, k, chunk))
  return (np.concatenate([s for s, _ in found]), np.concatenate([i for _, i in found]))


def rerank(reranker, queries: list[str], documents: dict[str, str], first: dict,
           query_ids: list[str], k: int) -> dict:
  """The run of `reranker`'s scores of each query's first `k` documents of the run `first`."""
  pairs, keys = [], []
  for qid, text in zip(query_ids, queries):
    for doc in ranking.ranked(first.get(qid, {}))[:k]:
      if doc in documents:
        pairs.append((text, documents[doc]))
        keys.append((qid, doc))
  scores = reranker.predict(pairs, apply_activation=False) if pairs else np.zeros(0)
  run: dict = {q: {} for q in query_ids}
  for (qid, doc), value in zip(keys, np.asarray(scores, np.float64).reshape(len(keys), -1)[:, 0]):
    run[qid][doc] = float(value)
  return run


def as_run(data: beir.BeirSet, scores: np.ndarray, indices: np.ndarray, k: int) -> dict:
  """Each query's documents and scores, less a document whose id is the query's."""
  run = {}
  for qid, row, at in zip(data.query_ids, scores, indices):
    kept = {data.corpus_ids[i]: float(s) for s, i in zip(row, at) if data.corpus_ids[i] != qid}
    run[qid] = dict(list(kept.items())[:k])
  return run


def first_stage(path: str, data: beir.BeirSet, k: int, dtype: str, say) -> tuple[dict, dict]:
  """The run to rerank: a TREC run file's, or a retriever's on the set; and what it was."""
  if os.path.isfile(path):
    try:
      with open(path, encoding="utf-8") as f:
        return ranking.read_run(f, path), {"run": path}
    except ranking.RankingError as e:
      raise RunError(f"--first-stage {e}") from None
  kind = model_kind(path)
  if kind == "rerank":
    raise RunError(f"--first-stage {path}: a reranker, expected a retriever (dense, sparse "
                   f"or multi-vector) or a TREC run file")
  encoder = load(path, kind, dtype)
  scores, indices = retrieve(encoder, kind, data.queries, data.documents, k + 1, say)
  run = as_run(data, scores, indices, k)
  return run, {"model": path, "kind": kind}


def evaluate(model: str, beir_dir: str, out: str, split: str = "test", run_path: str | None = None,
             top_k: int = 100, first: str | None = None, dtype: str = "float32",
             show: bool = False) -> dict:
  """Runs the evaluation and writes `out` and `run_path` (default: `out`'s name with .trec);
  the figures written."""
  run_path = run_path or os.path.splitext(out)[0] + ".trec"
  say = (lambda message: print(f"evaluate: {message}", file=sys.stderr, flush=True)
         ) if show else (lambda message: None)
  started = time.time()
  kind = model_kind(model)
  if kind == "rerank" and first is None:
    raise RunError(f"--model {model}: a reranker, which needs --first-stage (a TREC run file "
                   f"or a retriever whose top --top-k documents it reranks)")
  if kind != "rerank" and first is not None:
    raise RunError(f"--first-stage: given for the {kind} model {model}, expected only for a "
                   f"reranker")
  data = beir.read(beir_dir, split)
  say(f"{len(data.query_ids)} queries, {len(data.documents)} documents ({split})")
  encoder = load(model, kind, dtype)
  result = {"model": model, "kind": kind, "beir": beir_dir, "split": split,
            "queries": len(data.query_ids), "documents": len(data.documents), "top_k": top_k}
  if kind == "rerank":
    stage, result["first_stage"] = first_stage(first, data, top_k, dtype, say)
    result["first_stage"]["metrics"] = ranking.metrics(stage, data.qrels,
                                                       judged_missing="zero")
    say(f"reranking the first stage's top {top_k}")
    run = rerank(encoder, data.queries, dict(zip(data.corpus_ids, data.documents)), stage,
                 data.query_ids, top_k)
  else:
    scores, indices = retrieve(encoder, kind, data.queries, data.documents, top_k + 1, say)
    run = as_run(data, scores, indices, top_k)
  result["metrics"] = ranking.metrics(run, data.qrels, judged_missing="zero")
  result["run"] = run_path
  result["seconds"] = round(time.time() - started, 1)
  with written_whole(run_path) as tmp, open(tmp, "w", encoding="utf-8") as f:
    f.writelines(ranking.run_lines(run, tag=os.path.basename(os.path.normpath(model))))
  with written_whole(out) as tmp, open(tmp, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2)
    f.write("\n")
  return result


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m train.evaluate", description=__doc__,
                                   formatter_class=HelpFormatter)
  parser.add_argument("--model", required=True, help="a sentence-transformers folder, a Hugging "
                      "Face model directory or a contrastive, sparse or multi_vector workdir")
  parser.add_argument("--beir", required=True, help="a BEIR folder: corpus.jsonl, "
                      "queries.jsonl, qrels/SPLIT.tsv")
  parser.add_argument("--split", default="test", choices=beir.SPLITS,
                      help="the qrels whose queries are evaluated")
  parser.add_argument("--out", required=True, help="the figures, as JSON")
  parser.add_argument("--run", help="the ranking, as a TREC run file (default: --out's name "
                      "with .trec)")
  parser.add_argument("--top-k", type=int, default=100,
                      help="documents ranked per query (a reranker: of the first stage's)")
  parser.add_argument("--first-stage", help="a reranker's candidates: a TREC run file, or a "
                      "retriever (folder or workdir) run on the set first")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                      help="what the models compute in")
  args = parser.parse_args(argv)
  if args.top_k < 100:
    parser.error(f"--top-k {args.top_k}: expected at least 100 (Recall@100 and MAP@100 rank "
                 f"100 documents)")
  for flag, path in (("--out", args.out), ("--run", args.run or args.out)):
    kind = unwritable_kind(path)
    if kind:
      parser.error(f"{flag} {path}: {kind}, expected the name of a file to write")
  try:
    result = evaluate(args.model, args.beir, args.out, args.split, args.run, args.top_k,
                      args.first_stage, args.dtype, show=True)
  except RunError as e:
    print(f"evaluate: error: {e}", file=sys.stderr)
    return e.exit_code
  figures = ", ".join(f"{name} {value:.4f}" for name, value in result["metrics"].items())
  print(f"{args.out}: {result['queries']} queries, {figures}")
  return 0
