r"""Retrieval on real text by each model type, trained from one start: dense, sparse (SPLADE),
multi-vector (ColBERT) and dense plus a reranker, nDCG@10 and MRR@10 of held-out queries over
a held-out corpus; and the speed of each of flax-encoder's encoders against
sentence-transformers' own on the same folder, interleaved, on this CPU.

  python -m benchmarks.retrieval --out benchmarks/results/retrieval.json   # ~30 min, 2 cores
  python -m benchmarks.retrieval --pairs 300 --speed-texts 64              # a few minutes
  python -m benchmarks.retrieval --out … --workdir … --speed-only  # time the encoders again

The data is benchmarks.contrastive's: the packages of Debian's database on this machine, each
package's one-line description a query and its long description the document it is about;
`--pairs` of them (by package name), every 5th held out. Each held-out query is ranked against
every held-out document, its own the one relevant.

The start is the published all-MiniLM-L6-v2 (the tests' cache: tests/published.py), for every
type; each is fine-tuned for --epochs (1) of the training pairs by `python -m train` (batch 32,
seq_len 128, configs' recipes) and exported, then loaded by flax-encoder's class of its type
(each equal to sentence-transformers' on the same folder, tests/test_*.py):

  dense          configs/embed.py                       SentenceEncoder, cosine
  sparse         configs/sparse.py, a new masked-LM     SparseEncoder, dot product
                 head on the encoder (init.fresh_head)
  multi-vector   configs/multi_vector.py, a new 128-    MultiVectorEncoder, MaxSim
                 wide projection (where the task exists)
  + rerank       configs/rerank.py, a new classifier,   Reranker over the dense model's top
                 the query's 3 negatives drawn from     --rerank-top (20) documents: a
                 other pairs' documents                 positive outside them stays missed

With --distil, a second round follows the recipe of docs/retrieval.md from the same start:
each training pair's hardest negative mined by the start (`python -m train.mine`), the pair
and that negative scored by the reranker trained above (or --teacher's), and dense, sparse and
multi-vector models trained on the teacher's scores (config.task.loss=margin_mse), ranked as
the others.

  python -m benchmarks.retrieval --pairs 1000 --distil --out …   # ~30 min, 2 cores

The start model's own dense figures are the baseline. Speed: each exported folder's texts/s
(pairs/s for the reranker) over --speed-texts held-out documents, ours (packed) against
sentence-transformers' (batch 32), median of --repeats interleaved calls after one warm-up,
both on every core.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import bench
from benchmarks.contrastive import HELD_OUT_EVERY, debian_pairs, machine
from benchmarks.embeddings import published_minilm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = 10


def split(pairs: list[tuple[str, str]]) -> tuple[list, list]:
  held = [p for i, p in enumerate(pairs) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
  train = [p for i, p in enumerate(pairs) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
  return train, held


def write_lines(path: str, lines: list[dict]) -> str:
  with open(path, "w") as f:
    f.writelines(json.dumps(line) + "\n" for line in lines)
  return path


def metrics(scores: np.ndarray) -> dict:
  """nDCG@10 and MRR@10 of query i ranking the documents by `scores` [queries, documents],
  document i the relevant one (ties rank it below: a model that scores all alike is last)."""
  scores = np.asarray(scores, np.float64)
  rank = np.sum(scores >= np.diagonal(scores)[:, None], axis=1)
  top = rank <= TOP
  return {"ndcg_at_10": float(np.mean(np.where(top, 1 / np.log2(rank + 1), 0))),
          "mrr_at_10": float(np.mean(np.where(top, 1 / rank, 0)))}


def train_and_export(name: str, config: str, overrides: dict, layout: str, work: str) -> dict:
  """`python -m train` with `config` and `overrides` in WORK/name, then its export by `layout`
  into WORK/name-export; {'folder', 'train_s'}, or {'error'} where either failed."""
  workdir, out = os.path.join(work, name), os.path.join(work, f"{name}-export")
  log = os.path.join(work, f"{name}.log")
  args = [f"--config.{k}={v}" for k, v in overrides.items()]
  start = time.time()
  with open(log, "w") as f:
    done = subprocess.run([sys.executable, "-m", "train", f"--config={config}",
                           f"--workdir={workdir}", *args], cwd=ROOT, stdout=f, stderr=f,
                          check=False)
    took = time.time() - start
    if done.returncode == 0:
      done = subprocess.run([sys.executable, "-m", "train.export", "--workdir", workdir,
                             "--layout", layout, "--out", out], cwd=ROOT, stdout=f, stderr=f,
                            check=False)
  if done.returncode:
    with open(log) as f:
      return {"error": (f.read().strip().splitlines() or ["?"])[-1]}
  print(f"{name}: trained in {took:.0f} s", file=sys.stderr)
  return {"folder": out, "train_s": took}


def _scores_of(kind: str, folder: str, queries: list, documents: list, dense_scores) -> dict:
  """The metrics of the `kind` model in `folder` ranking `documents` for `queries`."""
  if kind == "dense":
    return metrics(dense_scores(folder))
  if kind == "sparse":
    from flax_encoder.sparse import SparseEncoder
    encoder = SparseEncoder.load(folder)
    q, d = encoder.encode_query(queries), encoder.encode_document(documents)
    return {**metrics(encoder.similarity(q, d)), "active_dims_query": float(np.mean(q.active)),
            "active_dims_document": float(np.mean(d.active))}
  from flax_encoder.multi_vector import MultiVectorEncoder
  encoder = MultiVectorEncoder.load(folder)
  return metrics(encoder.similarity(encoder.encode_query(queries),
                                    encoder.encode_document(documents)))


def evaluate(folders: dict, held: list, rerank_top: int) -> dict:
  """{row: metrics} of each trained folder (and the start's), ranked as the module says."""
  from flax_encoder.embeddings import SentenceEncoder
  queries, documents = [q for q, _ in held], [d for _, d in held]
  rows = {}

  def dense_scores(folder):
    encoder = SentenceEncoder.load(folder)
    q, d = encoder(queries), encoder(documents)
    q /= np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    d /= np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-12)
    return q @ d.T

  start = dense_scores(folders["start"])
  rows["start (dense, as published)"] = metrics(start)
  if "dense" in folders:
    dense = dense_scores(folders["dense"])
    rows["dense"] = metrics(dense)
  for kind, row in (("sparse", "sparse"), ("multi_vector", "multi-vector")):
    if kind in folders:
      rows[row] = _scores_of(kind, folders[kind], queries, documents, dense_scores)
  for name in ("dense distilled", "sparse distilled", "multi_vector distilled"):
    if name in folders:
      rows[name.replace("_", "-")] = _scores_of(name.split()[0], folders[name], queries,
                                                documents, dense_scores)
  if "rerank" in folders:
    from flax_encoder.cross_encoder import Reranker
    reranker = Reranker.load(folders["rerank"])
    first_stages = {"start + rerank": start, **({"dense + rerank": dense}
                                                  if "dense" in folders else {})}
    for name, first in first_stages.items():
      top = np.argsort(-first, axis=1, kind="stable")[:, :rerank_top]
      pairs = [(queries[i], documents[j]) for i in range(len(queries)) for j in top[i]]
      scores = np.asarray(reranker.predict(pairs), np.float64).reshape(top.shape)
      # the reranked top first, in the reranker's order; the rest after, in the first stage's
      reranked = np.full(first.shape, -np.inf)
      reranked[np.arange(len(queries))[:, None], top] = scores + 2.0  # sigmoid < 1 + 2
      reranked = np.where(np.isfinite(reranked), reranked, first - first.max() - 10)
      rows[name] = metrics(reranked)
  return rows


