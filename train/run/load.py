"""A finished or running training run's encoder and config, read back from its workdir.

    cfg, variables = load_encoder("runs/demo")
    hidden = Encoder(cfg).apply(variables, tokens)

Only the encoder's parameters are read, not the optimizer's state, from the newest checkpoint
that verifies. A JAX pipeline outside this checkout loads a run's encoder from the file
`python -m train.export --out encoder.msgpack` writes (`flax_encoder.weights.load_weights`).
"""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh

from flax_encoder import Encoder, EncoderConfig, sharding
from train.errors import RunError
from train.run.checkpoint import Checkpointer


# A live run keeps its newest `keep_checkpoints` and deletes older ones as it saves, perhaps
# under a reader: for how long a reader starts again on the newer checkpoints before it gives up
# (a run that saves faster than its checkpoint is read; once it stops saving, a read succeeds).
_PATIENCE_S = 120.0


def _reading(workdir: str, read):
  """`read(checkpointer)` on the checkpoints of the run in `workdir`, read-only. Where it
  fails because a checkpoint it read was deleted meanwhile (a live run's rotation), it is
  tried again on the checkpoints there are now; a RunError where the run keeps doing so."""
  directory = os.path.join(workdir, "checkpoints")
  deadline, attempts = time.monotonic() + _PATIENCE_S, 0
  while True:
    checkpointer = Checkpointer(directory, read_only=True) if os.path.isdir(directory) else None
    steps = checkpointer.steps() if checkpointer else []
    if not steps:
      raise FileNotFoundError(f"no checkpoints under workdir {workdir!r}")
    attempts += 1
    try:
      return read(checkpointer)
    except Exception:
      if not checkpointer.changed():
        raise  # not a checkpoint that went while it was read
      if time.monotonic() > deadline:
        raise RunError(f"workdir {workdir}: the live run deleted the checkpoint being read, "
                       f"on each of {attempts} tries in {_PATIENCE_S:.0f} s (it saves the next "
                       f"faster than one is read); read it again once it has stopped, or let it "
                       f"keep more (config.train.keep_checkpoints)") from None
    finally:
      checkpointer.close()


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The config of the run in `workdir`, as saved with its newest checkpoint whose record
  reads (one cut short by a crash is passed over, as the readers of parameters do)."""

  def read(checkpointer):
    for step in reversed(checkpointer.steps()):
      try:
        meta = checkpointer.read_meta(step)
      except (FileNotFoundError, ValueError, OSError):
        continue
      return ml_collections.ConfigDict(json.loads(meta["config"]))
    raise FileNotFoundError(f"no checkpoint under workdir {workdir!r} has a readable record")

  return _reading(workdir, read)


def recorded_encoder_config(meta: dict, **settings) -> EncoderConfig:
  """The EncoderConfig of the model a checkpoint's meta records, run as `settings` say
  (EncoderConfig's training and execution fields; the library's defaults where not given)."""
  # Checkpoints written before the record had its own entry hold the config, with the data's
  # vocabulary written into it; records of all fields hold how their run ran too: the reader's.
  recorded = meta.get("encoder") or json.loads(meta["config"])["model"]
  return EncoderConfig.from_record(
      {k: v for k, v in recorded.items() if k in EncoderConfig.record_fields()}, **settings)


def load_params(workdir: str, init_for, mesh: Mesh | None = None) -> tuple[dict, dict]:
  """(parameters, meta) of the newest checkpoint in `workdir` that verifies: only the
  parameters `init_for(meta)()` makes are read (a part of the saved ones: the encoder's, say),
  laid out on `mesh` (default: replicated over all devices), whatever mesh or number of
  processes wrote the checkpoint. Nothing in the workdir is moved."""
  mesh = mesh or sharding.make_mesh()

  def read(checkpointer):
    restored = checkpointer.restore_newest(
        lambda meta: {"params": sharding.abstract_arrays(init_for(meta), mesh)})
    if restored is None:
      raise ValueError(f"no checkpoint under {checkpointer.directory!r} restores and verifies")
    return restored

  state, meta = _reading(workdir, read)
  return state["params"], meta


def load_encoder(workdir: str, mesh: Mesh | None = None) -> tuple[EncoderConfig, dict]:
  """(EncoderConfig, encoder variables) of the newest verified checkpoint in `workdir`.

  The variables are laid out on `mesh` by the sharding rules, whatever mesh or number of
  processes wrote the checkpoint; by default replicated over all devices. Inference then takes
  `Encoder(cfg).apply(variables, tokens)`.
  """
  def init_for(meta):
    cfg = recorded_encoder_config(meta)
    return lambda: {"encoder": Encoder(cfg).init(jax.random.PRNGKey(0),
                                                 jnp.ones((1, 1), jnp.int32))["params"]}

  params, meta = load_params(workdir, init_for, mesh)
  return recorded_encoder_config(meta), {"params": params["encoder"]}
