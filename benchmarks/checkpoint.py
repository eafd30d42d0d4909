r"""How long a checkpoint holds up training, and how long restoring and verifying one takes.

  python -m benchmarks.checkpoint [--dir /tmp/ckpt] [--saves 3]

The train state of the paper-base model with its 8192-way output layer (parameters and Adam's
two moments, float32) and the training pipeline's iterator, saved with train.run.checkpoint as the
training loop saves them. Reported, as medians over `--saves`:
  blocked   the `Checkpointer.save` call: how long the training loop waits for a save;
  commit    from then until the checkpoint is on disk and verified-ready (orbax's background
            write, the manifest of SHA-256s);
  restore   `restore_newest` onto a fresh abstract state: verification and reading.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

from benchmarks.workload import paper_base, paper_optimizer, paper_task
from flax_encoder import sharding
from train.data import pipeline
from train.run.checkpoint import Checkpointer
from train.run.host import keep_freed_memory
from train.run.step import abstract_state, init_state


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.checkpoint", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--dir", default=None, help="where to write (default: a temporary dir)")
  parser.add_argument("--saves", type=int, default=3)
  args = parser.parse_args(argv)
  keep_freed_memory()
  cfg = paper_base()
  task = paper_task(cfg, 128)
  tx, _ = paper_optimizer(cfg)
  state = init_state(task, tx, 0, 128)
  target = abstract_state(task, tx, 128, sharding.make_mesh())
  size = sum(x.nbytes for x in jax.tree.leaves(state))
  tokens = np.random.default_rng(0).integers(4, 260, (64, 128)).astype(np.uint16)
  iterator = pipeline.TrainBatches(tokens, 8, 0)

  root = args.dir or tempfile.mkdtemp(prefix="checkpoint_bench_")
  directory = os.path.join(root, "checkpoints")
  shutil.rmtree(directory, ignore_errors=True)
  checkpointer = Checkpointer(directory, keep=2)
  blocked, commit, restore = [], [], []
  for step in range(1, args.saves + 1):
    start = time.perf_counter()
    checkpointer.save(step, state, iterator, {})
    saved = time.perf_counter()
    checkpointer.wait()
    blocked.append(saved - start)
    commit.append(time.perf_counter() - saved)
    start = time.perf_counter()
    restored = checkpointer.restore_newest(target)
    jax.block_until_ready(restored[0])
    restore.append(time.perf_counter() - start)
  checkpointer.close()
  if not args.dir:
    shutil.rmtree(root)
  median = lambda xs: statistics.median(xs) * 1e3
  print(f"train state {size / 1e6:.0f} MB on {jax.devices()[0].device_kind} ({os.cpu_count()} "
        f"cores): blocked {median(blocked):.0f} ms, commit {median(commit):.0f} ms, restore and "
        f"verify {median(restore):.0f} ms (medians of {args.saves})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
