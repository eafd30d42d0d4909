r"""What keeping documents apart and accumulating gradients cost the training step.

  python -m benchmarks.options [--size 64x512] [--accum 1,2,4] [--reps 2] [--skip-time]

The paper-base training step (benchmarks/workload.py, configs/base.py's task, float32 here,
bfloat16 with `--dtype bfloat16`), compiled for one device:
  memory  `compiled.memory_analysis()`: the step's temporaries (activations, gradients) and
          its arguments (state and batch), for documents apart or not and each
          grad_accum_steps k, without allocating anything;
  time    median step time, interleaved: documents together, then apart (the dense
          [batch, 1, seq, seq] segment mask against the [batch, 1, 1, seq] padding mask) with
          each grad_accum_steps k.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax

from benchmarks.bench import interleaved
from benchmarks.workload import compiled_train_step, jax_side, paper_base
from train.run.host import keep_freed_memory


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.options", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--size", default="64x512", help="batch x seq")
  parser.add_argument("--accum", default="1,2,4", help="grad_accum_steps to compile")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--reps", type=int, default=2)
  parser.add_argument("--skip-time", action="store_true", help="memory only")
  args = parser.parse_args(argv)
  keep_freed_memory()
  batch, seq = (int(x) for x in args.size.split("x"))
  cfg = paper_base(dtype=args.dtype)
  print(f"paper base, {batch} x {seq}, {args.dtype}, {jax.devices()[0].device_kind} "
        f"({os.cpu_count()} cores)", flush=True)
  for apart in (False, True):
    for k in (int(x) for x in args.accum.split(",")):
      analysis = compiled_train_step(cfg, batch, seq, k, not apart).memory_analysis()
      print(f"documents {'apart' if apart else 'together'}, grad_accum_steps {k}: temporaries "
            f"{analysis.temp_size_in_bytes / 1e9:.2f} GB, arguments "
            f"{analysis.argument_size_in_bytes / 1e9:.2f} GB", flush=True)
  if not args.skip_time:
    runs = {"together": (False, 1), **{f"apart, k={k}": (True, k)
                                       for k in (int(x) for x in args.accum.split(","))}}
    runners = {name: jax_side(cfg, batch, seq, steps_masked=1, cross_document_attention=not apart,
                              grad_accum_steps=k)[1] for name, (apart, k) in runs.items()}
    seconds = interleaved(runners, args.reps, warmup=1)
    print("median step time: " + ", ".join(
        f"documents {name} {s * 1e3:.0f} ms ({s / seconds['together']:.2f}x)"
        for name, s in seconds.items()), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
