"""Real processes joined by jax.distributed on this machine (gloo collectives on CPU): two
processes against one with the same devices, checkpoints moving between process counts, and a
run that survives SIGTERM to one process and kill -9 of another, ending bit for bit where an
uninterrupted run ends."""

import io
import os
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from tests import runs
from train.run import launch
from train.run.load import load_encoder

pytestmark = pytest.mark.slow  # real processes: minutes on 2 cores
# On JAX 0.12, two CPU processes that find their step in the persistent compilation cache the
# tests share (written by an earlier run of other processes) hang in their first collective
# (a run after another of the same shapes reaches no step; checked on 0.12.1: with the cache
# off it trains as on 0.10). Their runs go without the cache there (docs/training.md says so).
NO_CACHE = ({"JAX_ENABLE_COMPILATION_CACHE": "false"}
            if tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 12) else {})

# The tiny config, shorter: 16 steps, a checkpoint every 4, one evaluation at the end.
STEPS = 16
MESH = ["--config.mesh.data=2", "--config.mesh.fsdp=2", f"--config.train.num_steps={STEPS}",
        "--config.train.checkpoint_every=4", f"--config.train.eval_every={STEPS}"]
TWO_DEVICES = {**runs.environment(2), **NO_CACHE}


def _launch(workdir, *overrides, log=None):
  """The tiny config as 2 processes x 2 devices through the launcher; with a `log` file,
  started and left running, its output into the file (a pipe that no one reads while the
  test waits would fill up and stop the run)."""
  cmd = [sys.executable, "-m", "train.launch", "--processes", "2", "--devices-per-process", "2",
         "--", f"--config={runs.TINY}", f"--workdir={workdir}", *MESH, *overrides]
  kwargs = {"cwd": runs.ROOT, "env": {**runs.environment(), **NO_CACHE}, "text": True}
  if log is not None:
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, **kwargs)
  return subprocess.run(cmd, capture_output=True, timeout=runs.limit(600), check=False, **kwargs)


def _train_process(workdir, process_id):
  """The pid of `python -m train` process `process_id` of the run in `workdir`."""
  for entry in os.listdir("/proc"):
    try:
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        args = f.read().decode().split("\0")
    except (OSError, ValueError):
      continue
    if f"--workdir={workdir}" in args and f"--process_id={process_id}" in args:
      return int(entry)
  raise LookupError(f"no process {process_id} of the run in {workdir}")


# Each run is made once for all pytest-xdist workers, which share this module's tests.


@pytest.fixture(scope="module")
def four_device_run(tmp_path_factory):
  """One process with 4 devices, mesh data=2 x fsdp=2: what 2 processes x 2 devices match."""
  workdir, _ = runs.once_per_session(
      tmp_path_factory, "four_devices",
      lambda directory: runs.train(directory, *MESH, env=runs.environment(4)).returncode)
  return workdir


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
  """The same run as 2 processes x 2 devices, uninterrupted: (workdir, the launcher's output)."""
  def launch_(directory):
    result = _launch(directory)
    return {"returncode": result.returncode, "stdout": result.stdout, "stderr": result.stderr}

  workdir, result = runs.once_per_session(tmp_path_factory, "two_processes", launch_)
  return workdir, runs.Result(**result)


def test_two_processes_train_as_one_with_the_same_devices(two_process_run, four_device_run):
  (multi, result), single = two_process_run, four_device_run
  assert result.returncode == 0, result.stdout[-3000:]
  for i in range(2):
    assert f"[{i}] mesh: data=2 x fsdp=2 over 4 cpu devices in 2 process(es)" in result.stdout
  one, two = runs.losses(single), runs.losses(multi)
  assert sorted(two) == sorted(one) == list(range(1, STEPS + 1))
  np.testing.assert_allclose([two[s] for s in sorted(two)], [one[s] for s in sorted(one)],
                             rtol=1e-5)
  # Saved by 2 processes, verified and restored by this one.
  _, variables = load_encoder(multi)
  _, expected = load_encoder(single)
  assert jax.tree.structure(variables) == jax.tree.structure(expected)


