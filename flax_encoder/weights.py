"""An encoder's config and parameters in one file, for pipelines that only import the library.

    save_weights("encoder.msgpack", config, variables)
    config, variables = load_weights("encoder.msgpack")
    hidden = Encoder(config).apply(variables, tokens)

The file is Flax's msgpack serialization of {"config": EncoderConfig fields, "params": ...};
`python -m train.export --out encoder.msgpack` writes one from a training run.
"""

from __future__ import annotations

import dataclasses
import os

import flax.linen as nn
import jax
import numpy as np
from flax import serialization

from flax_encoder.config import EncoderConfig

_FORMAT = "flax-encoder weights 1"


def save_weights(path: str | os.PathLike, config: EncoderConfig, variables) -> None:
  """Writes `config` and the encoder's `variables` ({'params': …}, boxed or not) to `path`."""
  fields = dataclasses.asdict(config)
  fields["dtype"], fields["param_dtype"] = config.dtype.name, config.param_dtype.name
  params = jax.device_get(nn.unbox(variables)["params"])
  data = serialization.msgpack_serialize({"format": _FORMAT, "config": fields,
                                          "params": params})
  with open(path, "wb") as f:
    f.write(data)


def load_weights(path: str | os.PathLike) -> tuple[EncoderConfig, dict]:
  """(EncoderConfig, {'params': numpy arrays}) from a file `save_weights` wrote."""
  with open(path, "rb") as f:
    data = f.read()
  try:
    record = serialization.msgpack_restore(data)
  except Exception as e:  # noqa: BLE001 - msgpack's errors name no file
    raise ValueError(f"{os.fspath(path)!r} is not an encoder weights file ({type(e).__name__}: "
                     f"{e})") from None
  if not isinstance(record, dict) or record.get("format") != _FORMAT:
    raise ValueError(f"{os.fspath(path)!r} is not an encoder weights file: expected format "
                     f"{_FORMAT!r}")
  params = jax.tree.map(np.asarray, record["params"])
  return EncoderConfig(**record["config"]), {"params": params}
