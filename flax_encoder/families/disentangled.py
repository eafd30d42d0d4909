"""DeBERTa's disentangled attention ("DeBERTa: Decoding-enhanced BERT with Disentangled
Attention", He et al. 2021; v2 and v3's form): besides the content-to-content scores q·k, each
head scores the query's content against the key's relative position (c2p) and the key's
content against the query's (p2c), through a table of relative-position embeddings shared by
every layer and projected by each layer's own query and key projections. Distances are
bucketed logarithmically past half the buckets. All scores are scaled by
1/sqrt(head_dim · (1 + the kinds of position scores)).

`EncoderConfig.relative_attention = "disentangled,buckets=256,max_relative=512,types=c2p|p2c,
norm=layer_norm"` (flax_encoder.relative finds this module by the name): `buckets` are
transformers' position_buckets (0: every distance up to `max_relative` its own),
`max_relative` its max_relative_positions, `types` its pos_att_type, `norm` its norm_rel_ebd
("layer_norm" or "none"). The table and its LayerNorm are the encoder's
params["relative_attention"] ("rel_embeddings", "norm")."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder.dropout import Dropout
from flax_encoder.families.part_spec import read_spec
from flax_encoder.norm import layer_norm

TYPES = ("c2p", "p2c")
NORMS = ("layer_norm", "none")


def log_buckets(distance: np.ndarray, buckets: int, max_relative: int) -> np.ndarray:
  """transformers' make_log_bucket_position, in float32 as it computes it: distances within
  half the buckets are their own; beyond, log-spaced up to max_relative, signed."""
  distance = np.asarray(distance, np.int64)
  mid = buckets // 2
  near = (distance < mid) & (distance > -mid)
  far = np.where(near, mid - 1, np.abs(distance)).astype(np.float32)
  with np.errstate(divide="ignore"):
    spread = np.log(far / np.float32(mid)) / np.log(np.float32((max_relative - 1) / mid))
  log_pos = np.ceil(spread * np.float32(mid - 1)) + mid
  return np.where(np.abs(distance) <= mid, distance, log_pos.astype(np.int64) * np.sign(distance))


@dataclasses.dataclass(frozen=True)
class Part:
  """The settings of a disentangled attention (its spec's)."""
  buckets: int = 256
  max_relative: int = 512
  types: tuple[str, ...] = TYPES
  norm: str = "layer_norm"
  # Where its table and norm sit among the encoder's params.
  scope: ClassVar[str] = "relative_attention"

  @classmethod
  def parse(cls, spec: str) -> Part:
    """The Part of "disentangled[,key=value…]"; ValueError saying what was expected."""
    expected = ("'disentangled' then ',buckets=N' (N >= 0, even), ',max_relative=N' (N >= 2), "
                f"',types=' some of {'|'.join(TYPES)}, ',norm=' one of {'|'.join(NORMS)}")
    settings = read_spec(spec, "disentangled", {"buckets": int, "max_relative": int, "norm": str,
                                                "types": lambda v: tuple(v.split("|"))})
    if settings is None:
      raise ValueError(expected)
    part = cls(**settings)
    if (part.buckets < 0 or part.buckets % 2
        or part.max_relative < 2 or not set(part.types) <= set(TYPES)
        or len(set(part.types)) != len(part.types) or part.norm not in NORMS):
      raise ValueError(expected)
    return part

  def spec(self) -> str:
    return (f"disentangled,buckets={self.buckets},max_relative={self.max_relative},"
            f"types={'|'.join(t for t in TYPES if t in self.types)},norm={self.norm}")

  @property
  def span(self) -> int:
    """The distances each side of 0 the table holds: its rows are 2 · span."""
    return self.buckets if self.buckets > 0 else self.max_relative

  def rows(self, seq: int) -> np.ndarray:
    """int32 [2 seq - 1]: the table's row of each distance from -(seq - 1) to seq - 1."""
    distances = np.arange(-(seq - 1), seq)
    rows = distances if self.buckets <= 0 else log_buckets(distances, self.buckets,
                                                           self.max_relative)
    return np.clip(rows + self.span, 0, 2 * self.span - 1).astype(np.int32)

  def shared(self, cfg, name: str) -> nn.Module:
    return Shared(cfg, self, name=name)

  def scores(self, cfg, q, k, w_q, w_k, state, deterministic):
    """(bias [batch, heads, q, k], q scaled for the kernel's 1/sqrt(head_dim)) of one layer:
    its c2p and p2c scores through its own projections `w_q`, `w_k` of the shared table.

    The distance of two tokens is their offset in the row, as transformers takes it (a packed
    row's segments are runs of consecutive tokens, so within one it is their positions'
    difference). Each score is a product with the table's row of a distance: the rows are
    taken once per distance (2 seq - 1 of them, a gather of the small table), multiplied with
    every query or key, and each pair's read off by a skew of the product (`_skew`: slices and
    reshapes, no gather of [batch, heads, q, k] indices)."""
    table = Dropout(cfg.dropout)(state["table"], deterministic=deterministic)
    batch, seq, heads, head_dim = q.shape
    rows = jnp.asarray(self.rows(seq))  # distance -(seq - 1) … seq - 1
    factor = 1 + len(self.types)
    bias = 0.0
    if "c2p" in self.types:  # query i against the row of distance i - j, far end first
      keys = w_k(table[rows[::-1]]).reshape(2 * seq - 1, heads, head_dim)
      bias = bias + _skew(jnp.einsum("bqhd,mhd->bhqm", q, keys))
    if "p2c" in self.types:  # key j against the row of distance i - j, near end first
      queries = w_q(table[rows]).reshape(2 * seq - 1, heads, head_dim)
      bias = bias + jnp.swapaxes(_skew(jnp.einsum("bkhd,mhd->bhkm", k, queries)), -1, -2)
    scale = math.sqrt(head_dim * factor)
    return bias / jnp.asarray(scale, q.dtype), q / jnp.asarray(math.sqrt(factor), q.dtype)


def _skew(x: jax.Array) -> jax.Array:
  """[..., n, 2n - 1] -> [..., n, n]: y[a, b] = x[a, n - 1 - a + b], by reading x's rows
  flat with a stride one shorter than theirs (Transformer-XL's relative shift)."""
  n = x.shape[-2]
  if n == 1:  # one token: its distance to itself
    return x
  flat = x.reshape(*x.shape[:-2], n * (2 * n - 1))[..., n - 1:n - 1 + n * (2 * n - 2)]
  return flat.reshape(*x.shape[:-2], n, 2 * n - 2)[..., :n]


class Shared(nn.Module):
  """The table of relative-position embeddings, normalised as `part.norm` says: what every
  layer's attention reads."""

  config: object
  part: Part

  @nn.compact
  def __call__(self, positions: jax.Array | None, seq: int) -> dict:
    cfg, part = self.config, self.part
    rows = nn.Embed(2 * part.span, cfg.d_model, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                    embedding_init=nn.with_logical_partitioning(
                        nn.initializers.normal(stddev=0.02), (None, "embed")),
                    name="rel_embeddings")
    table = jnp.asarray(rows.embedding, cfg.dtype)
    if part.norm == "layer_norm":
      table = layer_norm(cfg, "norm")(table)
    return {"table": table}
