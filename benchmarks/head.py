r"""The output layer at the masked positions only, against logits at every position.

  python -m benchmarks.head [--vocab 32000] [--sizes 8x512,32x128] [--reps 5]

The training step `python -m train` runs (benchmarks/workload.py) on the paper's base model
with a `--vocab` output layer, float32 at matmul precision "highest": once as training runs it
(`MaskedLM` selects the ceil(0.15 * seq) chosen positions, then applies the output layer), once
with `head_at_every_position=True` (logits [batch, seq, vocab], then the same positions
selected). Both compute the same loss. Reported: median step times of interleaved repetitions
and their ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import jax

from benchmarks.bench import interleaved
from benchmarks.workload import jax_side, paper_base, predictions
from train.run.host import keep_freed_memory


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.head", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--vocab", type=int, default=32000)
  parser.add_argument("--sizes", default="8x512,32x128", help="batch x seq, comma-separated")
  parser.add_argument("--reps", type=int, default=5)
  args = parser.parse_args(argv)
  keep_freed_memory()  # as python -m train runs
  jax.config.update("jax_default_matmul_precision", "highest")
  cfg = dataclasses.replace(paper_base(), vocab_size=args.vocab)
  print(f"paper base, vocab {args.vocab}, float32, {jax.devices()[0].device_kind} "
        f"({os.cpu_count()} cores)")
  for size in args.sizes.split(","):
    batch, seq = (int(x) for x in size.split("x"))
    runners = {}
    for every in (False, True):
      _, train, _, _ = jax_side(cfg, batch, seq, steps_masked=1, head_at_every_position=every)
      runners["every position" if every else "masked positions"] = train
    losses = {name: float(run()) for name, run in runners.items()}  # also compiles
    seconds = interleaved(runners, args.reps, warmup=1)
    masked, every = seconds["masked positions"], seconds["every position"]
    print(f"{batch} x {seq}, {predictions(seq)} predicted per row: masked positions "
          f"{masked * 1e3:.0f} ms, every position {every * 1e3:.0f} ms, {every / masked:.2f}x "
          f"(first losses {losses['masked positions']:.4f} / {losses['every position']:.4f})",
          flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
