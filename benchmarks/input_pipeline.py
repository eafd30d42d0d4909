r"""Tokens per second the training input pipeline delivers on the host, ready for the devices.

  python -m benchmarks.input_pipeline [--prepared DIR] [--megabytes 100] [--workers 0,1,2]
                                      [--batch 64] [--batches 300]

`train.data.pipeline.TrainBatches` as `python -m train` runs it (grain: an exact shuffle of the
window indices, reshuffled every epoch, batched, one read of the batch's rows from the memory-mapped
windows; masking happens later, in the jitted step) over the training windows of DIR, a directory
`python -m train.prepare` wrote. Without DIR: a generated text corpus of `--megabytes` MB
(benchmarks/prepare.py's), prepared as bytes at seq_len 128 and 512 into a temporary directory, so
its windows are in the page cache. Reported per worker count: tokens per second over `--batches`
batches, after 10 untimed ones (which include the workers' start).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from absl import flags

from benchmarks.prepare import write_corpus
from train.data import dataset, pipeline, prepare


def tokens_per_s(windows: dataset.Windows, batch: int, batches: int, workers: int) -> float:
  iterator = pipeline.TrainBatches(windows.train, batch, 0, workers)
  try:
    for _ in range(10):
      next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
      next(iterator)
    return batches * batch * windows.train.shape[1] / (time.perf_counter() - start)
  finally:
    iterator.close()


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.input_pipeline",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--prepared", default=None)
  parser.add_argument("--megabytes", type=float, default=100)
  parser.add_argument("--workers", default="0,1,2")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--batches", type=int, default=300)
  args = parser.parse_args(argv)
  flags.FLAGS.mark_as_parsed()  # grain's worker processes read its absl flags
  with tempfile.TemporaryDirectory() as root:
    if args.prepared:
      directories = [args.prepared]
    else:
      corpus = os.path.join(root, "corpus")
      os.makedirs(corpus)
      write_corpus(corpus, args.megabytes)
      directories = []
      for seq_len in (128, 512):
        directory = os.path.join(root, str(seq_len))
        prepare.prepare([os.path.join(corpus, "*.txt")], directory, seq_len=seq_len,
                        eval_fraction=0.01, progress=False)
        directories.append(directory)
    print(f"{os.cpu_count()} cores")
    for directory in directories:
      with open(os.path.join(directory, "dataset.json")) as f:
        seq_len = json.load(f)["seq_len"]
      windows = dataset.load_prepared(directory, seq_len)
      for workers in [int(w) for w in args.workers.split(",")]:
        rate = tokens_per_s(windows, args.batch, args.batches, workers)
        print(f"{args.batch} x {seq_len} ({len(windows.train):,} windows), {workers} "
              f"worker(s): {rate / 1e6:6.1f} M tokens/s", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
