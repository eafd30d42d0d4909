"""Host-side settings for programs that run compiled steps in a loop (training, benchmarks).

XLA:CPU allocates all of a step's temporaries as one block. For the paper-base training step
at 8 x 128 that block is 564 MB. glibc's malloc serves any block over 32 MiB with a fresh
mmap and unmaps it on free. The kernel then zero-fills every page of it on first touch, so the
cost comes back at every step: 9% of that step's time on a 2-core Xeon (1.13 s -> 1.03 s,
with half the system time).

A process that also runs PyTorch suffers more. PyTorch's worker threads add malloc arenas, and
JAX's training step ran 25% slower after a PyTorch step in the same process.

`keep_freed_memory()` makes glibc keep freed memory in the process for the next step, as
tcmalloc (the allocator Google's TPU hosts preload for JAX) does: no mmap for large blocks, no
trimming, one arena. The process's resident memory therefore stays at its peak. This is
process-wide, so the library never calls it: programs do, as `python -m train` and
`benchmarks/` do.

"No trimming" has to mean never: with a 2 GiB trim threshold (the largest positive value
mallopt takes) the 10.5 GB of temporaries of the training step at 32 x 512 still went back to
the kernel after every step, 2.8 million page faults and a third of that step's time.
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
