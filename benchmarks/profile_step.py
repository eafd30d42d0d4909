r"""Where the training step's time goes: XLA's own per-op trace, grouped by kind of op.

  XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true python -m benchmarks.profile_step --size 8x256

Profiles one call of the training step that `python -m train` runs (benchmarks/workload.py:
forward, backward and the Adam update of the paper-base model with its output layer) after a
warm-up, and prints milliseconds per op kind ("ynn_fusion" and "dot" are matmuls on XLA:CPU;
"copy"/"transpose" fusions are layout changes) against the time the matmul FLOPs would take at
the measured matmul peak, then the slowest single ops. XLA:CPU runs independent ops
concurrently, so op times add up to more than the wall time.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import sys
import tempfile

import jax
import numpy as np

from benchmarks.bench import matmul_peak
from benchmarks.workload import (flops_per_token, paper_base, paper_optimizer, paper_task,
                                 predictions)
from train.data.tokens import FIRST_TOKEN_ID
from train.run.host import keep_freed_memory
from train.run.step import init_state, make_train_step


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_step", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--size", default="8x256", help="batch x seq")
  parser.add_argument("--attention", default="reference", choices=("reference", "xla"))
  parser.add_argument("--dropout", type=float, default=0.1)
  parser.add_argument("--top", type=int, default=8, help="slowest single ops to list")
  parser.add_argument("--hlo", default=None, help="also write the compiled HLO text here")
  args = parser.parse_args(argv)
  keep_freed_memory()  # as bench.py does by default
  jax.config.update("jax_default_matmul_precision", "highest")
  batch, seq = (int(x) for x in args.size.split("x"))

  cfg = paper_base(attention_impl=args.attention, dropout=args.dropout)
  task = paper_task(cfg, seq)
  tx, schedule = paper_optimizer(cfg)
  state = init_state(task, tx, 0, seq)
  tokens = np.random.default_rng(0).integers(FIRST_TOKEN_ID, cfg.vocab_size, (batch, seq))
  device_batch = jax.device_put(tokens.astype(np.uint16))
  compiled = jax.jit(make_train_step(task, tx, schedule)).lower(state, device_batch).compile()
  jax.block_until_ready(compiled(state, device_batch))
  if args.hlo:
    with open(args.hlo, "w") as f:
      f.write(compiled.as_text())
  with tempfile.TemporaryDirectory() as directory:
    jax.profiler.start_trace(directory, create_perfetto_trace=True)
    jax.block_until_ready(compiled(state, device_batch))
    jax.profiler.stop_trace()
    path = sorted(glob.glob(f"{directory}/**/*.trace.json.gz", recursive=True))[-1]
    with gzip.open(path) as f:
      events = json.load(f)["traceEvents"]

  by_kind, by_op = collections.Counter(), collections.Counter()
  for e in events:
    name = e.get("name", "")
    if e.get("ph") == "X" and not name.startswith("$") and "::" not in name:
      by_kind[re.sub(r"\.\d+$", "", name)] += e.get("dur", 0) / 1e3
      by_op[name] += e.get("dur", 0) / 1e3
  total = sum(by_kind.values())
  if total == 0:
    print("no per-op events: set XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true", file=sys.stderr)
    return 1
  peak = max(r["flops_per_s"] for r in matmul_peak("float32"))
  ideal = flops_per_token(cfg, seq, True, predictions(seq) / seq) * batch * seq / peak * 1e3
  print(f"training step {batch}x{seq}: {total:.0f} ms in XLA ops; the FLOPs at the "
        f"measured matmul peak ({peak / 1e9:.0f} GFLOP/s) would take {ideal:.0f} ms")
  for kind, ms in by_kind.most_common(12):
    print(f"{ms:9.1f} ms  {ms / total:5.1%}  {kind}")
  shapes = _op_shapes(compiled.as_text())
  print("slowest single ops:")
  for op, ms in by_op.most_common(args.top):
    print(f"{ms:9.1f} ms  {op:28s} {shapes.get(op, '')}")
  return 0


def _op_shapes(hlo: str) -> dict[str, str]:
  """{op name: 'shape  what it computes'} from compiled HLO text."""
  shapes = {}
  for m in re.finditer(r'^\s*(?:ROOT )?%(\S+) = (\S+) .*?op_name="([^"]*)"', hlo, re.M):
    shapes[m.group(1)] = f"{m.group(2):22s} {m.group(3).split('/', 1)[-1][-70:]}"
  return shapes


if __name__ == "__main__":
  sys.exit(main())
