"""A finished or running training run's encoder and config, read back from its workdir.

    cfg, variables = load_encoder("runs/demo")
    hidden = Encoder(cfg).apply(variables, tokens)
"""

from __future__ import annotations

import json
import os

import ml_collections
from jax.sharding import Mesh

from flax_encoder import EncoderConfig, sharding
from train.checkpoint import Checkpointer
from train.loop import abstract_state, encoder_config, masked_lm
from train.optim import make_optimizer


def _open_checkpoints(workdir: str) -> Checkpointer:
  directory = os.path.join(workdir, "checkpoints")
  checkpointer = Checkpointer(directory, keep=1) if os.path.isdir(directory) else None
  if checkpointer is None or not checkpointer.steps():
    raise FileNotFoundError(f"no checkpoints under workdir {workdir!r}")
  return checkpointer


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The config of the run in `workdir`, as saved with its newest checkpoint."""
  checkpointer = _open_checkpoints(workdir)
  try:
    meta = checkpointer.read_meta(checkpointer.steps()[-1])
  finally:
    checkpointer.close()
  return ml_collections.ConfigDict(json.loads(meta["config"]))


def load_encoder(workdir: str, mesh: Mesh | None = None) -> tuple[EncoderConfig, dict]:
  """(EncoderConfig, encoder variables) of the newest verified checkpoint in `workdir`.

  The variables are laid out on `mesh` by the sharding rules, whatever mesh or number of
  processes wrote the checkpoint; by default replicated over all devices. Inference then takes
  `Encoder(cfg).apply(variables, tokens)`.
  """
  config = load_config(workdir)
  cfg = encoder_config(config)
  tx, _ = make_optimizer(config.optim, cfg.d_model)
  mesh = mesh or sharding.make_mesh()
  abstract = abstract_state(masked_lm(config), tx, config.train.seq_len, mesh)
  checkpointer = _open_checkpoints(workdir)
  try:
    # A reader leaves the workdir as it found it: nothing is moved aside.
    restored = checkpointer.restore_newest(abstract, move_aside=False)
  finally:
    checkpointer.close()
  if restored is None:
    raise ValueError(f"no checkpoint under {checkpointer.directory!r} restores and verifies")
  return cfg, {"params": restored[0].params["encoder"]}
