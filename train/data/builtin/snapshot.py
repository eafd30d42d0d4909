"""Writes the built-in corpora of this directory from the running Python's standard library.

  python -m train.data.builtin.snapshot

The files it writes are shipped, so that the default runs read the same text on every Python
(pydoc_data.topics and the standard library's sources differ from one version to the next):
the ones here were written by CPython 3.11.7. Their contents are the Python Software
Foundation's documentation and source, under the PSF License.

  pydoc_topics.json.xz                {topic: text} of pydoc_data.topics: the built-in
                                      pretraining corpus (train.data.sources.BUILTIN)
  stdlib_packages.{train,eval}.jsonl.xz
                                      {"text", "label"}: which of nine packages a run of whole
                                      source lines (40 to 120 bytes) comes from, in an order
                                      fixed by a hash of where it comes from; every 10th run of
                                      a package held out; 1200 (120 held out) per package: the
                                      built-in fine-tuning task (train.data.examples.BUILTIN)
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import sysconfig
from collections.abc import Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGES = ("asyncio", "email", "http", "importlib", "logging", "multiprocessing", "unittest",
            "urllib", "xml")
_MAX_BYTES = 120  # of source per example: about the 128 bytes of a window, most lines whole
_PER_PACKAGE = {"train": 1200, "eval": 120}


def stdlib_packages() -> dict[str, list[dict]]:
  """{split: examples} of the package task, from the running Python's standard library."""
  root = sysconfig.get_paths()["stdlib"]
  examples = {split: [] for split in _PER_PACKAGE}
  for package in PACKAGES:
    runs = []
    for folder, _, names in sorted(os.walk(os.path.join(root, package))):
      for name in sorted(n for n in names if n.endswith(".py")):
        file = os.path.join(folder, name)
        with open(file, encoding="utf-8", errors="replace") as f:
          runs += [(hashlib.sha1(f"{file}:{i}".encode()).hexdigest(), text)
                   for i, text in enumerate(_runs_of_lines(f.read()))]
    taken = {split: 0 for split in _PER_PACKAGE}
    for i, (_, text) in enumerate(sorted(runs)):
      split = "eval" if i % 10 == 9 else "train"
      if taken[split] < _PER_PACKAGE[split]:
        taken[split] += 1
        examples[split].append({"text": text, "label": package})
  return examples


def _runs_of_lines(source: str) -> Iterator[str]:
  """Runs of consecutive non-blank lines, each at most _MAX_BYTES, at least 40."""
  run = ""
  for line in source.splitlines():
    if not line.strip() or len((run + line).encode()) + 1 > _MAX_BYTES:
      if len(run.encode()) >= 40:
        yield run.rstrip("\n")
      run = ""
    if line.strip() and len(line.encode()) < _MAX_BYTES:
      run += line + "\n"
  if len(run.encode()) >= 40:
    yield run.rstrip("\n")


def _write(name: str, data: bytes) -> None:
  with open(os.path.join(HERE, name), "wb") as f:
    f.write(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))


def main() -> None:
  from pydoc_data.topics import topics
  _write("pydoc_topics.json.xz", json.dumps({k: topics[k] for k in sorted(topics)},
                                            ensure_ascii=False, indent=0).encode())
  for split, rows in stdlib_packages().items():
    _write(f"stdlib_packages.{split}.jsonl.xz",
           "".join(json.dumps(row) + "\n" for row in rows).encode())


if __name__ == "__main__":
  main()
