"""jit inference for pipelines: bucketed encoding that compiles once per shape bucket, and
`jax.export` of the encoder to a self-contained file.

    encode = BucketedEncoder(config, variables)
    hidden = encode(tokens)  # numpy or jax int ids [batch, seq] -> [batch, seq, d_model]

    export_encoder(config, variables, "encoder.jaxexport", seq_len=128)
    # anywhere with jax, no flax_encoder needed:
    exported = jax.export.deserialize(open("encoder.jaxexport", "rb").read())
    hidden = exported.call(tokens)  # int32 [any batch, 128]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder.config import EncoderConfig
from flax_encoder.encoder import Encoder
from flax_encoder.inputs import check_packing, check_token_shape, check_token_values
from flax_encoder.kernels import KERNELS

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512)


def default_buckets(config: EncoderConfig, longest: int) -> list[int]:
  """DEFAULT_BUCKETS below `longest`, then `longest`: those of them the attention kernel of
  `config` takes (the Pallas kernels take lengths of whole blocks only)."""
  kernel = KERNELS[config.attention_impl]
  kernel.check_length(longest)  # the longest must fit: a ValueError
  return [b for b in DEFAULT_BUCKETS if b < longest and kernel.takes_length(b)] + [longest]


def padded_batches(rows: Sequence[np.ndarray], buckets: Sequence[int], batch_size: int,
                   pad_id: int) -> Iterator[tuple[list[int], np.ndarray]]:
  """Rows of ids (of any length up to the largest of `buckets`) in batches of a few shapes:
  (the rows' indices, int32 ids [batch_size, bucket]), each row padded with `pad_id` to the
  smallest bucket that holds it and the last batch of a bucket filled up with padding rows,
  so that a jitted model compiles once per bucket."""
  by_bucket = {}
  for i, row in enumerate(rows):
    by_bucket.setdefault(next(b for b in buckets if len(row) <= b), []).append(i)
  for bucket, indices in sorted(by_bucket.items()):
    for start in range(0, len(indices), batch_size):
      batch = indices[start:start + batch_size]
      ids = np.full((batch_size, bucket), pad_id, np.int32)
      for j, i in enumerate(batch):
        ids[j, :len(rows[i])] = rows[i]
      yield batch, ids


class BucketedEncoder:
  """`Encoder(config).apply` under jit, with inputs right-padded to a few shapes.

  The sequence length is padded with `pad_id` up to the smallest of `buckets` that holds it,
  and the batch up to a multiple of `batch_multiple`. Attention masks the padding out, so real
  positions come out as without it (a row that is all padding has no real positions; its
  output, an average over all of them, is meaningless either way). A stream of batches of any
  length then compiles at most once per bucket and batch multiple, instead of once per
  distinct shape. Token ids are checked on the host before anything runs; a bad id raises
  ValueError.
  """

  def __init__(self, config: EncoderConfig, variables, buckets: Sequence[int] | None = None,
               batch_multiple: int = 8):
    if buckets is None:
      buckets = default_buckets(config, config.max_len)
    buckets = sorted(set(buckets))
    for b in buckets:
      if not 0 < b <= config.max_len:
        raise ValueError(f"buckets must lie in [1, max_len={config.max_len}], got {b}")
      KERNELS[config.attention_impl].check_length(b)
    if batch_multiple < 1:
      raise ValueError(f"batch_multiple must be >= 1, got {batch_multiple}")
    self.config = config
    self.buckets = tuple(buckets)
    self.batch_multiple = batch_multiple
    self.variables = jax.device_put(variables)
    self._jitted = jax.jit(self._forward)

  def _forward(self, variables, tokens, segment_ids, positions):
    # checked on the host in __call__: a traced check would only cost the fast dispatch path
    return Encoder(self.config, check_traced_ids=False).apply(
        variables, tokens, segment_ids=segment_ids, positions=positions)

  def bucket(self, seq: int) -> int:
    """The padded length for inputs of length `seq`."""
    for b in self.buckets:
      if seq <= b:
        return b
    raise ValueError(f"tokens have sequence length {seq}, longer than the largest bucket "
                     f"{self.buckets[-1]}; truncate the input or add a bucket <= max_len="
                     f"{self.config.max_len}")

  def __call__(self, tokens, segment_ids=None, positions=None) -> jax.Array:
    """int ids [batch, seq] -> [batch, seq, d_model] in config.dtype. `segment_ids` and
    `positions` ([batch, seq] each, optional) as in `Encoder`: for packed rows."""
    tokens = np.asarray(tokens)
    check_token_shape(tokens, self.config.max_len)
    check_token_values(tokens, self.config.vocab_size)
    check_packing(segment_ids, positions, tokens.shape, self.config.max_len)
    batch, seq = tokens.shape
    padded_batch = -(-batch // self.batch_multiple) * self.batch_multiple

    def pad(x, fill):  # padding is segment 0 at position 0
      if x is None:
        return None
      padded = np.full((padded_batch, self.bucket(seq)), fill, np.int32)
      padded[:batch, :seq] = x
      return padded

    return self._jitted(self.variables, pad(tokens, self.config.pad_id), pad(segment_ids, 0),
                        pad(positions, 0))[:batch, :seq]


def export_encoder(config: EncoderConfig, variables, path: str, seq_len: int,
                   platforms: Sequence[str] = ("cpu", "cuda"),
                   packed: bool = False) -> jax.export.Exported:
  """Serializes the encoder with its weights to `path` via `jax.export`.

  The file holds StableHLO for `platforms` and the weights as constants: it takes int32 ids
  [batch, seq_len] for any batch and returns [batch, seq_len, d_model]. Pad shorter inputs with
  `pad_id`. Loading needs only jax: `jax.export.deserialize(data).call(tokens)`. With
  `packed`, it takes `(tokens, segment_ids, positions)`, int32 [batch, seq_len] each, as
  `Encoder` does for rows that pack several sequences.

  An exported function cannot raise, so a row holding an id outside [0, vocab_size) comes
  back as all NaN rather than as a plausible but wrong encoding; check ids before the call.
  """
  if not 0 < seq_len <= config.max_len:
    raise ValueError(f"seq_len must lie in [1, max_len={config.max_len}], got {seq_len}")
  variables = jax.tree.map(jnp.asarray, variables)

  def apply(tokens, segment_ids=None, positions=None):
    # The ids are guarded below instead: an exported program cannot raise.
    hidden = Encoder(config, check_traced_ids=False).apply(
        variables, tokens, segment_ids=segment_ids, positions=positions)
    row_ok = jnp.all((tokens >= 0) & (tokens < config.vocab_size), axis=1)
    return jnp.where(row_ok[:, None, None], hidden, jnp.nan).astype(hidden.dtype)

  batch = jax.export.symbolic_shape("batch")[0]
  spec = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
  specs = (spec, spec, spec) if packed else (spec,)
  exported = jax.export.export(jax.jit(apply), platforms=tuple(platforms))(*specs)
  with open(path, "wb") as f:
    f.write(exported.serialize())
  return exported