def speed(folders: dict, held: list, texts: int, repeats: int) -> dict:
  """{type: ours and sentence-transformers' texts/s on the same folder, interleaved}."""
  import sentence_transformers as st
  documents = [d for _, d in held][:texts]
  queries = [q for q, _ in held][:texts]
  out = {}
  sides = {}
  if "dense" in folders:
    from flax_encoder.embeddings import SentenceEncoder
    ours, theirs = SentenceEncoder.load(folders["dense"]), st.SentenceTransformer(
        folders["dense"], device="cpu")
    sides["dense"] = (lambda: ours(documents), lambda: theirs.encode(documents, batch_size=32))
  if "sparse" in folders:
    from flax_encoder.sparse import SparseEncoder
    ours_s, theirs_s = SparseEncoder.load(folders["sparse"]), st.SparseEncoder(
        folders["sparse"], device="cpu")
    sides["sparse"] = (lambda: ours_s.encode_document(documents),
                       lambda: theirs_s.encode_document(documents, batch_size=32))
  if "multi_vector" in folders:
    from flax_encoder.multi_vector import MultiVectorEncoder
    ours_m, theirs_m = MultiVectorEncoder.load(folders["multi_vector"]), st.MultiVectorEncoder(
        folders["multi_vector"], device="cpu")
    sides["multi-vector"] = (lambda: ours_m.encode_document(documents),
                             lambda: theirs_m.encode_document(documents, batch_size=32))
  if "rerank" in folders:
    from flax_encoder.cross_encoder import Reranker
    pairs = list(zip(queries, documents))
    ours_r, theirs_r = Reranker.load(folders["rerank"]), st.CrossEncoder(folders["rerank"],
                                                                          device="cpu")
    sides["rerank"] = (lambda: ours_r.predict(pairs),
                       lambda: theirs_r.predict(pairs, batch_size=32))
  for name, (ours_fn, theirs_fn) in sides.items():
    times = bench.interleaved({"ours": ours_fn, "theirs": theirs_fn}, repeats, warmup=1)
    out[name] = {"texts": len(documents), "ours_per_s": len(documents) / times["ours"],
                 "theirs_per_s": len(documents) / times["theirs"],
                 "ratio": times["theirs"] / times["ours"]}
    print(f"{name}: {out[name]['ratio']:.2f}x sentence-transformers", file=sys.stderr)
  return out


