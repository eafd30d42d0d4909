"""Logical axis names of the encoder's arrays and their mapping onto a device mesh.

Every parameter is created with `nn.with_logical_partitioning`, so its dimensions carry names
that say what they are ("embed", "mlp", "joined_kv", "vocab", "classes" for a classifier head,
"embed_factor" for the input of ALBERT's projection of its narrower embedding, and "layers"
when scanned), and the encoder constrains its activations to ("activation_batch",
"activation_length", "activation_embed"). `RULES` maps those names onto the axes of a
`jax.sharding.Mesh`; a new kind of parallelism is a change of rules, not of the model. For
example, tensor parallelism over a third mesh axis "tensor" is

    rules = (("mlp", "tensor"), ("joined_kv", "tensor"), *RULES)

The default mesh has two axes:
  data: batch rows split across devices, parameters replicated.
  fsdp: batch rows split as well, and parameters and optimizer state split along "embed"
    (gathered for each matmul by the compiler), so their memory is divided by the axis size.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp")
BATCH_AXES = ("data", "fsdp")  # batch rows are split over both

ACTIVATION_AXES = ("activation_batch", "activation_length", "activation_embed")

RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("activation_batch", BATCH_AXES),
    ("activation_length", None),
    ("activation_embed", None),
    ("embed", "fsdp"),
    ("vocab", None),
    ("classes", None),  # a classifier's outputs
    ("mlp", None),
    ("embed_factor", None),  # the embedding's width where it is not d_model's (ALBERT's)
    ("joined_kv", None),
    ("layers", None),
)


def make_mesh(data: int = -1, fsdp: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, fsdp) mesh over `devices` (default: all). -1 for one axis = the devices left over."""
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  sizes = {"data": data, "fsdp": fsdp}
  for name, size in sizes.items():
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not (
        size == -1 or size >= 1):
      raise ValueError(f"mesh.{name} must be a positive integer or -1, got {size!r}")
  if data == -1 and fsdp == -1:
    raise ValueError("at most one of mesh.data and mesh.fsdp may be -1")
  if data == -1 or fsdp == -1:
    known = fsdp if data == -1 else data
    if n % known:
      raise ValueError(f"mesh: {n} devices do not split into groups of {known}")
    sizes = {name: n // known if size == -1 else size for name, size in sizes.items()}
  if sizes["data"] * sizes["fsdp"] != n:
    raise ValueError(f"mesh.data * mesh.fsdp must equal the device count {n}, got "
                     f"data={sizes['data']}, fsdp={sizes['fsdp']}")
  return jax.make_mesh((sizes["data"], sizes["fsdp"]), MESH_AXES,
                       axis_types=(AxisType.Auto, AxisType.Auto), devices=devices)


def logical_shardings(abstract_tree, mesh: Mesh, rules=RULES):
  """NamedShardings for a tree of (possibly `nn.LogicallyPartitioned`) arrays or shapes.

  Unannotated leaves (a step counter, an rng key) are replicated. The result has the structure
  of the unboxed tree (`nn.unbox(abstract_tree)`).
  """
  specs = nn.get_partition_spec(abstract_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def abstract_arrays(init, mesh: Mesh, rules=RULES):
  """Shapes, dtypes and shardings on `mesh` of the (boxed) tree `init()` makes, allocating
  nothing: a target to restore a checkpoint onto `mesh`, or to lower a step for it."""
  boxed = jax.eval_shape(init)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      nn.unbox(boxed), logical_shardings(boxed, mesh, rules))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over the data and fsdp axes, the rest replicated."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def check_batch_divisible(batch_size: int, mesh: Mesh, name: str = "batch_size") -> None:
  shards = mesh.shape["data"] * mesh.shape["fsdp"]
  if batch_size % shards:
    raise ValueError(f"{name}={batch_size} must be divisible by mesh.data * mesh.fsdp = "
                     f"{shards} (each device holds an equal slice of the batch)")
