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
  from train.data.sources import builtin_topics
  text = "".join(builtin_topics()).encode("utf-8")
  per_file = int(megabytes * 1e6 / FILES)
  for i in range(FILES):
    with open(os.path.join(directory, f"part{i:02d}.txt"), "wb") as f:
      written = 0
      while written < per_file:
        piece = text[:per_file - written]
        f.write(piece)
        written += len(piece)


def run(args: list[str]) -> tuple[float, float]:
  """(wall seconds, peak resident MB of the largest process of its tree) of
  python -m train.prepare `args`, from the checkout."""
  start = time.perf_counter()
  process = subprocess.Popen([sys.executable, "-m", "train.prepare", *args], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  stderr = process.stderr.read()
  _, status, usage = os.wait4(process.pid, 0)  # the usage of this process and its children
  seconds = time.perf_counter() - start
  if os.waitstatus_to_exitcode(status) != 0:
    raise SystemExit(f"python -m train.prepare {' '.join(args)} failed:\n{stderr[-2000:]}")
  return seconds, usage.ru_maxrss / 1024


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
        cmd = ["--input", os.path.join(corpus, "*.txt"), "--out", out, "--tokenizer",
               args.tokenizer, "--seq-len", "512", "--workers", str(workers)]
        if args.vocab_size:
          cmd += ["--vocab-size", args.vocab_size]
        seconds, peak_mb = run(cmd)
        print(f"{megabytes:6.0f} MB, {args.tokenizer}, {workers} worker(s): {seconds:6.1f} s, "
              f"{megabytes / seconds / workers:5.1f} MB/s per worker, peak RSS {peak_mb:5.0f} MB",
              flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
