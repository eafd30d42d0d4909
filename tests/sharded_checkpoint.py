"""Run with 8 devices: save a train state split 8 ways, restore it onto 4 devices and onto 1.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.sharded_checkpoint DIR

Writes DIR/checkpoints and DIR/saved.npz (the saved state's leaves, for a check in another
process); prints one line per restore.
"""

import os
import sys

import jax
import numpy as np

from flax_encoder import sharding
from tests import tiny
from train.data import pipeline
from train.run.checkpoint import Checkpointer


def main(directory):
  assert jax.device_count() == 8, jax.devices()
  config, task, tx, schedule = tiny.setup()
  mesh8 = sharding.make_mesh(data=1, fsdp=8)
  state = tiny.state(task, tx, config, mesh=mesh8)
  batches = tiny.batches(config)
  step = tiny.jitted_step(task, tx, schedule)
  for _ in range(2):
    state, _ = step(state, pipeline.to_devices(next(batches), mesh8))
  kernel = state.params["encoder"]["layers_0"]["feed_forward"]["w_1"]["kernel"]
  assert len(kernel.sharding.device_set) == 8 and kernel.addressable_shards[0].data.shape[0] == 2

  checkpointer = Checkpointer(os.path.join(directory, "checkpoints"), keep=1)
  checkpointer.save(2, state, batches, {})
  checkpointer.wait()
  saved = jax.tree.leaves(jax.device_get(state))
  np.savez(os.path.join(directory, "saved.npz"), *saved)

  for n in (4, 1):
    mesh = sharding.make_mesh(data=1, fsdp=n, devices=jax.devices()[:n])
    target = tiny.state(task, tx, config, mesh=mesh)  # restored arrays take its layout
    restored, meta = checkpointer.restore_newest(target)
    for a, b in zip(saved, jax.tree.leaves(restored), strict=True):
      np.testing.assert_array_equal(a, np.asarray(b))
    kernel = restored.params["encoder"]["layers_0"]["feed_forward"]["w_1"]["kernel"]
    assert kernel.sharding.device_set == set(jax.devices()[:n]), kernel.sharding
    print(f"restored step {meta['step']} onto {n} devices: equal")
  checkpointer.close()


if __name__ == "__main__":
  main(sys.argv[1])
