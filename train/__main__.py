"""python -m train --workdir runs/demo [--config configs/base.py] [--config.train.num_steps=100]

A mistake in the config, the data or the workdir is one line, `error: <field or file>: <what
came>, <what is expected>`, and exit code 2; a resource that fails during the run (a full
disk) is one line and exit code 1. A traceback means a bug.
"""

import logging
import os
import sys
import traceback

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

import configs
from train.errors import RunError
from train.run import launch, multihost
from train.run.host import bound_freed_memory, discard_stdout_once_closed, jemalloc_environment


def _no_such_field(error: BaseException) -> None:
  """ml_collections' error for a --config.x.y that names no field, as one line; exits 2."""
  while error.args and isinstance(error.args[0], BaseException):  # a KeyError inside
    error = error.args[0]
  lines = str(error.args[0] if error.args else error).splitlines()
  missing = lines[0].strip("'\"") if lines else "?"
  given = next((a.split("=")[0] for a in sys.argv[1:]
                if a.startswith("--config.") and missing in a.split("=")[0].split(".")),
               "--config")
  hint = f" ({lines[1]})" if len(lines) > 1 else ""
  print(f"error: {given}: no such field in the config{hint}", file=sys.stderr)
  sys.exit(2)


def _config_flag(flag_values: flags.FlagValues):
  """--config, with the file's fields as --config.x.y flags (the default file's fields are
  read, and a wrong one fails, while the flag is defined)."""
  default = os.path.join(os.path.dirname(configs.__file__), "default.py")
  try:
    return config_flags.DEFINE_config_file(
        "config", default, "A configs/*.py file; override fields as --config.train.seed=1.",
        flag_values=flag_values)
  except (AttributeError, KeyError) as e:
    _no_such_field(e)


def parse_flags(argv, flag_values: flags.FlagValues = flags.FLAGS):
  """absl's parsing, with a wrong field or value, or a config file that does not load, as
  one line (exit 2)."""
  try:
    parsed = flag_values(argv)
    "task" in flag_values["config"].value  # noqa: B015 - reads the file if not read yet
    return parsed
  except (AttributeError, KeyError) as e:
    _no_such_field(e)
  except flags.Error as e:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if "Traceback (most recent call last):" in lines:  # a config file that raised: its error
      lines = [f"{lines[0].rstrip(':')} ({lines[-1]})"]
    print(f"error: {' '.join(lines)}", file=sys.stderr)
    sys.exit(2)
  except Exception as e:  # noqa: BLE001 - what loading the file raised, or a bug (re-raised)
    given = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), "")
    loading = (OSError, SyntaxError, TypeError, ImportError)
    if not (isinstance(e, loading) or _raised_in(e, given.split(":", 1)[0])):
      raise
    said = (str(e).strip().splitlines() or [""])[-1].strip()
    why = (f"line {e.lineno}: {e.msg}" if isinstance(e, SyntaxError)
           else said if isinstance(e, loading) else f"{type(e).__name__}: {said}")
    print(f"error: --config {given}: cannot load it ({why}); expected a configs/*.py file "
          f"(or one like it) with a get_config()", file=sys.stderr)
    sys.exit(2)


def _raised_in(error: BaseException, file: str) -> bool:
  """Whether `error` was raised within the code of `file` (a config file: the user's code)."""
  if not file:
    return False
  frames = traceback.extract_tb(error.__traceback__)
  return any(os.path.realpath(frame.filename) == os.path.realpath(file) for frame in frames)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> dict:
  """Defines the program's flags in `flag_values`; returns their holders by name."""
  return {
      "config": _config_flag(flag_values),
      "multihost": flags.DEFINE_bool(
          "multihost", False, "Start with jax.distributed.initialize(), one process per host. "
          "On Cloud TPU, SLURM, Open MPI and the like the cluster is detected; elsewhere pass "
          "--coordinator_address, --num_processes and --process_id.", flag_values=flag_values),
      "coordinator_address": flags.DEFINE_string(
          "coordinator_address", None, "host:port of process 0.", flag_values=flag_values),
      "num_processes": flags.DEFINE_integer(
          "num_processes", None, "Processes in the job.", flag_values=flag_values),
      "process_id": flags.DEFINE_integer(
          "process_id", None, "This process's index.", flag_values=flag_values),
      "heartbeat_timeout_s": flags.DEFINE_integer(
          "heartbeat_timeout_s", 100, "Seconds without a heartbeat after which the coordination "
          "service declares a process dead and stops the others (instead of letting them hang "
          "in a collective).", flag_values=flag_values),
      "workdir": flags.DEFINE_string(
          "workdir", None, "Run directory: checkpoints, metrics, plots. A workdir with "
          "checkpoints resumes.", required=True, flag_values=flag_values),
      "allow_changes": flags.DEFINE_bool(
          "allow_changes", False, "Resume even though settings that change what the run "
          "computes (batch size, seq_len, optimizer, seed, data, ...) differ from its "
          "checkpoint's config.", flag_values=flag_values),
  }


_FLAGS = define_flags()


class _NotOrbaxErrors(logging.Filter):
  """Orbax logs each failed save with pages of tracebacks (and asyncio those of its tasks); the
  program reports the failure in one line."""

  def filter(self, record):
    return not (record.levelno >= logging.ERROR and (
        "orbax" in record.pathname or "orbax" in record.getMessage()))


def main(argv, given: dict | None = None):
  """The program, its flags parsed (`given`: define_flags' holders; the process's own by
  default). Exits with the run's code."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  given = given or _FLAGS
  absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every file it writes at INFO
  absl_logging.get_absl_handler().addFilter(_NotOrbaxErrors())
  bound_freed_memory()  # before JAX starts its threads; see train/run/host.py
  why = launch.follow_launcher()
  if why:  # it died before this process could ask to be stopped with it
    print(f"error: {why} before this process started", file=sys.stderr)
    sys.exit(143)
  from train.loop import run
  try:
    if given["multihost"].value:
      multihost.join(given["coordinator_address"].value, given["num_processes"].value,
                     given["process_id"].value, given["heartbeat_timeout_s"].value,
                     "--coordinator_address")
    sys.exit(run(given["config"].value, given["workdir"].value, given["allow_changes"].value))
  except RunError as e:
    print(f"\nerror: {e}", file=sys.stderr)
    sys.exit(e.exit_code)


if __name__ == "__main__":
  discard_stdout_once_closed()
  try:
    with_jemalloc = jemalloc_environment()  # see train/run/host.py
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  if with_jemalloc is not None:
    os.execve(sys.executable, sys.orig_argv, with_jemalloc)  # the same command, same pid
  app.run(main, flags_parser=parse_flags)
