"""train.run.host: glibc malloc keeps a step's freed temporaries for the next step."""

import platform
import subprocess
import sys
import textwrap

import pytest

from tests.runs import ROOT

# Allocates and frees a block of argv[2] MiB, as XLA:CPU does with a step's temporaries, and
# prints (bytes newly mmapped while it is held, bytes of heap left after the free). Only the
# first 64 MiB are touched, so a big block costs address space, not memory.
_PROBE = textwrap.dedent("""
    import ctypes, sys
    from train.run.host import keep_freed_memory
    if sys.argv[1] == "keep":
      assert keep_freed_memory()
    libc = ctypes.CDLL("libc.so.6")
    class MallInfo2(ctypes.Structure):
      _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                  "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(int(sys.argv[2]) << 20)
    ctypes.memset(block, 1, 64 << 20)
    mmapped = libc.mallinfo2().hblkhd - before
    libc.free(ctypes.c_void_p(block))
    print(mmapped, libc.mallinfo2().arena)
""")


def _probe(mode, mib=64):
  out = subprocess.run([sys.executable, "-c", _PROBE, mode, str(mib)], cwd=ROOT,
                       capture_output=True, text=True, check=True).stdout
  return [int(x) for x in out.split()]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc only")
def test_keep_freed_memory_reuses_big_blocks_instead_of_mapping_them():
  mmapped, heap_after_free = _probe("default")
  assert mmapped >= 64 << 20, "glibc's default should map a 64 MiB block on its own"
  mmapped, heap_after_free = _probe("keep")
  assert mmapped == 0
  assert heap_after_free >= 64 << 20, "the freed block should stay in the heap for reuse"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc only")
def test_keep_freed_memory_keeps_blocks_over_2_gib():
  # A step at 32 x 512 has 10.5 GB of temporaries: they must not go back to the kernel either.
  mmapped, heap_after_free = _probe("keep", mib=3 << 10)
  assert mmapped == 0
  assert heap_after_free >= 3 << 30
