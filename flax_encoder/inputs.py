"""Checks on token ids: a bad id must raise, never gather a NaN or clamped row.

Flax's Embed returns NaN rows for out-of-range ids and a plain gather clamps them, so values
are checked on the host whenever they are concrete. Under a caller's jit the values are
tracers; there the check is a `checkify.debug_check`, which `checked_apply` around the
caller's function turns on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

def check_token_shape(tokens: Any, max_len: int) -> None:
  """Raises unless `tokens` is a 2-D integer array no longer than `max_len`."""
  dtype = getattr(tokens, "dtype", None)
  if dtype is None or not hasattr(tokens, "shape"):
    raise TypeError(
        f"tokens must be an integer array of shape [batch, seq], got {type(tokens).__name__}")
  if not jnp.issubdtype(dtype, jnp.integer):
    raise TypeError(f"tokens must hold integer ids, got dtype {dtype}")
  if tokens.ndim != 2:
    raise ValueError(f"tokens must be 2-D [batch, seq], got shape {tuple(tokens.shape)}")
  if tokens.shape[1] > max_len:
    raise ValueError(
        f"tokens have sequence length {tokens.shape[1]}, longer than max_len={max_len} "
        f"(the positional-encoding table); truncate the input or raise EncoderConfig.max_len")


def _out_of_range_message(vocab_size: int) -> str:
  return f"tokens must lie in [0, vocab_size={vocab_size})"


def check_token_values(tokens: Any, vocab_size: int, traced: bool = True) -> None:
  """Raises ValueError naming the first id outside [0, vocab_size).

  Concrete arrays are checked on the host. Traced values (inside jit) get a
  `checkify.debug_check`, which is a no-op unless the caller runs under `checkify`
  (see `checked_apply`); `traced=False` leaves traced values unchecked (for `jax.export`,
  which cannot serialize that check).
  """
  if isinstance(tokens, jax.core.Tracer):
    if not traced:
      return
    in_range = jnp.all((tokens >= 0) & (tokens < vocab_size))
    checkify.debug_check(in_range, _out_of_range_message(vocab_size) + "; got an id outside it")
    return
  values = np.asarray(tokens)
  bad = (values < 0) | (values >= vocab_size)
  if bad.any():
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    raise ValueError(
        f"{_out_of_range_message(vocab_size)}; got {int(values[where])} at index {where} "
        f"({int(bad.sum())} ids out of range, min {int(values.min())}, max {int(values.max())})")


def checked_apply(fn: Callable, **jit_kwargs) -> Callable:
  """jit-compiles `fn` with the token checks of every encoder call inside it kept: a bad id
  raises ValueError after the call.

  `fn` is `Encoder(config).apply`, or any function of yours that calls it, jitted or not (a
  training step, a pipeline): wrap the outermost one, as `checkify` wants. The result takes
  the same arguments and returns what `fn` returns. Checking costs one device-to-host
  transfer of a flag per call. Called inside a trace (your own `jax.jit`, `grad`, `scan`) it
  cannot raise, and says so: wrap that function instead.
  """
  checked = jax.jit(checkify.checkify(fn, errors=checkify.user_checks), **jit_kwargs)

  def run(*args, **kwargs):
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs))):
      raise TypeError(
          "checked_apply(fn) was called inside a traced function (jax.jit, grad, scan, ...), "
          "where it cannot raise; expected it around the outermost one: "
          "checked_apply(your_function) keeps the checks of every encoder call inside it")
    error, out = checked(*args, **kwargs)
    error.throw()
    return out

  return run


def _check_ids(name: str, value: Any, shape: tuple[int, int], limit: int | None = None,
               bound: str = "") -> None:
  """Raises unless `value` is an integer array of the tokens' `shape` and, given a `limit`
  (named `bound`), its concrete values lie in [0, limit); a traced one is checked for shape
  only."""
  dtype = getattr(value, "dtype", None)
  if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
    raise TypeError(f"{name} must be an integer array of the tokens' shape {list(shape)}, got "
                    f"{type(value).__name__} of dtype {dtype}")
  if tuple(value.shape) != tuple(shape):
    raise ValueError(f"{name} has shape {list(value.shape)}, expected the tokens' "
                     f"{list(shape)}")
  if limit is not None and not isinstance(value, jax.core.Tracer):
    values = np.asarray(value)
    if values.size and (values.min() < 0 or values.max() >= limit):
      raise ValueError(f"{name} must lie in [0, {bound}={limit}), got min "
                       f"{int(values.min())}, max {int(values.max())}")


def check_packing(segment_ids: Any, positions: Any, shape: tuple[int, int], max_len: int) -> None:
  """Raises unless `segment_ids` and `positions` (each optional) are integer arrays of the
  tokens' `shape`, and concrete positions lie in [0, max_len)."""
  if segment_ids is not None:
    _check_ids("segment_ids", segment_ids, shape)
  if positions is not None:
    _check_ids("positions", positions, shape, max_len, "max_len")


def check_token_types(token_types: Any, shape: tuple[int, int], type_vocab_size: int) -> None:
  """Raises unless `token_types` is None or an integer array of the tokens' `shape` whose
  concrete values lie in [0, type_vocab_size) (0 when the model has no token types: then
  only None is taken)."""
  if token_types is None:
    return
  if not type_vocab_size:
    raise ValueError("token_types given to a model without token-type embeddings "
                     "(EncoderConfig.type_vocab_size=0)")
  _check_ids("token_types", token_types, shape, type_vocab_size, "type_vocab_size")
