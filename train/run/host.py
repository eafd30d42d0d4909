"""Host-side settings for programs that run compiled steps in a loop (training, benchmarks).

XLA:CPU allocates all of a step's temporaries as one block, hundreds of MB at the paper's base
size, whose size follows the batch's shape (packed contrastive batches take a few shapes). An
allocator that keeps freed blocks for the next step fragments: small allocations land in the
freed block, the next step's block no longer fits there and is carved afresh, and resident
memory grows by whole blocks for dozens of steps (all-MiniLM-L6-v2's contrastive step at 32
pairs x 128, packed: announced 1.23 GB; 5.4 GB resident by step 15 with glibc keeping freed
memory, 5.2 GB with jemalloc keeping it).

jemalloc gives every block of 8 MiB or more back to the kernel when it is freed (its arena for
large blocks purges at once) and keeps the rest: resident memory stays within a block of where
the warm-up leaves it (tests/test_training_memory.py), for the kernel mapping and zero-filling
each step's block again. In pages of 4 KiB that was about 15% of that MiniLM step (1.48 s
against 1.28 s a step on a 2-core Xeon, 0.8 GB of page faults), so jemalloc is given huge pages
(`JEMALLOC_CONF`): at 64 pairs x 128 a step then takes about 10,000 page faults instead of
760,000, and about 10% less time (BENCHMARKS.md). Where it is installed (Debian's
libjemalloc2), `jemalloc_environment()` gives the environment to run the program again with it
preloaded, which `python -m train` does first thing. Elsewhere `bound_freed_memory()` sets
glibc's malloc to do the same: blocks of 8 MiB or more mapped for each allocation and
unmapped at its free, one arena, the rest kept and never trimmed. The benchmarks that time
steps keep every freed block instead (`keep_freed_memory`: no page faults, memory unbounded).
Each setting is process-wide, which is why the library never makes one: the programs do.
BENCHMARKS.md measures what they cost.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# The size from which blocks are mapped and unmapped: jemalloc's oversize_threshold.
LARGE_BLOCK = 8 << 20
# Where Linux distributions install jemalloc (Debian and Ubuntu, Fedora, Arch).
JEMALLOC = tuple(f"/usr/lib/{arch}-linux-gnu/libjemalloc.so.2" for arch in ("x86_64", "aarch64")
                 ) + ("/usr/lib64/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2")
# Huge pages (2 MiB) for jemalloc's blocks: a step's block of temporaries, mapped afresh each
# step, then faults in 512 times fewer pages (module docstring).
JEMALLOC_CONF = "thp:always"
# FLAX_ENCODER_MALLOC=glibc keeps glibc's malloc (bound_freed_memory) where jemalloc is there;
# jemalloc (or unset) preloads it where it is installed. Case aside, nothing else is taken.
MALLOC_ENV = "FLAX_ENCODER_MALLOC"
MALLOCS = ("jemalloc", "glibc")


def jemalloc_environment(environ=None) -> dict | None:
  """The environment to run this program again in with jemalloc preloaded; None where it is
  preloaded already, is not installed, or MALLOC_ENV says glibc. ValueError (one line) where
  MALLOC_ENV names another malloc, which this program does not load."""
  environ = dict(os.environ if environ is None else environ)
  preloaded = environ.get("LD_PRELOAD", "")
  asked = environ.get(MALLOC_ENV, "").strip().lower()
  if asked and asked not in MALLOCS:
    raise ValueError(f"{MALLOC_ENV}={environ[MALLOC_ENV]!r}, expected one of {', '.join(MALLOCS)} "
                     f"(jemalloc where it is installed, the default; glibc's malloc); another "
                     f"malloc is yours to preload with LD_PRELOAD")
  if asked == "glibc" or "jemalloc" in preloaded:
    return None
  found = next((path for path in JEMALLOC if os.path.isfile(path)), None)
  if found is None:
    return None
  environ["LD_PRELOAD"] = f"{found} {preloaded}".strip()
  # Options given in MALLOC_CONF come after, and so win.
  environ["MALLOC_CONF"] = ",".join(filter(None, (JEMALLOC_CONF, environ.get("MALLOC_CONF"))))
  return environ


def allocator() -> str:
  """The malloc this process runs: 'jemalloc' where it is preloaded, else 'glibc'."""
  try:
    with open("/proc/self/maps") as f:  # the libraries mapped into this process
      return "jemalloc" if "libjemalloc" in f.read() else "glibc"
  except OSError:  # no /proc: not Linux
    return "glibc"


def resident_bytes() -> int | None:
  """This process's resident memory now (None where there is no /proc: not Linux)."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, IndexError):
    return None


def bound_freed_memory() -> bool:
  """Sets glibc's malloc to give blocks of LARGE_BLOCK or more back to the kernel at their
  free and to keep the smaller ones. Returns False where libc is not glibc.

  Call it early, before JAX or PyTorch start their threads, so that they share one arena.
  """
  # A threshold that is set stays: glibc's own rises to the size of each mapped block freed
  # (up to 32 MiB), and blocks under it then go to the heap, where they fragment it.
  return _mallopt((_M_ARENA_MAX, 1), (_M_MMAP_THRESHOLD, LARGE_BLOCK), (_M_TRIM_THRESHOLD, -1))


def keep_freed_memory() -> bool:
  """Sets glibc's malloc to keep every freed block for reuse (no mapped blocks, no trimming,
  one arena), as the benchmarks time steps: no page faults, but the heap fragments and
  resident memory grows by whole blocks of temporaries (`bound_freed_memory` for a run).
  Returns False where libc is not glibc."""
  return _mallopt((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))


def _mallopt(*settings: tuple[int, int]) -> bool:
  """glibc's mallopt(param, value) for each setting; False where libc is not glibc."""
  name = ctypes.util.find_library("c")
  try:
    mallopt = ctypes.CDLL(name).mallopt
  except (OSError, AttributeError, TypeError):  # not glibc: macOS, musl, Windows
    return False
  # mallopt takes an int but stores the trim threshold as a size_t: -1 is "never trim".
  return all(mallopt(param, value) == 1 for param, value in settings)


class _StdoutOnceClosed:
  """sys.stdout, whose writes are discarded once its reader has gone (a closed pipe: `| head`):
  what the command does goes on and is kept, as a command-line tool's output is dropped."""

  def __init__(self, stream):
    self._stream, self.gone = stream, False

  def write(self, text: str) -> int:
    if not self.gone:
      try:
        return self._stream.write(text)
      except BrokenPipeError:
        self._drop()
    return len(text)

  def flush(self) -> None:
    if not self.gone:
      try:
        self._stream.flush()
      except BrokenPipeError:
        self._drop()

  def _drop(self) -> None:
    """From now on, stdout is /dev/null: the interpreter's last flush finds nothing to fail."""
    self.gone = True
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
      os.dup2(devnull, self._stream.fileno())
    finally:
      os.close(devnull)

  def __getattr__(self, name):
    return getattr(self._stream, name)


def discard_stdout_once_closed() -> None:
  """Makes a closed stdout (its reader gone: `python -m train.embed … | head -c0`) no error:
  what is printed after is dropped, and the command's work goes on and is kept."""
  if not isinstance(sys.stdout, _StdoutOnceClosed):
    sys.stdout = _StdoutOnceClosed(sys.stdout)
