"""Meshes and logical sharding: rules, errors, an 8-device run against a 1-device one, and
checkpoints moving between device counts. Multi-device runs use 8 simulated CPU devices in a
subprocess (the device count is fixed when jax starts)."""

import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_encoder import Encoder, sharding
from tests import runs, tiny
from train.run.checkpoint import Checkpointer
from train.run.load import load_encoder


@pytest.mark.parametrize("scan", [False, True])
def test_every_parameter_has_logical_axes(tiny_config, scan):
  cfg = tiny_config.__class__(**{**tiny_config.__dict__, "scan_layers": scan})
  variables = jax.eval_shape(Encoder(cfg).init, jax.random.key(0), jnp.ones((1, 4), jnp.int32))
  specs = jax.tree_util.tree_flatten_with_path(
      nn.get_partition_spec(variables),
      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))[0]
  shapes = jax.tree.leaves(nn.unbox(variables))
  assert len(specs) == len(shapes)
  for (path, spec), shape in zip(specs, shapes):
    names = tuple(spec)
    assert len(names) == len(shape.shape) and all(isinstance(n, str) for n in names), path
    in_scanned_stack = path[1].key == "layers"
    assert (names[0] == "layers") == in_scanned_stack, path
    if len(names) - in_scanned_stack == 2:  # fsdp splits every weight matrix along d_model
      assert "embed" in names, path
  rules = dict(sharding.RULES)
  assert rules["embed"] == "fsdp" and rules["activation_batch"] == ("data", "fsdp")


def test_mesh_and_batch_errors_name_the_argument():
  n = jax.device_count()
  with pytest.raises(ValueError, match=rf"mesh.data \* mesh.fsdp must equal the device count {n}"):
    sharding.make_mesh(data=n + 1, fsdp=1)
  with pytest.raises(ValueError, match="mesh.fsdp must be a positive integer or -1, got 0"):
    sharding.make_mesh(fsdp=0)
  mesh = sharding.make_mesh()
  assert mesh.shape == {"data": n, "fsdp": 1}
  fake = type("Mesh", (), {"shape": {"data": 2, "fsdp": 4}})()
  with pytest.raises(ValueError, match=r"config.train.batch_size=12 must be divisible by .* = 8"):
    sharding.check_batch_divisible(12, fake, "config.train.batch_size")


@pytest.mark.slow
def test_eight_device_data_fsdp_run_matches_the_one_device_run(reference_run, tmp_path):
  workdir = str(tmp_path / "sharded")
  result = runs.train(workdir, "--config.mesh.data=2", "--config.mesh.fsdp=4",
                      env=runs.EIGHT_DEVICES)
  assert "mesh: data=2 x fsdp=4 over 8 cpu devices" in result.stderr
  sharded, single = runs.losses(workdir), runs.losses(reference_run)
  assert sorted(sharded) == sorted(single)
  np.testing.assert_allclose([sharded[s] for s in sorted(sharded)],
                             [single[s] for s in sorted(single)], rtol=2e-5)
  # Its checkpoint (written from 8 devices) loads here, on one, and matches the 1-device run.
  _, variables = load_encoder(workdir)
  _, expected = load_encoder(reference_run)
  # Loosely: Adam divides by sqrt(v), which turns float noise in near-zero gradients into
  # steps of up to the learning rate (0.16 at this tiny config's peak): the rarely seen rows of
  # the embedding (a byte met a few times in 30 steps) then differ by a few 1e-2. The key bias
  # is left out: softmax ignores a shift shared by all keys, so its gradient is exactly zero in
  # exact arithmetic and pure rounding noise in floats, which Adam turns into lr-sized steps in
  # random directions.
  for params in (variables, expected):
    params["params"]["layers_0"]["self_attn"]["w_k"].pop("bias")

  def close(a, b):
    diff = np.abs(np.asarray(a) - np.asarray(b))
    assert diff.max() < 0.16 and np.mean(diff < 1e-2) > 0.999, (diff.max(), np.mean(diff < 1e-2))

  jax.tree.map(close, variables, expected)


@pytest.mark.slow
def test_checkpoint_saved_on_8_devices_restores_on_4_and_on_1(tmp_path):
  result = subprocess.run([sys.executable, "-m", "tests.sharded_checkpoint", str(tmp_path)],
                          cwd=runs.ROOT, env=runs.EIGHT_DEVICES, capture_output=True,
                          text=True, timeout=runs.limit(600), check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "onto 4 devices: equal" in result.stdout and "onto 1 devices: equal" in result.stdout
  # And in this process, which has its own device count.
  config, task, tx, _ = tiny.setup()
  target = tiny.state(task, tx, config, seed=1, mesh=sharding.make_mesh())
  checkpointer = Checkpointer(str(tmp_path / "checkpoints"), keep=1)
  restored, _ = checkpointer.restore_newest(target)
  checkpointer.close()
  saved = np.load(tmp_path / "saved.npz")
  leaves = jax.tree.leaves(restored)
  assert len(leaves) == len(saved.files)
  for i, leaf in enumerate(leaves):
    np.testing.assert_array_equal(np.asarray(leaf), saved[f"arr_{i}"])
