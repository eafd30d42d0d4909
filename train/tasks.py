"""The tasks `python -m train` runs, chosen by config.task.name, and what each sets up.

  masked_lm  pretraining: masked-token prediction on windows of text (train.masked_lm)
  classify   fine-tuning: a label for each text or pair of texts (train.classify)

Each returns a `train.step.Setup`; the loop, its checkpoints, metrics and plots are the same
for both.
"""

from __future__ import annotations

from train import classify, masked_lm
from train.step import Setup

SETUPS = {"masked_lm": masked_lm.setup, "classify": classify.setup}


def setup(config, workdir: str, resuming: bool, allow_changes: bool) -> Setup:
  return SETUPS[config.task.name](config, workdir, resuming, allow_changes)
