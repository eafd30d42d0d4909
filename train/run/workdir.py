"""The run directory: what cannot be one is refused up front, and a lock keeps one run in it.

The lock is `fcntl.flock` on WORKDIR/lock, taken by process 0 for the run's life. The kernel
releases it when the process ends, however it ends, so a stale lock never blocks a restart;
the file records the holder's pid and host for the message a second run prints. flock holds
between processes of one machine and, on Linux, across the clients of an NFS mount (it is
emulated with NFS byte-range locks); on file systems without shared locks (a FUSE mount of a
bucket, say) it guards only against a second run on the same machine.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time

from train.errors import RunError
from train.files import unwritable_kind

LOCK = "lock"


def check_workdir(workdir: str) -> None:
  """Creates `workdir` if needed; raises RunError where it cannot hold a run."""
  if "://" in workdir:
    raise RunError(f"--workdir {workdir}: remote URLs are not supported (the run memory-maps "
                   f"its data and appends to its metrics); mount the bucket (e.g. gcsfuse) and "
                   f"pass the mount's path")
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise RunError(f"--workdir {workdir}: is a file, not a directory")
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise RunError(f"--workdir {workdir}: cannot create it ({e.strerror})") from None


# What a run keeps in its workdir: files and directories another command must not replace.
RUN_FILES = (LOCK, "metrics.jsonl", "checkpoints", "checkpoints_corrupt", "data", "vocabulary",
             "start", "tensorboard", "plots", "profile")


def run_file(workdir: str, path: str) -> str | None:
  """The entry of RUN_FILES that `path` is or lies in, if it is in `workdir`; else None."""
  relative = os.path.relpath(os.path.realpath(path), os.path.realpath(workdir))
  first = relative.split(os.sep)[0]
  return first if first in RUN_FILES else None


def out_problem(out: str, workdir: str) -> str | None:
  """Why `out` cannot be the file a command writes from the run in `workdir` (`--out OUT:
  ...`, one line), or None."""
  parent = os.path.dirname(os.path.abspath(out))
  kind = unwritable_kind(out)
  if kind:
    return (f"--out {out}: {kind}, expected the name of a file to write (or a stream: a FIFO, "
            f"/dev/stdout)")
  if not os.path.isdir(parent):
    return f"--out {out}: no directory {parent} to write it in"
  if run_file(workdir, out):
    return (f"--out {out}: inside the run's own {run_file(workdir, out)}, expected a file "
            f"elsewhere (the run's files are not replaced)")
  return None


class WorkdirLock:
  """Holds WORKDIR/lock for one run; a second run fails at once, naming the holder."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, LOCK)
    try:
      self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
      raise RunError(f"--workdir {workdir}: cannot write there ({e.strerror})") from None
    try:
      fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      holder = os.pread(self._fd, 200, 0).decode(errors="replace").strip() or "unknown"
      os.close(self._fd)
      if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
        raise RunError(f"--workdir {workdir}: cannot lock {self.path} ({e.strerror})") from None
      raise RunError(f"--workdir {workdir}: in use by another run ({holder}); wait for it to "
                     f"end, stop it, or choose another workdir") from None
    os.ftruncate(self._fd, 0)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    os.pwrite(self._fd, f"pid {os.getpid()} on {socket.gethostname()}, since {started}\n"
              .encode(), 0)

  def release(self) -> None:
    if self._fd is not None:
      os.close(self._fd)  # closing the descriptor releases the lock
      self._fd = None
