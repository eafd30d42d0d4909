r"""A large global batch of contrastive pairs on simulated CPU devices with GradCache: the
memory `python -m train` announces its training step needs against the memory its process
holds.

  python -m benchmarks.big_batch      # 4,096 pairs a step on 8 devices: ~30 s on 2 cores
  python -m benchmarks.big_batch --pairs 256 --devices 4 --steps 2   # a quick look
  python -m benchmarks.big_batch --out benchmarks/results/big_batch.json

The pairs are made up here: an anchor of 1 to 3 words and a positive of 2 to 5 (words of 2 to
7 random letters), read by the bytes tokenizer (one id a character) and cut at --seq-len ids;
--steps batches of new pairs, and 64 held-out pairs. The run is
`python -m train --config=configs/embed.py` in a process of its own on --devices CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count), config.mesh.data = --devices, GradCache
(config.task.cached=True, config.task.mini_batch = --mini-batch texts a chunk), a tiny encoder
(--d-model, 2 heads, d_ff 2 x d_model, --layers), a train record every step, one evaluation
and one checkpoint at the end, and the malloc the program picks (jemalloc where installed).

Memory is read from /proc (Linux). Once the run prints its memory line (the step compiled,
before the train state is allocated), its resident memory is read and its peak ("high water
mark") reset (/proc/PID/clear_refs), so that the peak it reaches after that is the training's:
the state, the batches, the steps, the evaluation and the checkpoint at the end (and the
compiling of a step for a larger packed batch, if one comes). Reported:

  announced_gb_per_device  the largest "memory: the training step needs X per device" line
                           (the state, a batch, the step's outputs and temporaries, from XLA's
                           memory analysis of the compiled step)
  announced_gb             that times the devices: on a CPU they share the host's memory
  compiled_rss_gb          the resident memory when the step is compiled (Python, JAX, XLA's
                           compiler and code, the prepared pairs)
  training_peak_rss_gb     the peak resident memory after that (VmHWM, read every 5 ms)
  training_gb              the difference: what training added at its peak, against
                           announced_gb
  peak_rss_gb              the run's peak resident memory, compiling included
  host_resident_gb         the most the run's train records say (at the end of each step)
  seconds                  the run's wall time

XLA's figure is its buffer assignment: it leaves out the scratch that XLA:CPU's matrix-multiply
kernels (Eigen's contraction, YNNPACK) allocate for themselves while they run, to pack an
operand, which for the [B / devices, B] similarities of a contrastive step is megabytes per
device: training_gb comes out above announced_gb by about that (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import string
import subprocess
import sys
import tempfile
import time

import numpy as np

from train.run.metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELD_OUT = 64
_ANNOUNCED = re.compile(r"memory: (?:a batch needs \d+ packed rows: )?the training step needs "
                        r"([\d.]+) (GB|MB) per device")


def write_pairs(path: str, count: int, seed: int) -> str:
  """`count` made-up pairs as JSON lines at `path`: an anchor of 1 to 3 words and a positive of
  2 to 5, each word 2 to 7 random lower-case letters."""
  rng = np.random.default_rng(seed)
  letters = np.array(list(string.ascii_lowercase))

  def words(low: int, high: int) -> str:
    return " ".join("".join(rng.choice(letters, int(rng.integers(2, 8))))
                    for _ in range(int(rng.integers(low, high + 1))))

  with open(path, "w") as f:
    for _ in range(count):
      f.write(json.dumps({"anchor": words(1, 3), "positive": words(2, 5)}) + "\n")
  return path


def announced_gb(log: str) -> float:
  """The largest memory a training step of the run whose output is `log` announced it needs
  per device, in GB."""
  with open(log, errors="replace") as f:
    found = _ANNOUNCED.findall(f.read())
  if not found:
    raise RuntimeError(f"no memory line in {log}")
  return max(float(n) * (1.0 if unit == "GB" else 1e-3) for n, unit in found)


def _status_kb(pid: int, field: str) -> int:
  """A memory field of /proc/PID/status (VmRSS, VmHWM), in kB."""
  with open(f"/proc/{pid}/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def run(args, work: str) -> dict:
  """The `python -m train` run: its announced memory, its resident memory when the step is
  compiled and at its peaks, the host_resident_gb of its train records and its wall time.
  Raises if it fails."""
  workdir, log = os.path.join(work, "run"), os.path.join(work, "run.log")
  train = write_pairs(os.path.join(work, "train.jsonl"), args.pairs * args.steps, seed=0)
  held_out = write_pairs(os.path.join(work, "eval.jsonl"), HELD_OUT, seed=1)
  command = [
      sys.executable, "-m", "train", "--config=configs/embed.py", f"--workdir={workdir}",
      f"--config.data.train={train}", f"--config.data.eval={held_out}",
      "--config.data.tokenizer=bytes", f"--config.data.eval_pairs={HELD_OUT}",
      f"--config.model.d_model={args.d_model}", "--config.model.n_heads=2",
      f"--config.model.d_ff={2 * args.d_model}", f"--config.model.n_layers={args.layers}",
      f"--config.model.max_len={args.seq_len}", f"--config.train.seq_len={args.seq_len}",
      f"--config.train.batch_size={args.pairs}", f"--config.train.num_steps={args.steps}",
      "--config.train.log_every=1", f"--config.train.eval_every={args.steps}",
      f"--config.train.checkpoint_every={args.steps}", "--config.train.eval_at_start=False",
      f"--config.mesh.data={args.devices}", "--config.task.cached=True",
      f"--config.task.mini_batch={args.mini_batch}"]
  given = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(
      [f"--xla_force_host_platform_device_count={args.devices}", *given])}
  start, compiled_kb, compile_peak_kb, training_peak_kb = time.perf_counter(), None, None, 0
  with open(log, "w") as out:
    child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    while child.poll() is None:
      try:
        if compiled_kb is not None:  # the peak since the reset; it only grows
          training_peak_kb = max(training_peak_kb, _status_kb(child.pid, "VmHWM"))
        else:
          with open(log, errors="replace") as f:
            compiled = _ANNOUNCED.search(f.read())
          if compiled:
            compiled_kb = _status_kb(child.pid, "VmRSS")
            compile_peak_kb = _status_kb(child.pid, "VmHWM")
            with open(f"/proc/{child.pid}/clear_refs", "w") as f:
              f.write("5")  # the high water mark := the resident memory now
      except (OSError, StopIteration):  # it has just exited
        pass
      time.sleep(0.005)
    status = child.returncode
  seconds = time.perf_counter() - start
  if status or compiled_kb is None:
    with open(log, errors="replace") as f:
      tail = f.read()[-3000:]
    raise RuntimeError(f"python -m train exited {status}; the end of {log}:\n{tail}")
  records = [r for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))
             if r["split"] == "train"]
  per_device = announced_gb(log)
  with open(log, errors="replace") as f:
    malloc = re.search(r"host malloc: (\w+)", f.read())
  return {"malloc": malloc.group(1) if malloc else None,
          "announced_gb_per_device": per_device, "announced_gb": per_device * args.devices,
          "compiled_rss_gb": compiled_kb * 1024 / 1e9,
          "training_peak_rss_gb": training_peak_kb * 1024 / 1e9,
          "training_gb": (training_peak_kb - compiled_kb) * 1024 / 1e9,
          "peak_rss_gb": max(compile_peak_kb, training_peak_kb) * 1024 / 1e9,
          "host_resident_gb": max(r["host_resident_gb"] for r in records),
          "steps": len(records), "seconds": seconds}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.big_batch", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--pairs", type=int, default=4096, help="pairs a step (global batch)")
  parser.add_argument("--devices", type=int, default=8, help="simulated CPU devices")
  parser.add_argument("--mini-batch", type=int, default=256, help="GradCache's texts a chunk")
  parser.add_argument("--steps", type=int, default=4)
  parser.add_argument("--seq-len", type=int, default=32)
  parser.add_argument("--d-model", type=int, default=32)
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--workdir", help="where the pairs, runs and logs go (default: a "
                      "temporary directory, removed)")
  parser.add_argument("--out", help="also write the figures here as JSON")
  args = parser.parse_args(argv)
  if not os.path.exists("/proc/self/clear_refs"):
    parser.error("reads and resets the run's memory in /proc: Linux only")
  if (2 * args.pairs) % args.mini_batch or args.pairs % args.devices:
    parser.error("--mini-batch must divide the 2 x --pairs texts, --devices the --pairs")

  with tempfile.TemporaryDirectory() as scratch:
    work = args.workdir or scratch
    os.makedirs(work, exist_ok=True)
    measured = run(args, work)
  chunks = 2 * args.pairs // args.mini_batch
  result = {"environment": {"jax": importlib.metadata.version("jax"),
                            "jaxlib": importlib.metadata.version("jaxlib"),
                            "python": platform.python_version(), "cores": os.cpu_count(),
                            "platform": platform.platform()},
            "pairs": args.pairs, "devices": args.devices, "mini_batch": args.mini_batch,
            "chunks": chunks, "steps": args.steps, "seq_len": args.seq_len,
            "d_model": args.d_model, "layers": args.layers, **measured}
  print(f"{args.pairs} pairs a step ({2 * args.pairs} texts) on {args.devices} CPU devices, "
        f"GradCache {args.mini_batch} texts a chunk ({chunks} chunks), {measured['steps']} "
        f"steps in {measured['seconds']:.0f} s")
  print(f"announced: {measured['announced_gb_per_device']:.4f} GB per device, "
        f"{measured['announced_gb']:.3f} GB for the {args.devices} devices")
  print(f"resident: {measured['compiled_rss_gb']:.3f} GB with the step compiled, at most "
        f"{measured['training_peak_rss_gb']:.3f} GB after: training added "
        f"{measured['training_gb']:.3f} GB (announced {measured['announced_gb']:.3f} GB)")
  print(f"peak resident {measured['peak_rss_gb']:.3f} GB, compiling included; host_resident_gb "
        f"in the train records at most {measured['host_resident_gb']:.3f} GB")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
