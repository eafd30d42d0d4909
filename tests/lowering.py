"""Run with 4 CPU devices: the training step and the exported encoder lowered for TPU and CUDA.

  XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu python -m tests.lowering

The tiny config in bfloat16, documents kept apart, two microbatches, its state laid out on a
data=2 x fsdp=2 mesh by the logical rules, the step jitted as `python -m train` jits it;
then `jax.export` of the encoder for both platforms. Prints one line per platform with what the
lowered module holds; fails loudly if a lowering fails.
"""

import os
import sys
import tempfile

import flax.linen as nn
import jax
import numpy as np

from flax_encoder import sharding
from flax_encoder.inference import export_encoder
from tests import tiny
from train.run.step import abstract_state, make_train_step


def main() -> int:
  assert jax.device_count() == 4, jax.devices()
  config = tiny.get_config()
  config.model.update(dtype="bfloat16", attention_impl="xla")
  config.task.cross_document_attention = False
  config, task, tx, schedule = tiny.setup(config)
  mesh = sharding.make_mesh(data=2, fsdp=2)
  rows = jax.ShapeDtypeStruct((config.train.batch_size, config.train.seq_len), np.uint16,
                              sharding=sharding.batch_sharding(mesh))
  state = abstract_state(task, tx, config.train.seq_len, mesh)  # as the loop: outside the mesh
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.RULES):
    shardings = jax.tree.map(lambda x: x.sharding, state)
    step = jax.jit(make_train_step(task, tx, schedule, grad_accum_steps=2),
                   out_shardings=(shardings, None), donate_argnums=0)
    traced = step.trace(state, rows)
    for platform in ("tpu", "cuda"):
      text = traced.lower(lowering_platforms=(platform,)).as_text()
      found = {"mesh": 'sdy.mesh @mesh = <["data"=2, "fsdp"=2]>' in text,
               "batch over data x fsdp": '<@mesh, [{"data", "fsdp"}, {}]>' in text,
               "parameters over fsdp": '<@mesh, [{"fsdp"}, {}]>' in text,
               "bfloat16": "bf16" in text}
      print(f"train step lowered for {platform}: "
            + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in found.items()), flush=True)
  params = jax.eval_shape(lambda: task.init(jax.random.PRNGKey(0), config.train.seq_len))
  variables = {"params": jax.tree.map(lambda x: np.zeros(x.shape, x.dtype),
                                      nn.unbox(params)["encoder"])}
  with tempfile.TemporaryDirectory() as directory:
    path = os.path.join(directory, "encoder.jaxexport")
    exported = export_encoder(task.model.config, variables, path, config.train.seq_len,
                              platforms=("tpu", "cuda"))
    with open(path, "rb") as f:
      again = jax.export.deserialize(f.read())
  print(f"encoder exported for {','.join(exported.platforms)}: deserialized for "
        f"{','.join(again.platforms)}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
