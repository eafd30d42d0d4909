r"""What quantizing costs in retrieval on real text: the published all-MiniLM-L6-v2's float32
vectors against its int8 model (`quantize="int8"`), its int8 and binary vectors, and binary
search rescored by the float query (`flax_encoder.quantization.search`), each query ranked
against every document.

  python -m benchmarks.quantized_search [--out benchmarks/results/quantized_search.json]

The data is benchmarks.contrastive's: the packages of Debian's database on this machine, each
package's one-line description a query and its long description the document it is about
(every pair; the document of a query the one relevant). Figures: nDCG@10 and MRR@10
(benchmarks.retrieval.metrics), the recall@10 of each way against float32's own top 10 (the
share of those 10 it finds), and each text's least and mean cosine of the int8 model's vectors
to float32's. int8 vectors are scored by their dot product as integers (the ranges those of
the documents' vectors); binary ones by their Hamming distance (less is nearer).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from benchmarks import bench
from benchmarks.contrastive import debian_pairs
from benchmarks.embeddings import published_minilm
from benchmarks.retrieval import metrics
from flax_encoder import quantization
from flax_encoder.embeddings import SentenceEncoder

TOP = 10
MULTIPLIERS = (1, 2, 4, 8)


def recall(scores: np.ndarray, exact_top: np.ndarray) -> float:
  """The share of `exact_top` (int [q, TOP]) among each query's TOP best by `scores`."""
  top = np.argsort(-scores, axis=1, kind="stable")[:, :TOP]
  return float(np.mean([len(set(a) & set(b)) / TOP for a, b in zip(top, exact_top)]))


def full_scores(indices: np.ndarray, scores: np.ndarray, documents: int) -> np.ndarray:
  """[q, documents] scores of a search's hits (`indices`, `scores` [q, k]), the rest below."""
  out = np.full((len(indices), documents), -np.inf)
  np.put_along_axis(out, indices, scores, axis=1)
  return out


def measure(model: str, pairs: list[tuple[str, str]]) -> dict:
  queries, documents = (list(side) for side in zip(*pairs))
  plain = SentenceEncoder.load(model)
  int8_model = SentenceEncoder.load(model, quantize="int8")
  q, d = plain(queries), plain(documents)
  exact = q @ d.T
  exact_top = np.argsort(-exact, axis=1, kind="stable")[:, :TOP]
  ways = {"float32": exact}
  q8, d8 = int8_model(queries), int8_model(documents)
  ways["int8 model, float32 vectors"] = q8 @ d8.T
  ranges = quantization.int8_ranges(d)
  ways["int8 vectors"] = (quantization.quantize(q, "int8", ranges).astype(np.int32)
                          @ quantization.quantize(d, "int8", ranges).astype(np.int32).T)
  bits = quantization.quantize(d, "ubinary")
  ways["binary, Hamming"] = -quantization.hamming(quantization.quantize(q, "ubinary"), bits)
  for m in MULTIPLIERS:
    scores, indices = quantization.search(q, bits, TOP, m)
    ways[f"binary, rescored x{m}"] = full_scores(indices, scores, len(documents))
  cosine = np.sum(q8 * q, 1) / np.linalg.norm(q8, axis=1) / np.linalg.norm(q, axis=1)
  cosine_d = np.sum(d8 * d, 1) / np.linalg.norm(d8, axis=1) / np.linalg.norm(d, axis=1)
  both = np.concatenate([cosine, cosine_d])
  return {"pairs": len(pairs),
          "int8_model_cosine": {"min": float(both.min()), "mean": float(both.mean())},
          "ways": {name: {**metrics(s), "recall_at_10_of_float32": recall(s, exact_top)}
                   for name, s in ways.items()}}


def table(results: dict) -> str:
  base = results["ways"]["float32"]
  lines = ["| vectors | nDCG@10 | MRR@10 | nDCG@10 lost | recall@10 of float32's top 10 |",
           "|---|---:|---:|---:|---:|"]
  for name, r in results["ways"].items():
    lost = 1 - r["ndcg_at_10"] / base["ndcg_at_10"]
    lines.append(f"| {name} | {r['ndcg_at_10']:.4f} | {r['mrr_at_10']:.4f} | {lost:.2%} | "
                 f"{r['recall_at_10_of_float32']:.3f} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.quantized_search",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", help="a sentence-transformers folder (default: the published "
                      "all-MiniLM-L6-v2 in the tests' cache)")
  parser.add_argument("--out", help="results JSON")
  args = parser.parse_args(argv)
  model = args.model or published_minilm()
  if model is None:
    print("error: --model: unset, and all-MiniLM-L6-v2 is not in the tests' cache",
          file=sys.stderr)
    return 2
  results = {"environment": bench.environment(), "model": model,
             **measure(model, debian_pairs())}
  print(table(results))
  cosine = results["int8_model_cosine"]
  print(f"int8 model: least cosine to float32 {cosine['min']:.5f}, mean {cosine['mean']:.5f} "
        f"over {2 * results['pairs']} texts", file=sys.stderr)
  if args.out:
    bench.write_results(args.out, results)
  return 0


if __name__ == "__main__":
  sys.exit(main())
