"""Counting the files a piece of code opens under a folder, through Python's audit hook (the
"open" event of `open` and `os.open`; a library's own C or Rust opens, as safetensors', are not
seen).

    with opened_under(folder) as opens:
      SentenceEncoder.load(folder)
    assert max(opens.values()) == 1  # {file relative to folder: opens}
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys

_COUNTERS: list[tuple[str, collections.Counter]] = []  # (folder, its counter) being counted


def _hook(event: str, args: tuple) -> None:
  if event != "open" or not _COUNTERS or not isinstance(args[0], (str, bytes, os.PathLike)):
    return
  path = os.path.realpath(os.fsdecode(args[0]))
  for folder, counter in _COUNTERS:
    if path.startswith(folder + os.sep):
      counter[os.path.relpath(path, folder)] += 1


sys.addaudithook(_hook)  # an audit hook cannot be removed: it counts only while one is asked


@contextlib.contextmanager
def opened_under(folder):
  """A Counter of {file under `folder`, relative: its opens (tried, found or not)} while the
  block runs."""
  entry = (os.path.realpath(folder), collections.Counter())
  _COUNTERS.append(entry)
  try:
    yield entry[1]
  finally:
    _COUNTERS.remove(entry)


def assert_a_load_opens_each_file_once(load, folder) -> None:
  """`load(folder)` opens modules.json once and no file of `folder` more than once."""
  with opened_under(folder) as opens:
    load(folder)
  assert opens["modules.json"] == 1 and max(opens.values()) == 1, (folder, dict(opens))
