r"""`python -m train.embed` over devices and processes: texts per second of one corpus embedded
to one file, to a folder of parts, over 8 simulated CPU devices and over 2 processes.

  python -m benchmarks.embed_scaling --out benchmarks/results/embed_scaling.json  # minutes
  python -m benchmarks.embed_scaling --quick                                      # seconds

The corpus is the prose paragraphs this checkout ships (benchmarks.finetune_packed.paragraphs)
repeated to `--texts` lines of a .jsonl; the model is the published all-MiniLM-L6-v2 where the
tests' cache holds it, else a random BERT of its sizes (benchmarks.embeddings.random_folder);
the output says which. Each way is a command run in its own process(es), timed from start to
exit (starting Python and JAX, loading the model and compiling included: `startup` is the
same command on a one-line input), interleaved across the ways `--reps` times; a figure is
the median. Every folder is checked to hold the single file's embeddings (to 1e-5) and ids.

  file                     --out e.npy: one process, one device
  folder                   --out dir/ (parts of --part-mb): one process, one device
  folder, 8 devices        the same with XLA_FLAGS=--xla_force_host_platform_device_count=8
  folder, 2 processes      python -m train.launch --program embed --processes 2
                           --devices-per-process 1
  folder, 2 x 4 devices    --processes 2 --devices-per-process 4

Simulated devices and processes share the machine's cores: on a 2-core CPU this measures what
the parts, the manifest, the split over devices and the second process cost, not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import bench
from benchmarks.embeddings import published_minilm, random_folder
from benchmarks.finetune_packed import MINILM, QUICK, paragraphs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ways(folder: str, source: str, scratch: str, part_mb: float) -> dict[str, tuple]:
  """name -> (command, environment, where it writes)."""
  embed = ["--model", folder, "--input", source, "--part-mb", str(part_mb)]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
  eight = env | {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}

  def launch(devices: int) -> list[str]:
    return [sys.executable, "-m", "train.launch", "--program", "embed", "--processes", "2",
            "--devices-per-process", str(devices), "--"]

  single = [sys.executable, "-m", "train.embed"]
  out = {name: os.path.join(scratch, name.replace(" ", "_").replace(",", "")) for name in (
      "file", "folder", "folder, 8 devices", "folder, 2 processes", "folder, 2 x 4 devices")}
  out["file"] += ".npy"
  return {
      "file": ([*single, *embed, "--out", out["file"]], env, out["file"]),
      "folder": ([*single, *embed, "--out", out["folder"] + "/"], env, out["folder"]),
      "folder, 8 devices": ([*single, *embed, "--out", out["folder, 8 devices"] + "/"], eight,
                            out["folder, 8 devices"]),
      "folder, 2 processes": ([*launch(1), *embed, "--out", out["folder, 2 processes"] + "/"],
                              env, out["folder, 2 processes"]),
      "folder, 2 x 4 devices": ([*launch(4), *embed, "--out",
                                 out["folder, 2 x 4 devices"] + "/"], env,
                                out["folder, 2 x 4 devices"]),
  }


def run(command: list[str], env: dict, out: str) -> float:
  """Seconds the command takes, its output removed first (a folder would resume)."""
  subprocess.run(["rm", "-rf", out], check=True)
  start = time.perf_counter()
  done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
  seconds = time.perf_counter() - start
  if done.returncode:
    raise SystemExit(f"{' '.join(command)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
  return seconds


def check(results: dict[str, str]) -> None:
  """Every folder holds the file's embeddings, in its order."""
  from flax_encoder.corpus import read_embeddings
  expected = np.load(results["file"])
  for name, out in results.items():
    if name != "file":
      ids, vectors = read_embeddings(out)
      assert len(ids) == len(expected), (name, len(ids), len(expected))
      np.testing.assert_allclose(vectors, expected, atol=1e-5, err_msg=name)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--texts", type=int, default=8000)
  parser.add_argument("--part-mb", type=float, default=0.25)
  parser.add_argument("--reps", type=int, default=2)
  parser.add_argument("--model", help="a sentence-transformers folder (default: see above)")
  parser.add_argument("--quick", action="store_true", help="a tiny BERT, 200 texts, one rep")
  parser.add_argument("--out", help="results JSON")
  args = parser.parse_args(argv)
  texts = paragraphs()[0]
  with tempfile.TemporaryDirectory() as scratch:
    if args.quick:
      args.texts, args.reps, args.part_mb = 200, 1, 0.01
      folder, about = random_folder(scratch, texts, QUICK), "a tiny random BERT"
    elif args.model:
      folder, about = args.model, args.model
    else:
      folder = published_minilm()
      about = "the published all-MiniLM-L6-v2"
      if folder is None:
        folder, about = random_folder(scratch, texts, MINILM), "a random BERT of MiniLM's sizes"
    source = os.path.join(scratch, "corpus.jsonl")
    with open(source, "w") as f:
      f.writelines(json.dumps({"id": i, "text": texts[i % len(texts)]}) + "\n"
                   for i in range(args.texts))
    one_line = os.path.join(scratch, "one.jsonl")
    with open(one_line, "w") as f:
      f.write(json.dumps({"id": 0, "text": texts[0]}) + "\n")
    timed = ways(folder, source, scratch, args.part_mb)
    startup = ways(folder, one_line, os.path.join(scratch, "startup"), args.part_mb)
    os.makedirs(os.path.join(scratch, "startup"))
    seconds = {name: [] for name in timed}
    started = {name: [] for name in timed}
    for _ in range(args.reps):
      for name in timed:
        seconds[name].append(run(*timed[name]))
        started[name].append(run(*startup[name]))
    check({name: out for name, (_, _, out) in timed.items()})
    parts = len(json.load(open(os.path.join(timed["folder"][2], "manifest.json")))["parts"])
  rows = []
  base = statistics.median(seconds["file"])
  for name in timed:
    total, fixed = statistics.median(seconds[name]), statistics.median(started[name])
    rows.append({"way": name, "seconds": round(total, 2), "startup_s": round(fixed, 2),
                 "texts_per_s": round(args.texts / total, 1),
                 "texts_per_s_after_startup": round(args.texts / max(total - fixed, 1e-9), 1),
                 "vs_file": round(base / total, 3)})
  print(f"{args.texts} texts, {parts} parts of {args.part_mb} MiB, {about}; median of "
        f"{args.reps}")
  print(f"{'way':24} {'seconds':>8} {'startup':>8} {'texts/s':>8} {'after startup':>14} "
        f"{'vs file':>8}")
  for r in rows:
    print(f"{r['way']:24} {r['seconds']:8.2f} {r['startup_s']:8.2f} {r['texts_per_s']:8.1f} "
          f"{r['texts_per_s_after_startup']:14.1f} {r['vs_file']:8.3f}")
  if args.out:
    bench.write_results(args.out, {"model": about, "texts": args.texts, "parts": parts,
                                   "part_mb": args.part_mb, "reps": args.reps, "rows": rows,
                                   "environment": bench.environment()})
  return 0


if __name__ == "__main__":
  sys.exit(main())
