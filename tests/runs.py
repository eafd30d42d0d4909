"""Helpers for tests that run `python -m train` in a subprocess on the tiny config."""

import os
import subprocess
import sys
import time

from train.metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "tiny.py")


def environment(devices: int | None = None) -> dict:
  """The environment of a training subprocess: `devices` CPU devices, and a compilation cache
  shared by all of them (each would otherwise compile the same tiny step again)."""
  env = {**os.environ,
         "JAX_COMPILATION_CACHE_DIR": os.path.join(ROOT, ".pytest_cache", "jax"),
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  if devices:  # simulated CPU devices, on a machine with an accelerator too
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
  return env


EIGHT_DEVICES = environment(8)


def train(workdir, *overrides, check=True, popen=False, env=None, config=TINY):
  """Runs the tiny config (or `config`; None: the overrides name it) in `workdir`; with
  popen=True returns the running process."""
  given = [f"--config={config}"] if config else []
  cmd = [sys.executable, "-m", "train", *given, f"--workdir={workdir}", *overrides]
  env = env or environment()
  if popen:
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
  result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
  if check:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


def losses(workdir) -> dict:
  """{step: training loss} of the run in `workdir`."""
  records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
  return {r["step"]: r["loss"] for r in records if r["split"] == "train"}


def wait_for_step(workdir, step, timeout=300):
  """Polls metrics.jsonl until the run in `workdir` has logged `step`."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    try:
      if max(losses(workdir), default=0) >= step:
        return
    except FileNotFoundError:
      pass
    time.sleep(0.05)
  raise TimeoutError(f"the run in {workdir} did not reach step {step} in {timeout}s")
