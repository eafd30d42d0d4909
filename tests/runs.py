"""Helpers for tests that run `python -m train` on the tiny config: in this process (as
Flax's lm1b tests train), or in a subprocess where a test needs a process of its own (to
signal or kill it, or to give it other devices)."""

import contextlib
import dataclasses
import fcntl
import functools
import importlib.metadata
import io
import json
import os
import shutil
import subprocess
import sys
import time
import warnings

import pytest

from train.run.metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "tiny.py")
COMPILE_CACHE = os.path.join(ROOT, ".pytest_cache", "jax")
# On a CPU the tests compile far more than they compute: XLA's quicker backend optimisation,
# and its older CPU emitters, which compile a tiny model's step in half the time (jaxlib 0.12
# no longer takes the flag).
QUICK_CPU = "--xla_backend_optimization_level=0" + (
  " --xla_cpu_use_fusion_emitters=false"
  if tuple(int(p) for p in importlib.metadata.version("jaxlib").split(".")[:2]) < (0, 12)
  else "")


def environment(devices: int | None = None) -> dict:
  """The environment of a training subprocess: `devices` CPU devices, and a compilation cache
  shared by all of them (each would otherwise compile the same tiny step again)."""
  env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": COMPILE_CACHE,
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
         "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
         "JAX_DEFAULT_MATMUL_PRECISION": "highest"}
  if devices:  # simulated CPU devices, on a machine with an accelerator too
    # The test process's own XLA flags (an instruction set, the emitters) are kept after ours.
    given = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join([f"--xla_force_host_platform_device_count={devices}",
                                 QUICK_CPU, *given])
    env["JAX_PLATFORMS"] = "cpu"
  return env


EIGHT_DEVICES = environment(8)

# Seconds a fixed piece of Python takes on an idle 2-core CI machine (`_slowness`'s).
REFERENCE_S = 0.05


def limit(seconds: float) -> float:
  """A wall-time limit of a test, `seconds` on an idle 2-core machine, scaled by the suite's
  one factor (`time_factor`): a slow or busy machine must not fail correct code."""
  return seconds * time_factor()


@functools.cache
def time_factor() -> float:
  """FLAX_ENCODER_TIME_FACTOR where set; else measured once a process: how much slower than
  the reference machine a fixed piece of Python runs, or how many runnable processes share
  each core (the 1-minute load average), the larger, at least 1."""
  given = os.environ.get("FLAX_ENCODER_TIME_FACTOR")
  if given:
    try:
      factor = float(given)
    except ValueError:
      factor = 0.0
    if not factor >= 1:
      raise ValueError(f"FLAX_ENCODER_TIME_FACTOR={given!r}, expected a number >= 1")
    return factor
  start = time.perf_counter()
  sum(range(3_000_000))
  slowness = (time.perf_counter() - start) / REFERENCE_S
  return max(1.0, slowness, os.getloadavg()[0] / (os.cpu_count() or 1))


@dataclasses.dataclass
class Result:
  """What a run of the program left: its exit code and what it printed (as
  subprocess.CompletedProcess has them)."""

  returncode: int
  stdout: str
  stderr: str


def command(args: list[str]) -> Result:
  """`python -m train ARGS` run in this process: the program's own flag parsing, error lines
  and exit codes, its stdout and stderr (warnings included) captured."""
  from absl import flags

  from train import __main__ as program
  flag_values = flags.FlagValues()
  given = program.define_flags(flag_values)
  argv = ["train", *args]
  out, err = io.StringIO(), io.StringIO()
  saved = sys.argv
  sys.argv = argv  # the program names a mistaken flag from its arguments

  def show(message, category, filename, lineno, file=None, line=None):
    err.write(warnings.formatwarning(message, category, filename, lineno, line))

  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
        warnings.catch_warnings():
      warnings.simplefilter("always", UserWarning)
      warnings.showwarning = show
      try:
        program.main(program.parse_flags(argv, flag_values), given)
        code = 0
      except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
  finally:
    sys.argv = saved
  return Result(code, out.getvalue(), err.getvalue())


