r"""Tables (Markdown) and a plot from a benchmarks.bench results file.

  python -m benchmarks.report benchmarks/results/cpu.json --plot docs/benchmarks_cpu.png

Prints the tables that BENCHMARKS.md shows.
"""

from __future__ import annotations

import argparse
import json
import sys


def tables(results: dict) -> str:
  env, records = results["environment"], results["records"]
  peak = results.get("matmul_peak_flops_per_s")
  lines = [f"{env['backend']} ({env['device']}, {env['cores']} cores), {results['dtype']}, "
           f"attention_impl={results['attention']}, matmul precision "
           f"{env['matmul_precision']}; jax {env['jax']}, flax {env['flax']}, torch "
           f"{env['torch']}; malloc: {env.get('malloc', 'default')}", ""]
  if peak:
    best = {}
    for r in records:
      if r["section"] == "peak":
        best[r["impl"]] = max(best.get(r["impl"], 0), r["flops_per_s"])
    lines += ["Matmul peak (best square matmul, n = 1024…4096): "
              + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in best.items())
              + f"; MFU below is against {peak / 1e9:.0f} GFLOP/s.", ""]
  lines += ["| step | batch × seq | implementation | median ms | tokens/s | JAX / PyTorch "
            "time | MFU |", "|---|---|---|---:|---:|---:|---:|"]
  for r in records:
    if r["section"] in ("forward", "train"):
      mfu = f"{r['flops_per_s'] / peak:.0%}" if peak else "unmeasured"
      lines.append(f"| {r['section']} | {r['batch']} × {r['seq']} | {r['impl']} | "
                   f"{r['seconds'] * 1e3:.1f} | {r['tokens_per_s']:,.0f} | "
                   f"{r['ratio_to_torch']:.2f} | {mfu} |")
  notes = [r for r in records if r["section"] == "note"]
  for r in notes:
    lines.append(f"\n{r['impl']} at {r['batch']} × {r['seq']}: {r['note']}")
  compile_records = [r for r in records if r["section"] == "compile"]
  if compile_records:
    lines += ["", "| layers | unrolled: compile s | scanned: compile s |", "|---:|---:|---:|"]
    for n in sorted({r["layers"] for r in compile_records}):
      by = {r["scanned"]: r["seconds"] for r in compile_records if r["layers"] == n}
      lines.append(f"| {n} | {by.get(False, float('nan')):.1f} | "
                   f"{by.get(True, float('nan')):.1f} |")
  return "\n".join(lines)


def plot(results: dict, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  records = results["records"]
  speed = [r for r in records if r["section"] in ("forward", "train")]
  groups = sorted({(r["section"], r["batch"], r["seq"]) for r in speed},
                  key=lambda g: (g[0] != "forward", g[1] * g[2]))
  impls = sorted({r["impl"] for r in speed}, key=["jax", "torch", "torch.compile"].index)
  compile_records = [r for r in records if r["section"] == "compile"]
  fig, axes = plt.subplots(1, 2 if compile_records else 1, figsize=(11, 4), squeeze=False)
  ax = axes[0, 0]
  width = 0.8 / len(impls)
  for i, impl in enumerate(impls):
    heights = []
    for section, batch, seq in groups:
      match = [r for r in speed if (r["section"], r["batch"], r["seq"], r["impl"]) ==
               (section, batch, seq, impl)]
      heights.append(match[0]["tokens_per_s"] if match else 0)
    ax.bar([g + i * width for g in range(len(groups))], heights, width, label=impl)
  ax.set_xticks([g + width * (len(impls) - 1) / 2 for g in range(len(groups))])
  ax.set_xticklabels([f"{s}\n{b}×{q}" for s, b, q in groups])
  ax.set_ylabel("tokens / s (higher is better)")
  ax.set_title(f"paper-base encoder, {results['dtype']}, {results['environment']['backend']}")
  ax.legend()
  if compile_records:
    ax = axes[0, 1]
    for scanned in (False, True):
      rs = sorted((r for r in compile_records if r["scanned"] == scanned),
                  key=lambda r: r["layers"])
      ax.plot([r["layers"] for r in rs], [r["seconds"] for r in rs], "o-",
              label="scanned" if scanned else "unrolled")
    ax.set_xlabel("layers")
    ax.set_ylabel("train-step compile time (s)")
    ax.set_title("jit compile time vs depth")
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("results")
  parser.add_argument("--plot", default=None, help="PNG path for the plot")
  args = parser.parse_args(argv)
  with open(args.results) as f:
    results = json.load(f)
  print(tables(results))
  if args.plot:
    plot(results, args.plot)
  return 0


if __name__ == "__main__":
  sys.exit(main())
