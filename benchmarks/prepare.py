r"""`python -m train.prepare` on generated corpora: throughput and peak memory against size.

  python -m benchmarks.prepare [--sizes-mb 50,500] [--tokenizer bytes] [--workers 1,2]

Each corpus is the built-in one (pydoc topics) repeated to the size, as 20 text files. Reported
per run: MB of text per second, per worker, and the peak resident memory of the largest
process (the preparing one or a worker: `ru_maxrss` of the waited-for children). With
`--tokenizer sentencepiece` the vocabulary (`--vocab-size`) is trained first, on at most 100 MB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = 20


def write_corpus(directory: str, megabytes: float) -> None:
  from pydoc_data.topics import topics
  text = "".join(topics[name] for name in sorted(topics)).encode("utf-8")
  per_file = int(megabytes * 1e6 / FILES)
  for i in range(FILES):
    with open(os.path.join(directory, f"part{i:02d}.txt"), "wb") as f:
      written = 0
      while written < per_file:
        piece = text[:per_file - written]
        f.write(piece)
        written += len(piece)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.prepare", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--sizes-mb", default="50,500")
  parser.add_argument("--tokenizer", default="bytes")
  parser.add_argument("--vocab-size", default=None)
  parser.add_argument("--workers", default="1,2")
  args = parser.parse_args(argv)
  print(f"{os.cpu_count()} cores")
  for megabytes in [float(x) for x in args.sizes_mb.split(",")]:
    with tempfile.TemporaryDirectory() as root:
      corpus = os.path.join(root, "corpus")
      os.makedirs(corpus)
      write_corpus(corpus, megabytes)
      for workers in [int(x) for x in args.workers.split(",")]:
        out = os.path.join(root, f"out{workers}")
        cmd = [sys.executable, "-m", "train.prepare", "--input", os.path.join(corpus, "*.txt"),
               "--out", out, "--tokenizer", args.tokenizer, "--seq-len", "512",
               "--workers", str(workers)]
        if args.vocab_size:
          cmd += ["--vocab-size", args.vocab_size]
        # ru_maxrss of children is the largest of those waited for so far: run each
        # measurement in a fresh child of its own.
        probe = [sys.executable, "-c", "import resource, subprocess, sys; "
                 "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, "
                 "stderr=subprocess.DEVNULL); "
                 "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)", *cmd]
        start = time.perf_counter()
        result = subprocess.run(probe, cwd=ROOT, check=True, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        peak_mb = int(result.stdout.split()[-1]) / 1024
        print(f"{megabytes:6.0f} MB, {args.tokenizer}, {workers} worker(s): {seconds:6.1f} s, "
              f"{megabytes / seconds / workers:5.1f} MB/s per worker, peak RSS {peak_mb:5.0f} MB",
              flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
