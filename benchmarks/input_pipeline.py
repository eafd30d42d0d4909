r"""Tokens per second the training input pipeline delivers on the host, ready for the devices.

  python -m benchmarks.input_pipeline [--prepared DIR] [--batch 64] [--batches 50]

`train.data.train_batches` (shuffle, masking, batching, as `python -m train` runs it) over the
training windows of DIR, a directory `python -m train.prepare` wrote; without DIR, over the
built-in corpus prepared as bytes at seq_len 128 and 512 into a temporary directory. Reported:
tokens per second over `--batches` batches after 3 untimed ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from train import data, prepare


def tokens_per_s(windows, batch: int, batches: int) -> float:
  iterator = data.train_batches(windows.train, batch, 0.15, 0, windows.vocab_size)
  for _ in range(3):
    next(iterator)
  start = time.perf_counter()
  for _ in range(batches):
    next(iterator)
  return batches * batch * windows.train.shape[1] / (time.perf_counter() - start)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.input_pipeline",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--prepared", default=None)
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--batches", type=int, default=50)
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as root:
    if args.prepared:
      directories = [args.prepared]
    else:
      directories = []
      for seq_len in (128, 512):
        directory = os.path.join(root, str(seq_len))
        prepare.prepare([prepare.BUILTIN], directory, seq_len=seq_len, eval_fraction=0.01,
                        progress=False)
        directories.append(directory)
    for directory in directories:
      with open(os.path.join(directory, "dataset.json")) as f:
        seq_len = json.load(f)["seq_len"]
      windows = data.load_prepared(directory, seq_len)
      rate = tokens_per_s(windows, args.batch, args.batches)
      print(f"{args.batch} x {seq_len}: {rate / 1e6:.2f} M tokens/s ({os.cpu_count()} cores)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
