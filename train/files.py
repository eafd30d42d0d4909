"""Files written whole or not at all, and their SHA-256s: the one place for each."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil

_READ_BYTES = 1 << 24  # read at a time while hashing


def sha256_file(path: str) -> str:
  """The SHA-256 (hex) of the file at `path`, read in chunks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while block := f.read(_READ_BYTES):
      digest.update(block)
  return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def is_temporary(path: str) -> bool:
  """Whether `path` is a directory `temporary_directory` left (its process was stopped)."""
  return re.search(r"\.tmp-\d+$", path.rstrip(os.sep)) is not None


@contextlib.contextmanager
def temporary_directory(out: str):
  """A fresh directory beside `out` (OUT.tmp-PID), renamed to `out` if the block completes,
  else removed."""
  tmp = f"{out.rstrip(os.sep)}.tmp-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    yield tmp
    os.rename(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
