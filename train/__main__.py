"""python -m train --workdir runs/demo [--config configs/base.py] [--config.train.num_steps=100]"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

import configs
from train.host import keep_freed_memory

_DEFAULT_CONFIG = os.path.join(os.path.dirname(configs.__file__), "default.py")
_CONFIG = config_flags.DEFINE_config_file(
    "config", _DEFAULT_CONFIG, "A configs/*.py file; override fields as --config.train.seed=1.")
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False, "Start with jax.distributed.initialize(), one process per host. On "
    "Cloud TPU, SLURM, Open MPI and the like the cluster is detected; elsewhere pass "
    "--coordinator_address, --num_processes and --process_id.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout_s", 100, "Seconds without a heartbeat after which the coordination "
    "service declares a process dead and stops the others (instead of letting them hang in a "
    "collective).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, plots. "
                               "A workdir with checkpoints resumes.", required=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
  keep_freed_memory()  # before JAX starts its threads; see train/host.py
  if _MULTIHOST.value:
    import jax
    jax.distributed.initialize(coordinator_address=_COORDINATOR.value,
                               num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value,
                               heartbeat_timeout_seconds=_HEARTBEAT.value)
  from train.loop import run
  sys.exit(run(_CONFIG.value, _WORKDIR.value))


if __name__ == "__main__":
  app.run(main)
