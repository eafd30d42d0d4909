"""Orbax checkpoints that are atomic, verified on restore and never silently lost.

Each save is one composite checkpoint: the train state (params, optimizer state, step, rng), the
grain iterator state, and a JSON record of the config and a SHA-256 of the state's contents.
Orbax writes into a temporary directory and renames it when complete, so a killed run leaves no
half-written checkpoint behind. On restore, a checkpoint that cannot be read or whose checksum
does not match is reported, moved aside to `checkpoints_corrupt/` (kept, never deleted) and
the next older one is tried.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import warnings

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils


def state_checksum(state) -> str:
  """SHA-256 over every leaf's path, dtype, shape and bytes, in tree order."""
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:  # spread over hosts
      leaf = multihost_utils.process_allgather(leaf, tiled=True)
    value = np.asarray(jax.device_get(leaf))
    digest.update(jax.tree_util.keystr(path).encode())
    digest.update(f"{value.dtype}{value.shape}".encode())
    digest.update(np.ascontiguousarray(value).tobytes())
  return digest.hexdigest()


class Checkpointer:
  """The newest `keep` checkpoints of a run under `directory`, saved asynchronously."""

  def __init__(self, directory: str, keep: int):
    self.directory = os.path.abspath(directory)
    self.quarantine = self.directory + "_corrupt"
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def save(self, step: int, state, data_iterator, config_json: str) -> None:
    meta = {"step": step, "checksum": state_checksum(state), "config": config_json}
    args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                              data=grain.checkpoint.CheckpointSave(data_iterator),
                              meta=ocp.args.JsonSave(meta))
    self.manager.save(step, args=args, force=True)

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def read_meta(self, step: int) -> dict:
    """The JSON record of the checkpoint at `step`: {'step', 'checksum', 'config'}."""
    args = ocp.args.Composite(meta=ocp.args.JsonRestore())
    return self.manager.restore(step, args=args)["meta"]

  def restore_newest(self, abstract_state, data_iterator=None, move_aside: bool = True):
    """The newest checkpoint that restores and verifies: (state, meta), or None if none does.

    `abstract_state` gives the tree structure, shapes, dtypes and shardings (those of the
    devices restored onto, whatever mesh saved it). With `data_iterator`, its position is
    restored too. A checkpoint that fails is reported, and moved aside if `move_aside`.
    """
    for step in reversed(self.steps()):
      items = {"state": ocp.args.StandardRestore(abstract_state), "meta": ocp.args.JsonRestore()}
      if data_iterator is not None:
        items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
      try:
        restored = self.manager.restore(step, args=ocp.args.Composite(**items))
      except Exception as e:  # noqa: BLE001 - any failure to read means: try an older one
        self._skip(step, f"is corrupt or unreadable ({type(e).__name__}: {e})", move_aside)
        continue
      if state_checksum(restored["state"]) != restored["meta"]["checksum"]:
        self._skip(step, "failed its checksum: its contents differ from what was saved "
                   "(corrupt)", move_aside)
        continue
      return restored["state"], restored["meta"]
    return None

  def _skip(self, step: int, why: str, move_aside: bool) -> None:
    where = "left it in place"
    if move_aside:
      os.makedirs(self.quarantine, exist_ok=True)
      target = os.path.join(self.quarantine, str(step))
      suffix = 1
      while os.path.exists(target):
        target = os.path.join(self.quarantine, f"{step}.{suffix}")
        suffix += 1
      shutil.move(os.path.join(self.directory, str(step)), target)
      self.manager.reload()
      where = f"moved it to {target} (kept, not deleted)"
    warnings.warn(f"checkpoint at step {step} {why}; skipped it and {where}; trying the next "
                  f"older checkpoint", stacklevel=3)

  def wait(self) -> None:
    """Blocks until every asynchronous save is on disk."""
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()
