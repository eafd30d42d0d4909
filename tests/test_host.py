"""train.run.host: glibc's malloc gives large blocks back at their free, as jemalloc does."""

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from tests.runs import ROOT
from train.run import host

# Allocates, touches and frees a block of argv[2] MiB, as XLA:CPU does with a step's
# temporaries, twice; prints for each time (bytes newly mapped while it is held, bytes of heap
# left after its free).
_PROBE = textwrap.dedent("""
    import ctypes, sys
    from train.run.host import bound_freed_memory
    if sys.argv[1] == "bound":
      assert bound_freed_memory()
    libc = ctypes.CDLL("libc.so.6")
    class MallInfo2(ctypes.Structure):
      _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                  "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    for _ in range(2):
      before = libc.mallinfo2().hblkhd
      block = libc.malloc(int(sys.argv[2]) << 20)
      ctypes.memset(block, 1, int(sys.argv[2]) << 20)
      mapped = libc.mallinfo2().hblkhd - before
      libc.free(ctypes.c_void_p(block))
      print(mapped, libc.mallinfo2().arena)
""")


def _probe(mode, mib):
  out = subprocess.run([sys.executable, "-c", _PROBE, mode, str(mib)], cwd=ROOT,
                       capture_output=True, text=True, check=True).stdout
  return [[int(x) for x in line.split()] for line in out.splitlines()]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc only")
def test_large_blocks_go_back_to_the_kernel_at_every_free_and_small_ones_stay():
  # glibc's own threshold rises to the size of a mapped block once it is freed: the second
  # 16 MiB block goes to the heap, where the next step's block of another size fragments it.
  (mapped, _), (again, heap_after) = _probe("default", 16)
  assert mapped >= 16 << 20 and again == 0 and heap_after >= 16 << 20
  for mapped, heap_after in _probe("bound", 16):
    assert mapped >= 16 << 20
    assert heap_after < 16 << 20, "the freed block should have gone back to the kernel"
  for mapped, heap_after in _probe("bound", 4):  # under host.LARGE_BLOCK: kept for the next
    assert mapped == 0
    assert heap_after >= 4 << 20


def test_jemalloc_is_preloaded_where_installed_unless_glibc_is_asked_for(tmp_path, monkeypatch):
  library = tmp_path / "libjemalloc.so.2"
  monkeypatch.setattr(host, "JEMALLOC", (str(tmp_path / "absent.so"), str(library)))
  assert host.jemalloc_environment({"PATH": "/bin"}) is None  # none installed
  library.write_bytes(b"")
  env = host.jemalloc_environment({"PATH": "/bin", "LD_PRELOAD": "libother.so"})
  assert env == {"PATH": "/bin", "LD_PRELOAD": f"{library} libother.so",
                 "MALLOC_CONF": host.JEMALLOC_CONF}
  given = host.jemalloc_environment({"MALLOC_CONF": "narenas:1"})  # the user's come last
  assert given["MALLOC_CONF"] == f"{host.JEMALLOC_CONF},narenas:1"
  assert host.jemalloc_environment({host.MALLOC_ENV: "glibc"}) is None
  assert host.jemalloc_environment({host.MALLOC_ENV: "GLIBC"}) is None  # case aside
  assert host.jemalloc_environment({host.MALLOC_ENV: "jemalloc"})["LD_PRELOAD"] == str(library)
  assert host.jemalloc_environment({"LD_PRELOAD": str(library)}) is None  # preloaded already


@pytest.mark.slow  # the program started twice over
@pytest.mark.skipif(not any(os.path.isfile(p) for p in host.JEMALLOC),
                    reason="jemalloc is not installed (Debian: libjemalloc2)")
def test_the_program_runs_itself_again_with_jemalloc_and_says_when_it_cannot(tmp_path):
  """jemalloc where it is installed; glibc's malloc where asked for: the memory line says which."""
  from tests import runs
  ran = runs.train(str(tmp_path / "jemalloc"), "--config.train.num_steps=1",
                   env=runs.environment())
  assert "memory: the training step needs" in ran.stderr
  assert "(host malloc: jemalloc)" in ran.stderr
  ran = runs.train(str(tmp_path / "glibc"), "--config.train.num_steps=1",
                   env={**runs.environment(), "FLAX_ENCODER_MALLOC": "glibc"})
  assert "(host malloc: glibc)" in ran.stderr


@pytest.mark.parametrize("value", ["tcmalloc", "mimalloc", "glib"])
def test_a_malloc_the_program_does_not_load_is_refused_in_one_line(value):
  # It was taken for jemalloc, silently.
  with pytest.raises(ValueError, match=f"^FLAX_ENCODER_MALLOC='{value}', expected one of "
                                       f"jemalloc, glibc "):
    host.jemalloc_environment({host.MALLOC_ENV: value})
  env = {**os.environ, host.MALLOC_ENV: value}
  result = subprocess.run([sys.executable, "-m", "train", "--workdir", "unused"], cwd=ROOT,
                          env=env, capture_output=True, text=True, check=False)
  assert result.returncode == 2 and result.stdout == ""
  (line,) = result.stderr.strip().splitlines()
  assert line.startswith(f"error: FLAX_ENCODER_MALLOC='{value}', expected one of")


def test_a_closed_stdout_drops_what_is_printed_and_the_work_goes_on(tmp_path):
  # `python -m train … | head -c0` trained and saved, then ended in a BrokenPipeError
  # traceback and exit 1.
  code = textwrap.dedent("""
      import sys
      from train.run.host import discard_stdout_once_closed
      discard_stdout_once_closed()
      sys.stdin.read()  # the reader of stdout is gone when this returns
      for i in range(10000):
        print("a line of the run's output", i)
      open(sys.argv[1], "w").write("the work")
      """)
  proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "kept")], cwd=ROOT,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  proc.stdout.close()  # the reader goes before anything is written
  _, err = proc.communicate(b"")
  assert proc.returncode == 0 and err == b"", err.decode()[-2000:]
  assert (tmp_path / "kept").read_text() == "the work"
