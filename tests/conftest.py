"""Shared test settings: float32 matmuls at full precision, so that the parity bounds also hold
on GPUs, where JAX otherwise computes them in TF32; a persistent compilation cache shared by
every test process and the programs they start; on a CPU, XLA's quicker backend
optimisation and older CPU emitters (`runs.QUICK_CPU`), which the tiny test models do not
miss; a garbage collector tuned for a large heap."""

import gc
import os

from tests import runs

if os.environ.get("JAX_PLATFORMS", "cpu") == "cpu" and not os.path.exists("/dev/nvidia0"):
  # The caller's flags come last, so that they win: `XLA_FLAGS=--xla_cpu_max_isa=AVX2 pytest`
  # shows another processor's rounding, `--xla_cpu_use_fusion_emitters=true` the newer emitters.
  os.environ["XLA_FLAGS"] = (runs.QUICK_CPU + " " + os.environ.get("XLA_FLAGS", "")).strip()

import jax  # noqa: E402
import pytest  # noqa: E402
from absl import flags  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
jax.config.update("jax_compilation_cache_dir", runs.COMPILE_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
flags.FLAGS.mark_as_parsed()  # the program runs in-process with flags of its own (tests/runs.py)

from flax_encoder import EncoderConfig  # noqa: E402

# A test process holds torch, transformers and JAX's caches, and JAX's tracing makes garbage
# fast: with Python's default thresholds its collector walks that whole heap again and again
# (a tenth of a test file's time). Young objects are collected 10,000 allocations apart
# instead of 700, and what the imports made is frozen once the tests are collected.
gc.set_threshold(10_000, 20, 20)


def pytest_collection_finish(session):
  gc.freeze()


def pytest_xdist_auto_num_workers(config):
  """`-n auto`: half as many workers again as the cores this process may use. With one worker
  a core, the cores stood idle a tenth of the time (the suite's CPU time was 91% of twice its
  wall time on 2 cores): workers waiting on the processes a test starts, or on a peer a
  multi-process test holds back on purpose. A worker more keeps them busy (94%)."""
  cores = len(os.sched_getaffinity(0))
  return cores + max(1, cores // 2)


@pytest.fixture
def tiny_config():
  return EncoderConfig(vocab_size=37, d_model=16, n_heads=4, d_ff=24, n_layers=2, max_len=24,
                       dropout=0.1)


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory):
  """The workdir of one uninterrupted run of tests/tiny.py's config on one device (trained once
  for all pytest-xdist workers: tests only read it or copy it)."""
  workdir, _ = runs.once_per_session(tmp_path_factory, "reference",
                                     lambda directory: runs.train(directory).returncode)
  return workdir
