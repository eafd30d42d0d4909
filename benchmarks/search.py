r"""Exact top-k search, as `python -m train.mine` and `train.evaluate` run it
(flax_encoder.search.top_k: the corpus in chunks over the devices, each chunk's best k kept on
its device), against FAISS's exact inner-product index (IndexFlatIP, which
sentence-transformers' mine_hard_negatives takes with use_faiss=True) and torch's matmul and
topk (its default), on the same unit vectors, interleaved, on this CPU.

  python -m benchmarks.search --out benchmarks/results/search.json   # ~1 min, 2 cores

Each side finds the 100 best of --documents for --queries (random unit vectors of --dim); the
first call of each is a warm-up (ours compiles), then the median of --repeats. (Where JAX
computes on the CPU and FAISS is installed, the commands take FAISS's side for cosine and dot:
`flax_encoder.search.dense_top_k`.) The sides must
find the same documents (checked: the sets of each query's first 10).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from benchmarks import bench


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--queries", type=int, default=1000)
  parser.add_argument("--documents", type=int, default=100_000)
  parser.add_argument("--dim", type=int, default=384)
  parser.add_argument("--k", type=int, default=100)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", help="the results as JSON")
  args = parser.parse_args(argv)
  from flax_encoder import search
  rng = np.random.default_rng(0)
  unit = lambda x: (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
  queries = unit(rng.normal(size=(args.queries, args.dim)))
  documents = unit(rng.normal(size=(args.documents, args.dim)))
  sides = {"flax-encoder (search.top_k)": lambda: search.top_k(
      search.dense_scores("dot"), queries, documents, args.k)[1]}
  try:
    import faiss
    index = faiss.IndexFlatIP(args.dim)
    index.add(documents)
    sides["FAISS IndexFlatIP"] = lambda: index.search(queries, args.k)[1]
  except ImportError:
    print("faiss is not installed: its side is left out", file=sys.stderr)
  try:
    import torch
    q, d = torch.from_numpy(queries), torch.from_numpy(documents)
    sides["torch matmul + topk"] = lambda: torch.topk(q @ d.T, args.k, dim=1).indices.numpy()
  except ImportError:
    print("torch is not installed: its side is left out", file=sys.stderr)
  found = {name: np.asarray(side()) for name, side in sides.items()}  # the warm-up
  first = next(iter(found.values()))
  for name, ids in found.items():
    same = np.mean([len(set(a[:10]) & set(b[:10])) / 10 for a, b in zip(first, ids)])
    if same < 0.999:
      print(f"error: {name} finds other documents ({same:.3f} of the first 10 shared)",
            file=sys.stderr)
      return 1
  times = {name: [] for name in sides}
  for _ in range(args.repeats):
    for name, side in sides.items():  # interleaved
      start = time.perf_counter()
      side()
      times[name].append(time.perf_counter() - start)
  ours = np.median(times["flax-encoder (search.top_k)"])
  rows = {name: {"seconds": float(np.median(t)),
                 "queries_per_s": args.queries / float(np.median(t)),
                 "ours_x": float(np.median(t) / ours)} for name, t in times.items()}
  print("| side | s | queries/s | time / ours |\n|---|---:|---:|---:|")
  for name, row in rows.items():
    print(f"| {name} | {row['seconds']:.3f} | {row['queries_per_s']:.0f} | {row['ours_x']:.2f} |")
  if args.out:
    bench.write_results(args.out, {"environment": bench.environment(), "queries": args.queries,
                                   "documents": args.documents, "dim": args.dim, "k": args.k,
                                   "rows": rows})
  return 0


if __name__ == "__main__":
  sys.exit(main())
