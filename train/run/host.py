"""Host-side settings for programs that run compiled steps in a loop (training, benchmarks).

XLA:CPU allocates all of a step's temporaries as one block, hundreds of MB at the paper's base
size. glibc's malloc serves any block over 32 MiB with a fresh mmap and unmaps it on free, so
the kernel zero-fills every page of it again at every step. A process that also runs PyTorch
suffers more: PyTorch's worker threads add malloc arenas.

`keep_freed_memory()` makes glibc keep freed memory in the process for the next step, as
tcmalloc (the allocator Google's TPU hosts preload for JAX) does: no mmap for large blocks, no
trimming, one arena. The process's resident memory therefore stays at its peak. The setting is
process-wide, which is why the library never makes it: `python -m train` and `benchmarks/` do.
BENCHMARKS.md measures what it saves.

"No trimming" has to mean never: with the largest positive trim threshold mallopt takes (2 GiB),
the temporaries of a training step at 32 x 512 (10.5 GB) still went back to the kernel after
every step.

Kept that way, glibc's one heap fragments: small allocations land in the freed block, the next
step's block no longer fits there and is carved afresh, and resident memory grows by the size
of the temporaries every few steps (all-MiniLM-L6-v2's contrastive step at 64 x 2 x 128:
announced 6.72 GB, 13.7 GB at step 4, 19.4 GB at step 6). jemalloc keeps freed memory for reuse
without that: 7.2 GB at every step, for about 12% fewer tokens/s than glibc's first steps (the
median of 6 steps, 785 against 890, on a busy 2-core Xeon). Where it is
installed (Debian's libjemalloc2), `jemalloc_environment()` gives the environment to run the
program again with it preloaded, which `python -m train` does first thing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# Where Linux distributions install jemalloc (Debian and Ubuntu, Fedora, Arch).
JEMALLOC = tuple(f"/usr/lib/{arch}-linux-gnu/libjemalloc.so.2" for arch in ("x86_64", "aarch64")
                 ) + ("/usr/lib64/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2")
# FLAX_ENCODER_MALLOC=glibc keeps glibc's malloc (keep_freed_memory) where jemalloc is there.
MALLOC_ENV = "FLAX_ENCODER_MALLOC"


def jemalloc_environment(environ=None) -> dict | None:
  """The environment to run this program again in with jemalloc preloaded; None where it is
  preloaded already, is not installed, or MALLOC_ENV says glibc."""
  environ = dict(os.environ if environ is None else environ)
  preloaded = environ.get("LD_PRELOAD", "")
  if environ.get(MALLOC_ENV) == "glibc" or "jemalloc" in preloaded:
    return None
  found = next((path for path in JEMALLOC if os.path.isfile(path)), None)
  if found is None:
    return None
  environ["LD_PRELOAD"] = f"{found} {preloaded}".strip()
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


def keep_freed_memory() -> bool:
  """Sets glibc malloc to keep and reuse freed memory. Returns False where libc is not glibc.

  Call it early, before JAX or PyTorch start their threads, so that they share one arena.
  """
  name = ctypes.util.find_library("c")
  try:
    mallopt = ctypes.CDLL(name).mallopt
  except (OSError, AttributeError, TypeError):  # not glibc: macOS, musl, Windows
    return False
  # mallopt takes an int but stores the trim threshold as a size_t: -1 is "never trim".
  settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))
  return all(mallopt(param, value) == 1 for param, value in settings)