DISTILLED = {"dense": ("configs/embed.py", {}), "sparse": ("configs/sparse.py",
                                                           {"init.fresh_head": True}),
             "multi_vector": ("configs/multi_vector.py", {})}


def distilled_round(folders: dict, paths: dict, common: dict, teacher: str, work: str) -> dict:
  """The recipe of docs/retrieval.md from the same start: each training pair's hardest
  negative mined with the start (python -m train.mine), the pair and the negative scored by
  the reranker `teacher` (--scorer), then dense, sparse and multi-vector models distilled
  from those scores (config.task.loss=margin_mse); {name distilled: its run}."""
  mined = os.path.join(work, "mined.jsonl")
  start = time.time()
  done = subprocess.run([sys.executable, "-m", "train.mine", "--model", folders["start"],
                         "--input", paths["train"], "--out", mined, "--num-negatives", "1",
                         "--scorer", teacher], cwd=ROOT, capture_output=True,
                        text=True, check=False)
  if done.returncode:
    return {"mine": {"error": done.stderr.strip().splitlines()[-1]}}
  out = {"mine": {"seconds": round(time.time() - start, 1), "said": done.stdout.strip(),
                  "teacher": teacher}}
  for name, (config, extra) in DISTILLED.items():
    out[f"{name} distilled"] = train_and_export(
        f"{name}-distilled", config, {**common, "data.train": mined, "data.eval": paths["eval"],
                                      "task.loss": "margin_mse", **extra},
        "sentence-transformers", work)
  return out


