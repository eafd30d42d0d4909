r"""How fast `python -m train.prepare` trains vocabularies and encodes a corpus.

  python -m benchmarks.prepare_speed [--vocab-size 32000] [--sample-mb 20] [--workers 1,2]
                                     [--copies 4]

The corpus: the standard library's Python sources of the interpreter running this (its
directory, `--include '*.py'`, without site-packages and the test suite, whose files include
deliberately invalid UTF-8): 14.4 MB on CPython 3.11, no download; `--copies` directories of
links to them make it bigger (58 MB), so that start-up does not hide the encoding's speed.
Each measurement is a fresh
`python -m train.prepare` process, as a user runs it: first SentencePiece and a `tokenizers`
BPE trained on the same sample (`--vocab-only`: wall time, peak memory of the process and its
children), then the encoding with bytes and each trained vocabulary at each worker count
(input MB per wall-clock second, start-up included, and per worker).
"""

import argparse
import os
import sysconfig
import tempfile

from benchmarks.prepare import run

SKIPPED = {"site-packages", "test", "__pycache__"}


def corpus() -> list[str]:
  """The --input arguments: the standard library's directories and .py files, but SKIPPED."""
  stdlib = sysconfig.get_paths()["stdlib"]
  has_python = lambda path: path.endswith(".py") or os.path.isdir(path) and any(
      n.endswith(".py") for _, _, names in os.walk(path) for n in names)
  return [path for name in sorted(os.listdir(stdlib))
          if name not in SKIPPED and not name.startswith(".")
          and has_python(path := os.path.join(stdlib, name))]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--vocab-size", type=int, default=32000)
  parser.add_argument("--sample-mb", type=float, default=20)
  parser.add_argument("--workers", default="1,2")
  parser.add_argument("--copies", type=int, default=4)
  args = parser.parse_args()
  from train.data import prepare
  files = prepare.expand(corpus(), ["*.py"])
  with tempfile.TemporaryDirectory() as tmp:
    for copy in range(args.copies):
      for i, path in enumerate(files):
        os.makedirs(f"{tmp}/corpus/{copy}", exist_ok=True)
        os.symlink(path, f"{tmp}/corpus/{copy}/{i:05d}.py")
    inputs = ["--input", f"{tmp}/corpus"]
    mb = args.copies * sum(os.path.getsize(p) for p in files) / 1e6
    print(f"corpus: {mb:.1f} MB of Python sources; {os.cpu_count()} CPUs")
    tokenizers = {"bytes": "bytes"}
    print(f"\n| vocabulary ({args.vocab_size} pieces, {args.sample_mb:g} MB sample) | wall "
          f"| peak memory |\n|---|---:|---:|")
    for kind, file in (("sentencepiece", "tokenizer.model"), ("bpe", "tokenizer.json")):
      seconds, peak = run([*inputs, "--tokenizer", kind, "--vocab-size", str(args.vocab_size),
                           "--sample-mb", str(args.sample_mb), "--vocab-only",
                           "--out", f"{tmp}/{kind}"])
      tokenizers[kind] = f"{tmp}/{kind}/{file}"
      print(f"| {kind} | {seconds:.1f} s | {peak:,.0f} MB |", flush=True)
    print("\n| encoding | workers | wall | MB/s | MB/s per worker |\n|---|---:|---:|---:|---:|")
    for kind, tokenizer in tokenizers.items():
      for workers in (int(w) for w in args.workers.split(",")):
        out = f"{tmp}/{kind}-{workers}"
        seconds, _ = run([*inputs, "--tokenizer", tokenizer, "--workers", str(workers),
                          "--seq-len", "512", "--out", out])
        print(f"| {kind} | {workers} | {seconds:.1f} s | {mb / seconds:.1f} | "
              f"{mb / seconds / workers:.1f} |", flush=True)


if __name__ == "__main__":
  main()