def test_each_process_places_its_rows_and_restores_its_shards_of_a_1_process_checkpoint(
    tmp_path, four_device_run):
  _, variables = load_encoder(four_device_run)  # here, in one process
  expected = str(tmp_path / "expected.npz")
  np.savez(expected, *[np.asarray(leaf) for leaf in jax.tree.leaves(variables)])
  port = str(launch.free_port())
  procs = [subprocess.Popen(
      [sys.executable, "-m", "tests.two_processes", port, str(i), four_device_run, expected],
      cwd=runs.ROOT, env=TWO_DEVICES, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True) for i in range(2)]
  outs = [p.communicate(timeout=runs.limit(300)) for p in procs]
  assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
  # Only the lines the processes print themselves (a library may write blank or other lines).
  lines = [line.split() for out, _ in outs for line in out.splitlines()
           if line.startswith(("rows ", "restored "))]
  # batch_size 8: each process half the rows, together all of them.
  assert [tuple(int(x) for x in line[1:]) for line in lines if line[0] == "rows"] == [
      (0, 4), (4, 8)], [out for out, _ in outs]
  assert sum(line[0] == "restored" for line in lines) == 2, [out for out, _ in outs]  # bitwise


def test_sigterm_to_one_process_then_kill_9_of_another_then_an_exact_restart(tmp_path,
                                                                          two_process_run):
  workdir = str(tmp_path / "run")
  # SIGTERM to process 1 only: process 0, never signalled, must stop and save at its step.
  with open(tmp_path / "launch.log", "w") as log:
    launcher = _launch(workdir, log=log)
    runs.wait_for_step(workdir, 3)
    os.kill(_train_process(workdir, 1), signal.SIGTERM)
    launcher.wait(timeout=runs.limit(300))
  out = (tmp_path / "launch.log").read_text()
  assert launcher.returncode == 143, out[-3000:]
  stopped = [line for line in out.splitlines() if "stopped by signal" in line]
  assert {line[:4] for line in stopped} == {"[0] ", "[1] "}, out[-3000:]
  steps = {int(line.split(" at step ")[1].split(";")[0]) for line in stopped}
  assert len(steps) == 1, stopped  # both stopped, and saved, at one step
  step = steps.pop()
  assert step + 3 < STEPS, f"stopped at step {step}, too late for the rest of this test"
  assert "signal to another process" in out
  assert max(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints"))) == step

  # Resume without the launcher; kill -9 process 1 (no handler runs, nothing is saved). The
  # survivor, waiting in a collective, must fail with an error instead of hanging.
  port = launch.free_port()
  # their output into files: a pipe no one reads fills up and stops the process writing to it
  logs = [open(tmp_path / f"resumed.{i}.log", "w+") for i in range(2)]
  procs = [subprocess.Popen(
      cmd, cwd=runs.ROOT, env=TWO_DEVICES, stdout=log, stderr=log, text=True)
      for cmd, log in zip(launch.commands(
          2, [f"--config={runs.TINY}", f"--workdir={workdir}", *MESH,
              f"--heartbeat_timeout_s={round(runs.limit(5))}"], port), logs)]
  runs.wait_for_step(workdir, step + 3)
  procs[1].kill()
  killed = time.time()
  procs[0].wait(timeout=runs.limit(120))
  procs[1].wait()
  for log in logs:
    log.close()
  err = (tmp_path / "resumed.0.log").read_text()
  assert procs[0].returncode != 0 and time.time() - killed < runs.limit(60), "the survivor hung"
  # gloo sees the closed connection at once; the coordination service's heartbeat timeout
  # covers a host that vanishes without closing it.
  reasons = ("Connection closed by peer", "Connection reset by peer", "heartbeat")
  assert any(reason in err for reason in reasons), err[-3000:]
  assert f"resumed from the checkpoint at step {step}" in err

  result = _launch(workdir)
  assert result.returncode == 0, result.stdout[-3000:]
  assert runs.losses(workdir) == runs.losses(two_process_run[0])  # bit for bit


def _python(code):
  return [sys.executable, "-c", code]


def test_the_launcher_stops_the_others_when_one_fails_and_forwards_signals():
  envs, out = [dict(os.environ)] * 2, io.StringIO()
  wait = "import time\nfor _ in range(600): time.sleep(0.1)"
  started = time.time()
  assert launch.launch([_python("raise SystemExit(3)"), _python(wait)], envs, out) == 3
  assert time.time() - started < runs.limit(30)  # the sleeper got SIGTERM
  assert "launch: process 0 exited with 3; stopping the others" in out.getvalue()

  on_term = ("import signal, sys, time\n"
             "def stop(signum, frame):\n"
             "  print('got', signum, flush=True)\n"
             "  sys.exit(128 + signum)\n"
             "signal.signal(signal.SIGTERM, stop)\n"
             "print('ready', flush=True)\n" + wait)
  threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
  out = io.StringIO()
  assert launch.launch([_python(on_term)] * 2, envs, out) == 143
  assert "[0] got 15" in out.getvalue() and "[1] got 15" in out.getvalue()


# Contrastive training: in-batch negatives are the whole global batch's, whichever process
# embedded them; with GradCache too, its chunks embedded and back-propagated one at a time.
CONTRASTIVE = ["--config=" + os.path.join(runs.ROOT, "configs", "embed.py"),
               "--config.data.tokenizer=bytes", "--config.model.d_model=16",
               "--config.model.n_heads=2", "--config.model.d_ff=32", "--config.model.n_layers=1",
               "--config.model.max_len=32", "--config.train.seq_len=32",
               "--config.train.batch_size=16", "--config.train.num_steps=8",
               "--config.train.log_every=1", "--config.train.eval_every=8",
               "--config.train.checkpoint_every=8", "--config.mesh.data=2",
               "--config.mesh.fsdp=2"]


def _pairs_file(path, count: int, seed: int, distinct: bool = False) -> str:
  """`count` pairs of a topic word and a text about it, 2 to 40 bytes long; `distinct`: no two
  positives alike (two alike score within a rounding of each other, so which ranks first is
  rounding's choice, which 2 processes and 1 make differently)."""
  rng = np.random.default_rng(seed)
  words = ["river", "engine", "violin", "harbour", "glacier", "orchard", "lantern", "comet"]
  lines, texts = [], set()
  while len(lines) < count:
    topic = str(rng.choice(words))
    text = " ".join([topic, *rng.choice(words, int(rng.integers(0, 6)))])
    anchor = topic[:int(rng.integers(2, 8))]
    if distinct and text in texts:
      continue
    texts.add(text)
    lines.append(f'{{"anchor": "{anchor}", "positive": "{text}"}}\n')
  with open(path, "w") as f:
    f.writelines(lines)
  return str(path)


@pytest.mark.parametrize("cached", [False, True],
                         ids=["at_once", "gradcache"])
def test_contrastive_training_in_two_processes_is_one_processes_with_the_same_devices(
    tmp_path, cached):
  data = [f"--config.data.train={_pairs_file(tmp_path / 'train.jsonl', 160, 0)}",
          f"--config.data.eval={_pairs_file(tmp_path / 'eval.jsonl', 24, 1, distinct=True)}"]
  if cached:  # GradCache: the batch's 32 texts embedded about 8 at a time (4 chunks)
    data += ["--config.task.cached=True", "--config.task.mini_batch=8"]
  one, two = str(tmp_path / "one"), str(tmp_path / "two")
  single = subprocess.run([sys.executable, "-m", "train", *CONTRASTIVE, *data, f"--workdir={one}"],
                          cwd=runs.ROOT, env=runs.environment(4), capture_output=True, text=True,
                          timeout=runs.limit(600), check=False)
  assert single.returncode == 0, single.stderr[-3000:]
  launched = subprocess.run(
      [sys.executable, "-m", "train.launch", "--processes", "2", "--devices-per-process", "2",
       "--", *CONTRASTIVE, *data, f"--workdir={two}"],
      cwd=runs.ROOT, env={**runs.environment(), **NO_CACHE}, capture_output=True, text=True,
      timeout=runs.limit(600), check=False)
  assert launched.returncode == 0, launched.stdout[-3000:]
  a, b = runs.losses(one), runs.losses(two)
  assert sorted(a) == sorted(b) == list(range(1, 9))
  # Within a few float32 ulps (1e-6 of ~2.5): the two programs differ in their collectives and
  # XLA fuses each on its own (GradCache's losses differed by 4 ulps in one step of eight).
  np.testing.assert_allclose([b[s] for s in sorted(b)], [a[s] for s in sorted(a)], rtol=1e-6)
  evals = [[r["mrr_at_10"] for r in runs.read_metrics(os.path.join(w, "metrics.jsonl"))
            if r["split"] == "eval"] for w in (one, two)]
  np.testing.assert_allclose(evals[1], evals[0], atol=5e-7)


# Joining and waiting: train.embed's processes (and train's) join by jax.distributed and wait
# for each other at the end; each failure to join is one line.

def _embed_process(port: int, process_id: int, out: str, extra=()) -> list[str]:
  return [sys.executable, "-m", "train.embed", "--model", "unused", "--input", "unused",
          "--out", out, "--multihost", f"--coordinator_address=localhost:{port}",
          "--num_processes=2", f"--process_id={process_id}", *extra]


_BARRIER_LATE = """
import argparse, sys, time
from train.outputs import embed
args = argparse.Namespace(coordinator_address=f"localhost:{sys.argv[1]}", num_processes=2,
                          process_id=int(sys.argv[2]), heartbeat_timeout_s=100, out="DIR/")
process, barrier = embed._join(args)
time.sleep(float(sys.argv[3]))  # this process's share of the parts
barrier()
print("passed", process, flush=True)
"""


def test_processes_whose_work_ends_minutes_apart_wait_for_each_other(tmp_path):
  """A corpus embed's processes finish their shares of the parts at different times (parts of
  very different line counts); the one done first waits at the end for the other as long as
  it lives. On CPU a collective as that barrier failed past a fixed 30 s (Gloo's context,
  made at its first use), naming a stopped process that never stopped."""
  port = launch.free_port()
  runs_of = [subprocess.Popen([sys.executable, "-c", _BARRIER_LATE, str(port), str(i), late],
                              cwd=runs.ROOT, env=runs.environment(1), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for i, late in ((0, "0"), (1, "40"))]
  outs = [p.communicate(timeout=runs.limit(600))[0] for p in runs_of]
  for i, (p, out) in enumerate(zip(runs_of, outs)):
    assert p.returncode == 0, out[-2000:]
    assert f"passed ({i}, 2)" in out


def test_a_coordinator_port_taken_is_one_line_and_the_others_say_how_long_they_wait(tmp_path):
  import socket
  with socket.socket() as taken:
    taken.bind(("", 0))
    taken.listen()
    port = taken.getsockname()[1]
    first = subprocess.run(_embed_process(port, 0, str(tmp_path / "e") + "/"), cwd=runs.ROOT,
                           env=runs.environment(1), capture_output=True, text=True,
                           timeout=runs.limit(120))
  assert first.returncode == 2, first.stderr[-2000:]
  assert "Traceback" not in first.stderr
  assert (f"embed: error: --coordinator_address localhost:{port}: process 0 cannot listen "
          f"there (Address already in use)") in first.stderr
  other = subprocess.Popen(_embed_process(port, 1, str(tmp_path / "e") + "/"), cwd=runs.ROOT,
                           env=runs.environment(1), stderr=subprocess.PIPE, text=True)
  try:  # said first, before it waits: the lines before it are the interpreter's, if any
    said = [other.stderr.readline()]
    while said[-1] and "joining the others" not in said[-1] and len(said) < 50:
      said.append(other.stderr.readline())
    assert f"joining the others at localhost:{port} (waiting up to 300 s" in said[-1], said
  finally:
    other.kill()
    other.communicate()
