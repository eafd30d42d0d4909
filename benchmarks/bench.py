r"""JAX (this package) against the PyTorch port, same model and weights, side by side.

  python -m benchmarks.bench --out benchmarks/results/cpu.json            # all sections
  python -m benchmarks.bench --sizes 8x128 --reps 5 --skip compile        # a quick look

Sections (each a list of records in the output JSON):
  peak     the matmul peak of this device: the best FLOP/s of large square matmuls in JAX and
           in PyTorch, in the benchmark's dtype, measured in this run.
  forward  inference forward of the encoder (no output head), `--sizes` batch x seq.
  train    the training step of `python -m train` (`train.run.step.make_train_step`): masking of the
           token ids, encoder, output layer at the masked positions, label-smoothed
           cross-entropy, backward, Adam with the paper's schedule (benchmarks/workload.py).
  compile  jit compile time of the training step at 6, 12 and 24 layers, unrolled vs scanned.

Implementations: "jax" (jax.jit, state donated), "torch" (the PyTorch tutorial port, eager)
and "torch.compile" (the same module through torch.compile; skipped with a note where it
fails). Repetitions are
interleaved (jax, torch, torch.compile, jax, ...) after warm-up, each after an untimed 0.5 s
pause, and medians are reported.
MFU uses the standard count per token: 2 * N_matmul + 4 * L * d_model * seq for a forward
without head; 6 * (N_matmul + N_head * predicted / seq) + 12 * L * d_model * seq for a
training step whose output layer runs at `predicted` = ceil(0.15 seq) positions per row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.workload import (flops_per_token, jax_side, paper_base, predictions,
                                 torch_side)
from flax_encoder import EncoderConfig
from train.run.host import keep_freed_memory

# ---------------------------------------------------------------------------------------------
# Timing


def _time(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


# Untimed pause before each timed call. Worker threads spin for a while after a parallel
# region (libgomp's, used by PyTorch and torch.compile's kernels, and Eigen's), taking cores from
# whatever runs next on a small CPU; without the pause, JAX's training step measured ~20% slower
# right after torch.compile's than on its own.
PAUSE_S = 0.5


def interleaved(runners: dict, reps: int, warmup: int) -> dict:
  """{name: median seconds} of `reps` calls per runner, alternating runners each round."""
  for run in runners.values():
    for _ in range(warmup):
      run()
  times = {name: [] for name in runners}
  for _ in range(reps):
    for name, run in runners.items():
      time.sleep(PAUSE_S)
      times[name].append(_time(run))
  return {name: statistics.median(ts) for name, ts in times.items()}


# ---------------------------------------------------------------------------------------------
# Sections


def matmul_peak(dtype: str, sizes=(1024, 2048, 4096), reps: int = 5) -> list[dict]:
  import torch
  records = []
  for n in sizes:
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
    jax_mm = jax.jit(jnp.matmul)
    ta = torch.from_numpy(np.asarray(a.astype(jnp.float32))).to(getattr(torch, dtype))
    if jax.default_backend() == "gpu" and torch.cuda.is_available():
      ta = ta.cuda()
    sync = torch.cuda.synchronize if ta.is_cuda else (lambda: None)
    runners = {"jax": lambda: jax_mm(a, a).block_until_ready(),
               "torch": lambda: (torch.matmul(ta, ta), sync())}
    for name, seconds in interleaved(runners, reps, warmup=2).items():
      records.append({"impl": name, "n": n, "seconds": seconds,
                      "flops_per_s": 2 * n**3 / seconds})
  return records


def speed(cfg: EncoderConfig, batch: int, seq: int, reps: int, warmup: int,
          with_compile: bool) -> list[dict]:
  jax_fwd, jax_train, params, host_batches = jax_side(cfg, batch, seq)
  forward = {"jax": jax_fwd}
  train = {"jax": jax_train}
  notes = {}
  forward["torch"], train["torch"] = torch_side(cfg, params, host_batches, compile_=False)
  if with_compile:
    try:
      fwd, trn = torch_side(cfg, params, host_batches, compile_=True)
      fwd(), trn()  # compile here, so a failure is caught and noted
      forward["torch.compile"], train["torch.compile"] = fwd, trn
    except Exception as e:  # noqa: BLE001 - torch.compile's failures are many and varied
      notes["torch.compile"] = f"failed: {type(e).__name__}: {str(e)[:200]}"
  records = []
  for kind, runners in (("forward", forward), ("train", train)):
    medians = interleaved(runners, reps, warmup)
    flops = flops_per_token(cfg, seq, train=kind == "train",
                            predicted=predictions(seq) / seq) * batch * seq
    for name, seconds in medians.items():
      records.append({"section": kind, "impl": name, "batch": batch, "seq": seq,
                      "seconds": seconds, "tokens_per_s": batch * seq / seconds,
                      "flops_per_s": flops / seconds,
                      "ratio_to_torch": seconds / medians["torch"]})
  for name, note in notes.items():
    records.append({"section": "note", "impl": name, "batch": batch, "seq": seq, "note": note})
  return records


def compile_times(cfg: EncoderConfig, layers=(6, 12, 24), batch: int = 8,
                  seq: int = 128) -> list[dict]:
  records = []
  for n in layers:
    for scan in (False, True):
      c = dataclasses.replace(cfg, n_layers=n, scan_layers=scan)
      jax.clear_caches()
      _, train, _, _ = jax_side(c, batch, seq)
      seconds = _time(train)  # the first call traces, lowers and compiles
      records.append({"section": "compile", "layers": n, "scanned": scan,
                      "seconds": seconds})
      print(f"compile: {n} layers, scanned={scan}: {seconds:.1f}s", file=sys.stderr)
  return records


def environment() -> dict:
  """The versions and machine a benchmark ran on (torch's fields None where it is absent)."""
  import flax
  import jaxlib
  try:
    import torch
  except ImportError:
    torch = None
  device = jax.devices()[0]
  return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__,
          "optax": optax.__version__, "torch": torch and torch.__version__,
          "python": platform.python_version(),
          "backend": jax.default_backend(), "device": device.device_kind,
          "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
          "torch_threads": torch and torch.get_num_threads(),
          "matmul_precision": jax.config.jax_default_matmul_precision}


