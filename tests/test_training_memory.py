"""The host memory of a training run stops growing once it is warmed up: a contrastive run of
`python -m train` on pairs whose texts run from one byte to twice seq_len (half of them cut),
read from the resident memory its metrics.jsonl records at every step.

It runs in a process of its own, so that the allocator is the one the program picks for itself
(train/run/host.py: jemalloc where it is installed, else glibc's malloc as set there), and
the resident memory is the program's alone."""

import json
import os

import numpy as np
import pytest

from tests import runs

SEQ_LEN = 64
# 128 texts a batch: their packed rows vary little from batch to batch, so the step compiles
# for two counts of rows, both within the first few steps (a third shape compiled after the
# warm-up would add its code, ~20 MB, and fail the test without any fault of the allocator).
BATCH_PAIRS = 64
STEPS = 60
WARM_UP = 20  # steps: every shape compiled, the allocator's pools grown to what a step needs
# Where memory grows it grows in whole blocks of a step's temporaries (14 to 17 MB here: glibc's
# heap fragments, and the next step's block no longer fits where the last one was freed), or
# by a compiled shape. Measured on a 2-core Xeon, the memory held in steps 41 to 60 less that
# held in steps 11 to 20: jemalloc -15 to +1 MB in 14 runs; glibc mapping blocks of 8 MiB or
# more (M_MMAP_THRESHOLD), 0 to +1 MB in 14; glibc keeping freed memory (M_MMAP_MAX 0, never
# trimmed) 0 to +78 MB, over 8 MB in 7 runs of 11; glibc's defaults +6 to +81 MB, over 8 MB in
# 9 of 11. Half a block tells them apart.
TOLERANCE_GB = 0.008


def _text(rng, length: int) -> str:
  # Bytes ids (config.data.tokenizer=bytes): one id per character; never blank.
  return "x" + "".join(rng.choice(list("abcdefghij "), length - 1))


def _write_pairs(path, count: int, seed: int) -> str:
  """`count` pairs whose texts are 1 to 2 * SEQ_LEN bytes long, uniformly."""
  rng = np.random.default_rng(seed)
  with open(path, "w") as f:
    for _ in range(count):
      anchor, positive = (_text(rng, int(n)) for n in rng.integers(1, 2 * SEQ_LEN + 1, 2))
      f.write(json.dumps({"anchor": anchor, "positive": positive}) + "\n")
  return str(path)


@pytest.mark.slow  # a run long enough to see its memory level off
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"),
                    reason="the program reads its resident memory from /proc (Linux)")
def test_resident_memory_stops_growing_after_the_warm_up(tmp_path):
  train = _write_pairs(tmp_path / "train.jsonl", 10 * BATCH_PAIRS, seed=0)
  held_out = _write_pairs(tmp_path / "eval.jsonl", 32, seed=1)
  workdir = str(tmp_path / "run")
  runs.train(
      workdir, f"--config.data.train={train}", f"--config.data.eval={held_out}",
      "--config.data.tokenizer=bytes", "--config.data.eval_pairs=32",
      "--config.model.d_model=16", "--config.model.n_heads=2", "--config.model.d_ff=32",
      "--config.model.n_layers=1", f"--config.model.max_len={SEQ_LEN}",
      f"--config.train.seq_len={SEQ_LEN}", f"--config.train.batch_size={BATCH_PAIRS}",
      f"--config.train.num_steps={STEPS}", "--config.train.log_every=1",
      f"--config.train.eval_every={STEPS}", f"--config.train.checkpoint_every={STEPS}",
      "--config.train.eval_at_start=False",
      config=os.path.join(runs.ROOT, "configs", "embed.py"), env=runs.environment())

  records = runs.read_metrics(os.path.join(workdir, "metrics.jsonl"))
  resident = {r["step"]: r["host_resident_gb"] for r in records if r["split"] == "train"}
  assert sorted(resident) == list(range(1, STEPS + 1))
  series = [round(resident[s] * 1e3) for s in sorted(resident)]
  print(f"resident memory per step (MB): {series}")
  # A step's temporaries are resident at the end of a log window or not (whether the next
  # step has started; whether the allocator gave a freed block back to the kernel), so the
  # samples swing by a block: what the run holds is the least of them over some steps.
  held_warm = min(resident[s] for s in range(WARM_UP - 9, WARM_UP + 1))
  held_end = min(resident[s] for s in range(STEPS - 19, STEPS + 1))
  assert held_end <= held_warm + TOLERANCE_GB, (
      f"resident memory grew after the warm-up: {held_warm * 1e3:.0f} MB held in steps "
      f"{WARM_UP - 9} to {WARM_UP}, {held_end * 1e3:.0f} MB in steps {STEPS - 19} to {STEPS}; "
      f"per step (MB): {series}")
