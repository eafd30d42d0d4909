"""python -m train --workdir runs/demo [--config configs/base.py] [--config.train.num_steps=100]"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

import configs

_DEFAULT_CONFIG = os.path.join(os.path.dirname(configs.__file__), "default.py")
_CONFIG = config_flags.DEFINE_config_file(
    "config", _DEFAULT_CONFIG, "A configs/*.py file; override fields as --config.train.seed=1.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, plots. "
                               "A workdir with checkpoints resumes.", required=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
  from train.loop import run
  sys.exit(run(_CONFIG.value, _WORKDIR.value))


if __name__ == "__main__":
  app.run(main)
