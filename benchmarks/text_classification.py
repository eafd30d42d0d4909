r"""Fine-tuning from scratch on labelled text: bytes against a vocabulary trained on the texts.

  python -m benchmarks.text_classification --out /tmp/tc                 # the built-in task
  python -m benchmarks.text_classification --out /tmp/tc \
      --debian Packages.xz Translation-en.xz     # Debian's package descriptions, by section

Each run is `python -m train --config=configs/classify.py` from scratch, as a user starts
it, once with `--config.data.tokenizer=bytes` and once with the default (a SentencePiece
vocabulary of config.data.vocab_size pieces trained on the training texts), the same number
of steps each. The table gives held-out accuracy, macro-F1, the majority class, the share of
texts cut to seq_len, and the wall time of the whole command.

The Debian set is built from two files of any Debian mirror's `dists/<suite>/main/`
(`binary-amd64/Packages.xz` and `i18n/Translation-en.xz`; downloaded by you, never by this
script): each distinct English description (short and long, joined) labelled with its
package's section, the `--classes` commonest sections kept; a tenth, chosen by a hash of the
text, held out.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import lzma
import os
import re
import subprocess
import sys
import time

from benchmarks.prepare import ROOT


def _stanzas(path: str):
  """The stanzas of a Debian control file (xz-compressed): {field: value}, continuation lines
  joined to their field."""
  with lzma.open(path, "rt", encoding="utf-8", errors="replace") as f:
    stanza, field = {}, None
    for line in f:
      if not line.strip():
        if stanza:
          yield stanza
        stanza, field = {}, None
      elif line[0] in " \t" and field:
        stanza[field] += "\n" + line.strip()
      elif ":" in line:
        field, value = line.split(":", 1)
        stanza[field] = value.strip()
    if stanza:
      yield stanza


def debian_examples(packages: str, translations: str, classes: int) -> list[dict]:
  """{"text", "label"} for each distinct description, labelled with its package's section."""
  section = {}
  for stanza in _stanzas(packages):
    if "Description-md5" in stanza and "Section" in stanza:
      section[stanza["Description-md5"]] = stanza["Section"].split("/")[-1]
  texts = {}
  for stanza in _stanzas(translations):
    md5, text = stanza.get("Description-md5"), stanza.get("Description-en")
    if md5 in section and text:
      text = re.sub(r"\n\.\n", "\n\n", text).replace("\n.", "\n")
      texts.setdefault(text, section[md5])
  kept = {name for name, _ in collections.Counter(texts.values()).most_common(classes)}
  return [{"text": text, "label": label} for text, label in texts.items() if label in kept]


def write_split(examples: list[dict], directory: str) -> dict:
  """train.jsonl and eval.jsonl in `directory` (a tenth held out, by a hash of the text)."""
  os.makedirs(directory, exist_ok=True)
  paths = {split: os.path.join(directory, f"{split}.jsonl") for split in ("train", "eval")}
  with open(paths["train"], "w") as train, open(paths["eval"], "w") as held_out:
    for example in examples:
      digest = hashlib.sha256(example["text"].encode()).digest()[0]
      (held_out if digest % 10 == 0 else train).write(json.dumps(example) + "\n")
  return paths


def fine_tune(workdir: str, paths: dict | None, tokenizer: str | None, steps: int) -> dict:
  """One run from scratch; its last evaluation, truncation and wall time."""
  command = [sys.executable, "-m", "train", "--config=configs/classify.py", f"--workdir={workdir}",
             f"--config.train.num_steps={steps}"]
  if paths:
    command += [f"--config.data.train={paths['train']}", f"--config.data.eval={paths['eval']}"]
  if tokenizer:
    command.append(f"--config.data.tokenizer={tokenizer}")
  start = time.perf_counter()
  subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
  seconds = time.perf_counter() - start
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    final = [r for r in map(json.loads, f) if r["split"] == "eval"][-1]
  with open(os.path.join(workdir, "data", "dataset.json")) as f:
    meta = json.load(f)
  cut = sum(meta["truncated"].values()) / sum(meta["examples"].values())
  return {**final, "seconds": seconds, "truncated": cut, "vocab_size": meta["vocab_size"],
          "examples": meta["examples"], "classes": len(meta["labels"])}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", required=True, help="a directory for the data and the runs")
  parser.add_argument("--debian", nargs=2, metavar=("PACKAGES_XZ", "TRANSLATION_EN_XZ"))
  parser.add_argument("--classes", type=int, default=12)
  parser.add_argument("--steps", type=int, default=800)
  args = parser.parse_args()
  paths, task = None, "the built-in task (configs/classify.py)"
  if args.debian:
    examples = debian_examples(*args.debian, args.classes)
    paths = write_split(examples, os.path.join(args.out, "debian"))
    task = f"Debian package descriptions by section ({len(examples)} texts)"
  print(f"{task}, {args.steps} steps from scratch, {os.cpu_count()} CPUs\n")
  print("| tokenizer | ids | accuracy | macro-F1 | majority class | texts cut | wall |")
  print("|---|---:|---:|---:|---:|---:|---:|")
  for name, tokenizer in (("bytes", "bytes"), ("trained SentencePiece (default)", None)):
    tag = "bytes" if tokenizer else "vocabulary"
    r = fine_tune(os.path.join(args.out, f"{'debian' if paths else 'builtin'}-{tag}"), paths,
                  tokenizer, args.steps)
    print(f"| {name} | {r['vocab_size']} | {r['accuracy']:.3f} | {r['macro_f1']:.3f} | "
          f"{r['baseline_accuracy']:.3f} | {r['truncated']:.1%} | {r['seconds']:.0f} s |",
          flush=True)


if __name__ == "__main__":
  main()
