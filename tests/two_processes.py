"""One of two processes joined by jax.distributed, on a mesh data=2 x fsdp=2 over the devices
of both (for tests/test_multiprocess.py):

  XLA_FLAGS=--xla_force_host_platform_device_count=2 \
      python -m tests.two_processes PORT PROCESS_ID WORKDIR EXPECTED_NPZ

- reads its rows of a batch of the tiny pipeline, checks that they are its share of the global
  batch, that placed on the devices its shards hold them and that gathered they are all of
  it, and prints `rows START STOP`;
- restores the newest checkpoint in WORKDIR (written by a run with another number of processes),
  checks that every shard this process holds equals the same part of the arrays in
  EXPECTED_NPZ (the encoder's parameters, in tree order), and prints `restored N arrays`.
"""

import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

from flax_encoder import sharding
from tests import tiny
from train.data import pipeline
from train.run.load import load_encoder


def main(port: str, process_id: str, workdir: str, expected_npz: str):
  jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=int(process_id))
  mesh = sharding.make_mesh(data=2, fsdp=2)

  config = tiny.get_config()
  batch = next(tiny.batches(config, rows=slice(None)))  # the whole global batch
  rows = next(tiny.batches(config))  # what this process reads of it
  np.testing.assert_array_equal(rows, batch[pipeline.process_rows(len(batch))])
  arrays = pipeline.to_devices(rows, mesh)
  shards = arrays.addressable_shards
  for shard in shards:
    np.testing.assert_array_equal(shard.data, batch[shard.index])
  gathered = multihost_utils.process_allgather(arrays, tiled=True)
  np.testing.assert_array_equal(gathered, batch)
  start = min(s.index[0].start or 0 for s in shards)
  print(f"rows {start} {max(s.index[0].stop for s in shards)}", flush=True)

  _, variables = load_encoder(workdir, mesh)
  expected = np.load(expected_npz)
  leaves = jax.tree.leaves(variables)
  assert len(leaves) == len(expected.files), (len(leaves), len(expected.files))
  for i, leaf in enumerate(leaves):
    for shard in leaf.addressable_shards:
      np.testing.assert_array_equal(shard.data, expected[f"arr_{i}"][shard.index])
  print(f"restored {len(leaves)} arrays", flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(*sys.argv[1:])
