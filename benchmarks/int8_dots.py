r"""Where XLA:CPU's int8 matrix products stand: GFLOP/s of int8 x int8 -> int32 against float32
(and bfloat16 -> float32) on the shapes of an encoder's dense layers, under each of XLA:CPU's
matrix-product libraries.

  python -m benchmarks.int8_dots [--out benchmarks/results/int8_dots.json] [--quick]

Shapes (ids x in x out): a call of 4,096 ids through MiniLM's layers (384 wide, 1,536 in the
feed-forward) and 2,048 through BERT-base's (768, 3,072). Each product is jitted, run once,
then timed over `--reps` calls (the median of three such timings). Each setting of XLA_FLAGS
runs in a process of its own (XLA reads them once): the default; oneDNN's custom call
(--xla_cpu_experimental_onednn_custom_call); the dot fusions of oneDNN, XNNPACK and YNNPACK
(--xla_cpu_experimental_{onednn,xnn,ynn}_fusion_type=dot).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SHAPES = ((4096, 384, 384), (4096, 384, 1536), (4096, 1536, 384), (2048, 768, 3072))
QUICK_SHAPES = ((256, 64, 64),)
SETTINGS = {"default": "",
            "oneDNN custom call": "--xla_cpu_experimental_onednn_custom_call=true",
            "oneDNN dot fusion": "--xla_cpu_experimental_onednn_fusion_type=dot",
            "XNNPACK dot fusion": "--xla_cpu_experimental_xnn_fusion_type=dot",
            "YNNPACK dot fusion": "--xla_cpu_experimental_ynn_fusion_type=dot"}


def measure(shapes, reps: int) -> list[dict]:
  """GFLOP/s of each kind of product on each of `shapes`, in this process."""
  import time

  import jax
  import jax.numpy as jnp
  import numpy as np

  def seconds(f, *args) -> float:
    f(*args).block_until_ready()
    times = []
    for _ in range(3):
      start = time.perf_counter()
      for _ in range(reps):
        out = f(*args)
      out.block_until_ready()
      times.append((time.perf_counter() - start) / reps)
    return sorted(times)[1]

  dot = lambda out: jax.jit(lambda a, b: jax.lax.dot_general(
      a, b, (((1,), (0,)), ((), ())), preferred_element_type=out))
  rng = np.random.default_rng(0)
  rows = []
  for m, k, n in shapes:
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    a8, b8 = (rng.integers(-127, 128, s, dtype=np.int8) for s in ((m, k), (k, n)))
    flops = 2 * m * k * n
    rows.append({"shape": [m, k, n],
                 "float32": flops / seconds(dot(jnp.float32), a, b) / 1e9,
                 "int8": flops / seconds(dot(jnp.int32), a8, b8) / 1e9,
                 "bfloat16": flops / seconds(dot(jnp.float32), a.astype(jnp.bfloat16),
                                             b.astype(jnp.bfloat16)) / 1e9})
  return rows


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.int8_dots", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--reps", type=int, default=10, help="calls a timing (default 10)")
  parser.add_argument("--quick", action="store_true", help="one tiny shape, the default flags")
  parser.add_argument("--out", help="results JSON")
  parser.add_argument("--child", help=argparse.SUPPRESS)  # a setting's own process
  args = parser.parse_args(argv)
  shapes = QUICK_SHAPES if args.quick else SHAPES
  if args.child is not None:
    print(json.dumps(measure(shapes, args.reps)))
    return 0
  settings = {"default": ""} if args.quick else SETTINGS
  results = {}
  for name, flags in settings.items():
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip(),
           "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.int8_dots", "--child", name,
                           "--reps", str(args.reps), *(["--quick"] if args.quick else [])],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode:
      print(f"{name}: failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
      continue
    results[name] = json.loads(done.stdout.strip().splitlines()[-1])
  print("| XLA_FLAGS | ids x in x out | float32 GFLOP/s | int8 | bfloat16 | int8 / float32 |")
  print("|---|---|---:|---:|---:|---:|")
  for name, rows in results.items():
    for r in rows:
      print(f"| {name} | {' x '.join(map(str, r['shape']))} | {r['float32']:.0f} | "
            f"{r['int8']:.0f} | {r['bfloat16']:.0f} | {r['int8'] / r['float32']:.2f} |")
  if args.out:  # without bench.environment(), which reads torch's version: no torch needed
    import platform

    import jax
    from benchmarks import bench
    environment = {"jax": jax.__version__, "python": platform.python_version(),
                   "cpu": platform.machine(), "cores": os.cpu_count()}
    bench.write_results(args.out, {"environment": environment, "settings": SETTINGS,
                                   "results": results})
  return 0


if __name__ == "__main__":
  sys.exit(main())
