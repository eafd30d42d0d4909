"""Files written whole or not at all, and their SHA-256s: the one place for each."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import shutil
import socket
import stat
import sys
import tempfile

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


def left_by_killed(stem: str, suffix: str = "") -> list[str]:
  """The paths STEM.tmp-HOST-PID[SUFFIX] of this host whose process runs no more: what one
  killed before it could clean up (kill -9) left. Another host's are left alone: its process
  may still run there, on a file system both see."""
  prefix = f"{stem}.tmp-{_host()}-"
  found = glob.glob(f"{glob.escape(prefix)}*{glob.escape(suffix)}")
  pids = [left[len(prefix):len(left) - len(suffix)] for left in found]
  return sorted(left for left, pid in zip(found, pids)
                if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)))


def remove_left_by_killed(stem: str, suffix: str = "") -> None:
  """Removes the files of `left_by_killed(stem, suffix)`, saying so on stderr."""
  for left in left_by_killed(stem, suffix):
    if os.path.isfile(left) and not os.path.islink(left):
      os.remove(left)
      _said_removed(left)


def _said_removed(left: str) -> None:
  print(f"removed {left}, left by a process that was stopped before it finished",
        file=sys.stderr)


@contextlib.contextmanager
def temporary_directory(out: str):
  """A fresh directory beside `out` (OUT.tmp-HOST-PID), renamed to `out` if the block
  completes, else removed (`out` absent or an empty directory; where it is a link, its target
  is the directory replaced and the link stays). What a process of this host killed before it
  could clean up (kill -9) left beside `out` is removed first, and said so."""
  out = os.path.realpath(out)
  for left in left_by_killed(out):
    if os.path.isdir(left) and not os.path.islink(left):
      shutil.rmtree(left, ignore_errors=True)
      _said_removed(left)
  tmp = f"{out}.tmp-{_host()}-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    yield tmp
    os.rename(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def stream(path: str) -> bool:
  """Whether `path` is something written to as it comes rather than a file put in place: a
  FIFO or a character device (/dev/stdout, /dev/null, a terminal), links followed."""
  try:
    mode = os.stat(path).st_mode
  except OSError:
    return False
  return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def special_kind(path: str) -> str | None:
  """What `path` is where it is no regular file, links followed: 'a directory', 'a FIFO (a
  stream)', 'a character device (a stream)', 'a socket', 'a block device'; None for a regular
  file or a name with nothing there."""
  try:
    mode = os.stat(path).st_mode
  except OSError:
    return None
  for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (a stream)"),
                     (stat.S_ISCHR, "a character device (a stream)"),
                     (stat.S_ISSOCK, "a socket"), (stat.S_ISBLK, "a block device")):
    if test(mode):
      return kind
  return None


def unwritable_kind(path: str) -> str | None:
  """What `path` is, where it is neither a regular file (or a new name) nor a stream, so that
  nothing can be written there without replacing it: 'a directory', 'a socket', 'a block
  device'; None where it can be written."""
  return None if stream(path) else special_kind(path)


@contextlib.contextmanager
def written_whole(path: str):
  """A name to write the file at `path` to, which appears whole or not at all: a file beside
  `path` (PATH.tmp-HOST-PID, its suffix kept) renamed to it if the block completes, else
  removed. What a process of this host killed before it could clean up (kill -9) left there is
  removed first, and said so. Where `path` is a link, its target is the file replaced and the
  link stays. A stream at `path` (a FIFO, /dev/stdout: `stream`) is never replaced: the file
  is written in the temporary directory, then copied into the stream."""
  path = os.path.realpath(path)
  into_stream = stream(path)
  stem, suffix = os.path.splitext(os.path.join(tempfile.gettempdir(), os.path.basename(path))
                                  if into_stream else path)
  remove_left_by_killed(stem, suffix)
  tmp = f"{stem}.tmp-{_host()}-{os.getpid()}{suffix}"
  try:
    yield tmp
    if into_stream:
      with open(tmp, "rb") as source, open(path, "wb") as target:
        shutil.copyfileobj(source, target, _READ_BYTES)
    else:
      os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


@contextlib.contextmanager
def os_errors_of_safetensors():
  """safetensors reports a write the file system refused (a full disk) as a SafetensorError
  '... (os error 28)': raised here as the OSError it was, which the commands say in one line."""
  try:
    yield
  except Exception as e:  # noqa: BLE001 - SafetensorError lives in safetensors' Rust module
    code = re.search(r"\(os error (\d+)\)", str(e))
    if type(e).__name__ != "SafetensorError" or code is None:
      raise
    raise OSError(int(code[1]), os.strerror(int(code[1]))) from None


def readable_as_umask_allows(directory_or_file: str) -> str:
  """Gives the file (or each file of the directory) the mode a new file gets here: safetensors
  writes its files 0600, where other tools expect the umask's 0644."""
  umask = os.umask(0)
  os.umask(umask)
  paths = [directory_or_file] if not os.path.isdir(directory_or_file) else [
      os.path.join(directory_or_file, name) for name in os.listdir(directory_or_file)]
  for path in paths:
    if os.path.isfile(path):
      os.chmod(path, 0o666 & ~umask)
  return directory_or_file
