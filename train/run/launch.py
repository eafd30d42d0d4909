r"""Runs `python -m train` as several processes on this machine, joined by jax.distributed.

  python -m train.launch --processes 2 --devices-per-process 2 -- --workdir runs/mp \
      --config.mesh.data=2 --config.mesh.fsdp=2
  python -m train.launch --processes 8 --gpus-per-process 1 -- --workdir runs/gpu   # a GPU node
  python -m train.launch --program embed --processes 2 --devices-per-process 4 -- \
      --model DIR --input corpus.jsonl --out embeddings/

Everything after `--` goes to each `python -m train` (`--program embed`: each
`python -m train.embed`), which also gets `--multihost` with the
coordinator's address (a free local port), its process id and the process count. On CPU each
process gets `--devices-per-process` devices (XLA_FLAGS); on a GPU node each gets its own
`--gpus-per-process` GPUs (CUDA_VISIBLE_DEVICES). Output lines carry a `[i]` prefix. SIGTERM
and SIGINT are forwarded to every process. The exit code is the first non-zero one a process
ends with (the others are then stopped), or 0. If the launcher itself dies (kill -9), its
processes get SIGTERM from the kernel (PR_SET_PDEATHSIG): they stop together at their next
log step, save, and say why on the launcher's standard error.

On a cluster (SLURM, TPU pods, Kubernetes) run `python -m train --multihost` once per host
instead: jax.distributed finds its settings there (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from train.cli import HelpFormatter

# After a process fails, how long the others get to stop before SIGKILL. They cannot save
# without it (saving is collective), and may be stuck in a collective waiting for it.
_GRACE_S = 10
# In each process: "PID:FD", the launcher's pid and a descriptor of the launcher's standard
# error, where the process writes once the launcher, and with it its own pipes, is gone.
LAUNCHER_ENV = "TRAIN_LAUNCHER"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def follow_launcher() -> str | None:
  """In a process the launcher started, first thing: asks the kernel for SIGTERM when the
  launcher dies, then returns `orphaned()`, in case it died before the request."""
  if LAUNCHER_ENV not in os.environ:
    return None
  ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
  return orphaned()


def orphaned() -> str | None:
  """In a process the launcher started: if the launcher has died, points this process's output
  at the launcher's standard error (its own pipes to the launcher are broken) and says why;
  None while the launcher lives, or in a process it did not start."""
  launcher = os.environ.get(LAUNCHER_ENV)
  if not launcher:
    return None
  pid, fd = (int(x) for x in launcher.split(":"))
  if os.getppid() == pid:
    return None
  try:
    os.dup2(fd, 1)
    os.dup2(fd, 2)
  except OSError:
    pass  # nowhere to write: stop all the same
  return f"the launcher (pid {pid}) died"


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


PROGRAMS = {"train": "train", "embed": "train.embed"}  # --program: the module each process runs


def commands(processes: int, train_args: list[str], port: int,
             program: str = "train") -> list[list[str]]:
  """The command line of each process."""
  return [[sys.executable, "-m", PROGRAMS[program], "--multihost",
           f"--coordinator_address=localhost:{port}", f"--num_processes={processes}",
           f"--process_id={i}", *train_args]
          for i in range(processes)]


def environments(processes: int, devices_per_process: int | None,
                 gpus_per_process: int | None) -> list[dict]:
  """Each process's environment: its CPU device count, or its GPUs."""
  envs = []
  for i in range(processes):
    env = dict(os.environ)
    if gpus_per_process:
      first = i * gpus_per_process
      env["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + g) for g in range(gpus_per_process))
    else:
      flags = env.get("XLA_FLAGS", "")
      env["XLA_FLAGS"] = (f"{flags} --xla_force_host_platform_device_count="
                          f"{devices_per_process}").strip()
      env["JAX_PLATFORMS"] = "cpu"
    envs.append(env)
  return envs


def _exit_code(returncode: int) -> int:
  return 128 - returncode if returncode < 0 else returncode  # killed by signal s: 128 + s


def launch(cmds: list[list[str]], envs: list[dict], out=sys.stdout) -> int:
  """Runs the processes to the end; returns the launcher's exit code."""
  error_fd = os.dup(2)
  launcher = {LAUNCHER_ENV: f"{os.getpid()}:{error_fd}"}
  procs = [subprocess.Popen(cmd, env={**env, **launcher}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1,
                            pass_fds=(error_fd,))
           for cmd, env in zip(cmds, envs)]
  os.close(error_fd)
  lock = threading.Lock()

  def stream(i, proc):
    for line in proc.stdout:
      with lock:
        out.write(f"[{i}] {line}")
        out.flush()

  readers = [threading.Thread(target=stream, args=(i, p), daemon=True)
             for i, p in enumerate(procs)]
  for r in readers:
    r.start()

  def forward(signum, frame):
    for p in procs:
      if p.poll() is None:
        p.send_signal(signum)

  previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
  code, deadline, running = 0, None, set(range(len(procs)))
  try:
    while running:
      for i in sorted(running):
        if procs[i].poll() is None:
          continue
        running.discard(i)
        returncode = _exit_code(procs[i].returncode)
        if returncode and not code:
          code, deadline = returncode, time.monotonic() + _GRACE_S
          with lock:
            out.write(f"launch: process {i} exited with {code}; stopping the others\n")
          forward(signal.SIGTERM, None)
        elif returncode:
          with lock:
            out.write(f"launch: process {i} exited with {returncode}\n")
      if deadline is not None and time.monotonic() > deadline:
        for i in running:
          procs[i].kill()
      time.sleep(0.05)
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    for r in readers:
      r.join(timeout=5)
  return code


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if "--" in argv:
    split = argv.index("--")
    argv, train_args = argv[:split], argv[split + 1:]
  else:
    train_args = []
  parser = argparse.ArgumentParser(prog="python -m train.launch", description=__doc__,
                                   formatter_class=HelpFormatter)
  parser.add_argument("--processes", type=int, required=True)
  parser.add_argument("--program", choices=sorted(PROGRAMS), default="train",
                      help="what each process runs: python -m train, or python -m train.embed")
  devices = parser.add_mutually_exclusive_group(required=True)
  devices.add_argument("--devices-per-process", type=int, help="CPU devices of each process")
  devices.add_argument("--gpus-per-process", type=int, help="GPUs of each process")
  args = parser.parse_args(argv)
  for name in ("processes", "devices_per_process", "gpus_per_process"):
    value = getattr(args, name)
    if value is not None and value < 1:
      parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
  needed = "--workdir" if args.program == "train" else "--out"
  if not any(a.startswith(needed) for a in train_args):
    parser.error(f"pass the {args.program} arguments after --, at least {needed} ...")
  cmds = commands(args.processes, train_args, free_port(), args.program)
  return launch(cmds, environments(args.processes, args.devices_per_process,
                                   args.gpus_per_process))


if __name__ == "__main__":
  sys.exit(main())
