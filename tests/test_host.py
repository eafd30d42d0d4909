"""train.run.host: glibc malloc keeps a step's freed temporaries for the next step."""

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from tests.runs import ROOT
from train.run import host

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


def test_jemalloc_is_preloaded_where_installed_unless_glibc_is_asked_for(tmp_path, monkeypatch):
  library = tmp_path / "libjemalloc.so.2"
  monkeypatch.setattr(host, "JEMALLOC", (str(tmp_path / "absent.so"), str(library)))
  assert host.jemalloc_environment({"PATH": "/bin"}) is None  # none installed
  library.write_bytes(b"")
  env = host.jemalloc_environment({"PATH": "/bin", "LD_PRELOAD": "libother.so"})
  assert env == {"PATH": "/bin", "LD_PRELOAD": f"{library} libother.so"}
  assert host.jemalloc_environment({host.MALLOC_ENV: "glibc"}) is None
  assert host.jemalloc_environment({"LD_PRELOAD": str(library)}) is None  # preloaded already


@pytest.mark.skipif(not any(os.path.isfile(p) for p in host.JEMALLOC),
                    reason="jemalloc is not installed (Debian: libjemalloc2)")
def test_the_program_runs_itself_again_with_jemalloc_and_says_when_it_cannot(tmp_path):
  """With jemalloc the step's announced memory holds; with glibc's malloc (asked for) the
  memory line says it may not."""
  from tests import runs
  note = "glibc's malloc: resident memory may grow past this"
  ran = runs.train(str(tmp_path / "jemalloc"), "--config.train.num_steps=1",
                   env=runs.environment())
  assert "memory: the training step needs" in ran.stderr and note not in ran.stderr
  ran = runs.train(str(tmp_path / "glibc"), "--config.train.num_steps=1",
                   env={**runs.environment(), "FLAX_ENCODER_MALLOC": "glibc"})
  assert note in ran.stderr
