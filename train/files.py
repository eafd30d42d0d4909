"""Files written whole or not at all, and their SHA-256s: the one place for each."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import shutil
import socket
import sys

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
  """Whether `path` is a directory `temporary_directory` made (or left, its process killed)."""
  return re.search(r"\.tmp-[^/]+-\d+$", path.rstrip(os.sep)) is not None


def _host() -> str:
  return socket.gethostname().replace(os.sep, "_")


def _running(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's
    return True
  return True


@contextlib.contextmanager
def temporary_directory(out: str):
  """A fresh directory beside `out` (OUT.tmp-HOST-PID), renamed to `out` if the block
  completes, else removed. What a process of this host killed before it could clean up
  (kill -9) left beside `out` is removed first, and said so."""
  out = out.rstrip(os.sep)
  for left in glob.glob(f"{glob.escape(out)}.tmp-{glob.escape(_host())}-*"):
    pid = left.rsplit("-", 1)[1]
    if pid.isdigit() and not _running(int(pid)) and os.path.isdir(left):
      shutil.rmtree(left, ignore_errors=True)
      print(f"removed {left}, left by a process that was stopped before it finished",
            file=sys.stderr)
  tmp = f"{out}.tmp-{_host()}-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    yield tmp
    os.rename(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


@contextlib.contextmanager
def written_whole(path: str):
  """A name beside `path` to write the file to (PATH.tmp-PID, its suffix kept), renamed to
  `path` if the block completes, else removed: the file appears whole or not at all."""
  stem, suffix = os.path.splitext(path)
  tmp = f"{stem}.tmp-{os.getpid()}{suffix}"
  try:
    yield tmp
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
