r"""What checking a prepared file's ids costs at the start of a run.

  python -m benchmarks.verify_data [--gigabytes 1] [--dir /tmp]

Writes a train.bin of `--gigabytes` GB of uint16 ids in windows of 512 (random ids below a 32,004-id
vocabulary), then times `train.data.dataset.check_ids`, the pass over the memory-mapped file that
every run makes once per file before its first step: twice with the file in the page cache (as right
after `train.prepare`), once after asking the kernel to drop it from the cache (posix_fadvise
DONTNEED; what a file read from disk costs depends on the disk).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from train.data.dataset import check_ids

_SEQ_LEN, _VOCAB = 512, 32_004


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.verify_data", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--gigabytes", type=float, default=1.0)
  parser.add_argument("--dir", default=None, help="where to write (default: a temporary dir)")
  args = parser.parse_args(argv)
  rows = int(args.gigabytes * 1e9) // (_SEQ_LEN * 2)
  with tempfile.TemporaryDirectory(dir=args.dir) as directory:
    path = os.path.join(directory, "train.bin")
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
      for start in range(0, rows, 8192):
        n = min(8192, rows - start)
        f.write(rng.integers(0, _VOCAB, (n, _SEQ_LEN), dtype=np.uint16).tobytes())
    size = os.path.getsize(path)
    for label in ("in the page cache", "in the page cache, again", "after dropping the cache"):
      if label.startswith("after"):  # no map of the file may be open for the kernel to drop it
        with open(path, "rb") as f:
          os.fsync(f.fileno())
          os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
      ids = np.memmap(path, np.uint16, "r", shape=(rows, _SEQ_LEN))
      start = time.perf_counter()
      check_ids(path, ids, _VOCAB)
      seconds = time.perf_counter() - start
      print(f"check_ids over {size / 1e9:.2f} GB ({label}): {seconds:.2f} s, "
            f"{size / seconds / 1e9:.1f} GB/s", flush=True)
      del ids
  return 0


if __name__ == "__main__":
  sys.exit(main())
