"""Embeddings that are not finite (NaN or inf), counted as they are made: what train.embed
says of them, or the error it stops with."""

from __future__ import annotations

import json

import numpy as np

from train.errors import RunError

_SHOWN = 5  # ids of texts whose embeddings are not finite that a message names


class NonFinite:
  """The texts whose embeddings are not finite, counted a chunk at a time: the first ids."""

  def __init__(self):
    self.count, self.ids = 0, []

  def add(self, ids, vectors: np.ndarray) -> bool:
    """Counts the rows of `vectors` that are not finite; whether this chunk has one."""
    bad = np.flatnonzero(~np.isfinite(vectors).all(axis=1))
    self.count += len(bad)
    self.ids += [ids[i] for i in bad[:_SHOWN - len(self.ids)]]
    return len(bad) > 0

  def said(self, read: int) -> str:
    shown = ", ".join(json.dumps(i, default=str) for i in self.ids)
    more = f" and {self.count - len(self.ids)} more" if self.count > len(self.ids) else ""
    return f"the embeddings of {self.count} of {read} texts (ids {shown}{more})"

  def error(self, model: str, params, read: int, total: int) -> RunError:
    """A broken model's parameters are what was asked (exit 2); where they are all finite,
    the computation overflowed (bfloat16, say): the run failed, not the request (exit 1)."""
    so_far = " read so far" if read < total else ""
    from flax_encoder.weights import first_nonfinite
    where = (first_nonfinite(params) or (None,))[0]
    cause = (f"the model's parameter {where} holds NaN or inf" if where else
             "the model's parameters are finite (an overflow: try --dtype float32)")
    return RunError(f"--model {model}: {self.said(read)}{so_far} are not finite; {cause}; "
                    f"nothing written (--allow-nonfinite writes them)", 2 if where else 1)
