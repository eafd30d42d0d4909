"""T5's relative position bias, as MPNet has it ("Exploring the Limits of Transfer Learning with
a Unified Text-to-Text Transformer", Raffel et al. 2020, section 2.1; MPNet, Song et al. 2020):
a learned score per head for each bucket of key position - query position, both directions,
the first quarter of the buckets one distance each and the rest log-spaced to a distance of
128. It is computed once from the positions (a packed row's: each segment's own) and every
layer adds the same to its scores.

`EncoderConfig.relative_attention = "t5_bias,buckets=32"` (flax_encoder.relative finds this
module by the name): `buckets` is transformers' relative_attention_num_buckets. The table
[buckets, heads] is the encoder's params["relative_attention_bias"]["embedding"], where MPNet's
checkpoints have kept it since the bias was a field of its own (relative_attention_buckets).

Shapes: b = batch, q = query positions, k = key positions, h = heads.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder.families.part_spec import read_spec

# T5's and MPNet's: distances from this on share one direction's farthest bucket.
MAX_DISTANCE = 128


@functools.cache
def _distance_buckets(half: int) -> np.ndarray:
  """The bucket of each distance d = 0 … MAX_DISTANCE among one direction's `half` buckets, as
  T5 has it: the first `exact` = half // 2 distances one bucket each, then bucket exact +
  floor(spread * log(d / exact) / log(max / exact)), at most half - 1. The floor is found by
  comparing powers of integers, so no rounding of the logarithms moves a distance on a
  boundary (16, 32, 64 with 32 buckets) to the bucket below."""
  exact, spread, far = half // 2, half - half // 2, MAX_DISTANCE
  buckets = list(range(exact))
  for d in range(exact, far + 1):
    k = 0  # the largest k < spread with (far / exact)^k <= (d / exact)^spread
    while k + 1 < spread and far**(k + 1) * exact**spread <= d**spread * exact**(k + 1):
      k += 1
    buckets.append(exact + k)
  return np.asarray(buckets, np.int32)


def relative_buckets(relative: jax.Array, buckets: int) -> jax.Array:
  """T5's bidirectional bucket (MPNet's) of each relative position, key - query: keys before
  the query in [0, buckets / 2), keys after it in [buckets / 2, buckets)."""
  half = buckets // 2
  distance = jnp.minimum(jnp.abs(relative), MAX_DISTANCE)
  return jnp.where(relative > 0, half, 0) + jnp.asarray(_distance_buckets(half))[distance]


@dataclasses.dataclass(frozen=True)
class Part:
  """The settings of a T5 relative position bias (its spec's)."""
  buckets: int = 32
  # Where its table sits among the encoder's params: transformers' MPNet's name.
  scope: ClassVar[str] = "relative_attention_bias"

  @classmethod
  def parse(cls, spec: str) -> Part:
    """The Part of "t5_bias[,buckets=N]"; ValueError saying what was expected."""
    expected = ("'t5_bias' then ',buckets=N', N even from 4 to 510 (T5's buckets: a quarter "
                f"of them one distance each, below the distance {MAX_DISTANCE} where the rest "
                f"end)")
    settings = read_spec(spec, "t5_bias", {"buckets": int})
    if settings is None:
      raise ValueError(expected)
    part = cls(**settings)
    if part.buckets % 2 or not 4 <= part.buckets <= 510:
      raise ValueError(expected)
    return part

  def spec(self) -> str:
    return f"t5_bias,buckets={self.buckets}"

  def shared(self, cfg, name: str) -> nn.Module:
    return Bias(cfg, self, name=name)

  def scores(self, cfg, q, k, w_q, w_k, state, deterministic):
    """(the bias [b or 1, h, q, k] the encoder computed, q as it was): every layer adds the
    same bias, and the scores keep the kernel's 1/sqrt(head_dim)."""
    return state, q


class Bias(nn.Module):
  """The table of a score per bucket and head, and the bias it gives every layer's scores."""

  config: object
  part: Part

  @nn.compact
  def __call__(self, positions: jax.Array | None, seq: int) -> jax.Array:
    """positions: int [b, seq], each token's position in its sequence (default: its index, as
    transformers' MPNet has it, padding or not) -> the bias [b or 1, h, q, k] in the config's
    dtype."""
    cfg = self.config
    table = self.param("embedding", nn.with_logical_partitioning(
        nn.initializers.normal(stddev=0.02), (None, None)), (self.part.buckets, cfg.n_heads),
                       cfg.param_dtype)
    if positions is None:
      positions = jnp.arange(seq)[None]
    relative = positions[:, None, :] - positions[:, :, None]  # [b, q, k]
    bias = jnp.asarray(table, cfg.dtype)[relative_buckets(relative, self.part.buckets)]
    return jnp.transpose(bias, (0, 3, 1, 2))  # [b, q, k, h] -> [b, h, q, k]