def write_results(path: str, results: dict) -> None:
  """The benchmark's results as JSON at `path` (--out), its directory made where missing."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(results, f, indent=1)
  print(f"wrote {path}", file=sys.stderr)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--sizes", default="8x128,32x512", help="batch x seq, comma-separated")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--attention", default="reference", choices=("reference", "xla", "cudnn"))
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--skip", default="", help="sections to skip: peak,speed,compile,"
                      "torch.compile")
  parser.add_argument("--malloc", default="keep", choices=("keep", "default"),
                      help="keep: glibc malloc keeps freed memory for reuse "
                      "(train.run.host.keep_freed_memory), as python -m train runs; "
                      "default: glibc's defaults")
  parser.add_argument("--out", default=None, help="results JSON (default: print only)")
  args = parser.parse_args(argv)
  skip = set(filter(None, args.skip.split(",")))
  malloc = args.malloc
  if malloc == "keep" and not keep_freed_memory():
    malloc = "default (not glibc)"

  # Both sides in full float32 (no TF32 on GPUs), unless benchmarking bfloat16.
  import torch
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  precision = "highest" if args.dtype == "float32" else "default"
  jax.config.update("jax_default_matmul_precision", precision)

  cfg = paper_base(dtype=args.dtype, attention_impl=args.attention)
  results = {"environment": {**environment(), "malloc": malloc},
             "dtype": args.dtype, "attention": args.attention,
             "config": {k: str(v) for k, v in dataclasses.asdict(cfg).items()}, "records": []}
  if "peak" not in skip:
    peak = matmul_peak(args.dtype)
    results["records"] += [{"section": "peak", **r} for r in peak]
    results["matmul_peak_flops_per_s"] = max(r["flops_per_s"] for r in peak)
    print(f"matmul peak: {results['matmul_peak_flops_per_s'] / 1e9:.1f} GFLOP/s", file=sys.stderr)
  if "speed" not in skip:
    for size in args.sizes.split(","):
      batch, seq = (int(x) for x in size.split("x"))
      records = speed(cfg, batch, seq, args.reps, args.warmup, "torch.compile" not in skip)
      results["records"] += records
      for r in records:
        if "seconds" in r:
          mfu = (f", MFU {r['flops_per_s'] / results['matmul_peak_flops_per_s']:.0%}"
                 if "matmul_peak_flops_per_s" in results else "")
          print(f"{r['section']:8s} {size:7s} {r['impl']:14s} {r['seconds'] * 1e3:9.1f} ms  "
                f"x{r['ratio_to_torch']:.2f} of torch{mfu}", file=sys.stderr)
        else:
          print(f"{r['impl']}: {r['note']}", file=sys.stderr)
  if "compile" not in skip:
    results["records"] += compile_times(paper_base(dtype=args.dtype,
                                                   attention_impl=args.attention))
  if args.out:
    write_results(args.out, results)
  return 0


if __name__ == "__main__":
  sys.exit(main())
