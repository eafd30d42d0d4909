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
"""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


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