def train(workdir, *overrides, check=True, popen=False, env=None, config=TINY):
  """Runs the tiny config (or `config`; None: the overrides name it) in `workdir`: in this
  process, or in a subprocess with `env` (devices, say); with popen=True returns the running
  process."""
  given = [f"--config={config}"] if config else []
  args = [*given, f"--workdir={workdir}", *overrides]
  if not popen and env is None:
    result = command(args)
    if check:
      assert result.returncode == 0, result.stderr[-3000:]
    return result
  cmd = [sys.executable, "-m", "train", *args]
  env = env or environment()
  if popen:
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
  result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=limit(600), check=False)
  if check:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


def once_per_session(tmp_path_factory, name: str, build) -> tuple[str, object]:
  """(directory `name`, what `build(directory)` returned, as JSON keeps it): built once for the
  whole test session. pytest-xdist's workers share it, in the temporary directory they share:
  the first to ask builds it while the others wait, instead of each building its own. For
  what tests only read or copy."""
  base = tmp_path_factory.getbasetemp()
  shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
  directory, record = shared / name, shared / f"{name}.json"
  with open(shared / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # held until the builder is done, by the OS if it dies
    if not record.exists():
      shutil.rmtree(directory, ignore_errors=True)  # what a builder that failed left
      record.write_text(json.dumps(build(str(directory))))
  return str(directory), json.loads(record.read_text())


def straight_and_resumed(config, tmp_path, capfd, stopped: int = 4, last: int = 8
                         ) -> tuple[str, str]:
  """(a run of `config` to its last step, the same run resumed from its checkpoint at step
  `stopped`, as a run stopped there resumes): two workdirs under `tmp_path`, the second a copy
  of the first less its checkpoint at `last`, run again in this process."""
  from train import loop
  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  assert loop.run(config, straight) == 0
  shutil.copytree(straight, resumed)
  shutil.rmtree(os.path.join(resumed, "checkpoints", str(last)))
  capfd.readouterr()
  assert loop.run(config, resumed) == 0
  assert f"resumed from the checkpoint at step {stopped}" in capfd.readouterr().err
  return straight, resumed


def losses(workdir) -> dict:
  """{step: training loss} of the run in `workdir`."""
  records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
  return {r["step"]: r["loss"] for r in records if r["split"] == "train"}


def wait_for_step(workdir, step, timeout=300):
  """Polls metrics.jsonl until the run in `workdir` has logged `step` (`timeout` seconds, as
  `limit` scales them)."""
  timeout = limit(timeout)
  deadline = time.time() + timeout
  while time.time() < deadline:
    try:
      if max(losses(workdir), default=0) >= step:
        return
    except FileNotFoundError:
      pass
    time.sleep(0.05)
  raise TimeoutError(f"the run in {workdir} did not reach step {step} in {timeout}s")


@contextlib.contextmanager
def full_file_system(directory):
  """A small file system mounted at `directory` (made), filled to the last byte; skips the
  test where nothing can be mounted (not root)."""
  import pytest
  os.makedirs(directory, exist_ok=True)
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", directory],
                    capture_output=True).returncode != 0:
    pytest.skip("cannot mount a file system here")
  try:
    with open(os.path.join(directory, "filler"), "wb", buffering=0) as f:
      with contextlib.suppress(OSError):
        while True:
          f.write(b"x" * 512)
    yield directory
  finally:
    subprocess.run(["umount", "--lazy", directory], check=False)  # even where a file is open


def _triton_missing() -> str | None:
  from flax_encoder.kernels import KERNELS
  return KERNELS["triton"].unavailable()


TRITON_MISSING = _triton_missing()
# A mark for a test of attention_impl="triton", which a JAX without its kernel (0.12) refuses.
NEEDS_TRITON = pytest.mark.skipif(TRITON_MISSING is not None, reason=str(TRITON_MISSING))


def triton(*values):
  """pytest.param of `values` (default "triton") that skips where this JAX has no Triton
  kernel."""
  return pytest.param(*(values or ("triton",)), marks=NEEDS_TRITON)