def table(results: dict) -> str:
  lines = ["| model | nDCG@10 | MRR@10 | trained |", "|---|---:|---:|---:|"]
  run_of = {"dense": "dense", "sparse": "sparse", "multi-vector": "multi_vector",
            "start + rerank": "rerank", "dense + rerank": "rerank",
            **{f"{k.replace('_', '-')} distilled": f"{k} distilled" for k in DISTILLED}}
  for name, row in results["quality"].items():
    trained = results["runs"].get(run_of.get(name), {}).get("train_s")
    lines.append(f"| {name} | {row['ndcg_at_10']:.3f} | {row['mrr_at_10']:.3f} | "
                 f"{f'{trained:.0f} s' if trained else ''} |")
  lines += ["", "| encoder | ours /s | sentence-transformers /s | × |", "|---|---:|---:|---:|"]
  for name, row in results["speed"].items():
    lines.append(f"| {name} | {row['ours_per_s']:.1f} | {row['theirs_per_s']:.1f} | "
                 f"{row['ratio']:.2f} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--pairs", type=int, default=2000)
  parser.add_argument("--epochs", type=int, default=1, help="of the training pairs, each type")
  parser.add_argument("--batch-size", type=int, default=32)
  parser.add_argument("--seq-len", type=int, default=128)
  parser.add_argument("--rerank-top", type=int, default=20)
  parser.add_argument("--speed-texts", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--workdir", help="where the runs go (default: a temporary directory)")
  parser.add_argument("--out", help="the results as JSON")
  parser.add_argument("--distil", action="store_true",
                      help="then the distilled round: negatives mined, scored by the reranker, "
                      "dense, sparse and multi-vector distilled from the scores")
  parser.add_argument("--teacher", help="the distilled round's reranker (a CrossEncoder folder; "
                      "default: the one this run trains)")
  parser.add_argument("--speed-only", action="store_true",
                      help="time the encoders of an earlier run's --workdir (its results in "
                      "--out kept) again, on a quieter machine, without training")
  args = parser.parse_args(argv)
  if args.speed_only:
    with open(args.out) as f:
      results = json.load(f)
    folders = {k: v["folder"] for k, v in results["runs"].items() if "folder" in v}
    held = split(debian_pairs()[:results["pairs"]])[1]
    results["speed"] = speed(folders, held, args.speed_texts, args.repeats)
    print(table(results))
    bench.write_results(args.out, results)
    return 0
  start = published_minilm()
  if start is None:
    print("error: the published all-MiniLM-L6-v2 is not cached: run the tests once online "
          "(tests/published.py fetches it)", file=sys.stderr)
    return 2
  pairs = debian_pairs()[:args.pairs]
  train, held = split(pairs)
  work = args.workdir or tempfile.mkdtemp(prefix="retrieval-")
  os.makedirs(work, exist_ok=True)
  paths = {"train": write_lines(os.path.join(work, "train.jsonl"),
                                [{"anchor": a, "positive": p} for a, p in train]),
           "eval": write_lines(os.path.join(work, "eval.jsonl"),
                               [{"anchor": a, "positive": p} for a, p in held])}
  rng = np.random.default_rng(0)
  documents = [p for _, p in held]
  rerank_eval = write_lines(os.path.join(work, "rerank-eval.jsonl"), [
      {"query": a, "positive": p,
       "negative": [documents[j] for j in rng.choice(len(held), 7) if documents[j] != p]}
      for a, p in held])
  rerank_train = write_lines(os.path.join(work, "rerank-train.jsonl"),
                             [{"query": a, "positive": p} for a, p in train])
  common = {"init.hf": start, "train.epochs": args.epochs, "train.batch_size": args.batch_size,
            "train.seq_len": args.seq_len, "train.eval_at_start": False,
            "train.eval_every": 100000}
  pair_data = {"data.train": paths["train"], "data.eval": paths["eval"]}
  plans = {
      "dense": ("configs/embed.py", pair_data, "sentence-transformers"),
      "sparse": ("configs/sparse.py", {**pair_data, "init.fresh_head": True},
                 "sentence-transformers"),
      "multi_vector": ("configs/multi_vector.py", pair_data, "sentence-transformers"),
      "rerank": ("configs/rerank.py", {"data.train": rerank_train, "data.eval": rerank_eval,
                                       "task.negatives": 3}, "hf"),
  }
  runs, folders = {}, {"start": start}
  for name, (config, data, layout) in plans.items():
    if not os.path.isfile(os.path.join(ROOT, config)):
      runs[name] = {"error": f"{config}: no such task here"}
      continue
    runs[name] = train_and_export(name, config, {**common, **data}, layout, work)
    if "folder" in runs[name]:
      folders[name] = runs[name]["folder"]
    else:
      print(f"{name}: {runs[name]['error']}", file=sys.stderr)
  if args.distil and (args.teacher or "rerank" in folders):
    runs.update(distilled_round(folders, paths, common, args.teacher or folders["rerank"],
                                work))
    folders.update({name: run["folder"] for name, run in runs.items()
                    if name.endswith("distilled") and "folder" in run})
  results = {"machine": machine(), "environment": bench.environment(), "pairs": len(pairs),
             "epochs": args.epochs,
             "held_out": len(held), "start": start, "runs": runs,
             "quality": evaluate(folders, held, args.rerank_top),
             "speed": speed(folders, held, args.speed_texts, args.repeats)}
  print(table(results))
  if args.out:
    bench.write_results(args.out, results)
  return 0


if __name__ == "__main__":
  sys.exit(main())
