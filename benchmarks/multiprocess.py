r"""Step time of one run as 2 processes x 2 devices against 1 process x 4 devices, same mesh.

  python -m benchmarks.multiprocess [--steps 200] [-- more python -m train arguments]

Both run `python -m train` on configs/default.py with mesh data=2 x fsdp=2 on CPU devices; the
two processes join through jax.distributed (`python -m train.launch`) and exchange their
collectives over gloo, the one process within itself. Reported: the median training throughput
of the log windows after the first (which holds the compile), from each run's metrics.jsonl.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from train.run.metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESH = ["--config.mesh.data=2", "--config.mesh.fsdp=2"]


def tokens_per_s(workdir: str) -> float:
  records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
  rates = [r["tokens_per_s"] for r in records if r["split"] == "train"]
  return statistics.median(rates[1:])


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  extra = argv[argv.index("--") + 1:] if "--" in argv else []
  argv = argv[:argv.index("--")] if "--" in argv else argv
  parser = argparse.ArgumentParser(prog="python -m benchmarks.multiprocess", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=200)
  args = parser.parse_args(argv)
  train_args = [*MESH, f"--config.train.num_steps={args.steps}",
                f"--config.train.eval_every={args.steps}", *extra]
  runs = {
      "1 process x 4 devices": ([sys.executable, "-m", "train"],
                                "--xla_force_host_platform_device_count=4"),
      "2 processes x 2 devices": ([sys.executable, "-m", "train.launch", "--processes", "2",
                                   "--devices-per-process", "2", "--"], ""),
  }
  results = {}
  with tempfile.TemporaryDirectory() as root:
    for name, (command, flags) in runs.items():
      workdir = os.path.join(root, name.replace(" ", "_"))
      env = {**os.environ, "XLA_FLAGS": flags}
      subprocess.run([*command, f"--workdir={workdir}", *train_args], cwd=ROOT, env=env,
                     check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
      results[name] = tokens_per_s(workdir)
  one, two = results.values()
  for name, rate in results.items():
    print(f"{name}: {rate:,.0f} tokens/s")
  print(f"2 processes / 1 process step time: {one / two:.2f} ({os.cpu_count()} cores)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
