"""A model's record and parameters in one file, for pipelines that only import the library.

    save_weights("encoder.msgpack", config, variables)
    config, variables = load_weights("encoder.msgpack")            # run as the file's defaults
    config, variables = load_weights("encoder.msgpack", dtype="bfloat16", attention_impl="xla")
    hidden = Encoder(config).apply(variables, tokens)

The file is Flax's msgpack serialization of {"format", "sha256", "contents"}: `contents` is
itself the serialization of {"config": what the model is (EncoderConfig.record()), "params",
...}, and `sha256` its digest, checked on reading, so a damaged file is refused rather than
loaded. How the model runs (compute dtype, attention kernel, remat, dropout) is the reader's
choice, never the file's. `python -m train.export --out
encoder.msgpack` writes one from a training run; a fine-tuned classifier's file (its head, its
tokenizer and classes too) is read by `flax_encoder.text_classifier`.
"""

from __future__ import annotations

import hashlib
import os

import flax.linen as nn
import jax
import numpy as np
from flax import serialization

from flax_encoder.config import EncoderConfig

ENCODER_FORMAT = "flax-encoder weights 1"
CLASSIFIER_FORMAT = "flax-encoder text classifier 1"


def write(path: str | os.PathLike, format_: str, config: EncoderConfig, params, **extra) -> None:
  """Writes a file of `format_`: the record of `config`, `params` (boxed or not, on any
  devices) and `extra` (msgpack-able values)."""
  params = jax.device_get(nn.unbox(params))
  contents = serialization.msgpack_serialize({"config": config.record(), "params": params,
                                              **extra})
  data = serialization.msgpack_serialize({
      "format": format_, "sha256": hashlib.sha256(contents).hexdigest(), "contents": contents})
  path = os.path.realpath(path)  # a link stays a link: its target is the file written
  if os.path.exists(path) and not os.path.isfile(path):
    with open(path, "wb") as f:  # a FIFO or a device (/dev/stdout): written in place, as a stream
      f.write(data)
    return
  tmp = f"{path}.tmp-{os.getpid()}"
  try:  # the file appears whole or not at all
    with open(tmp, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def read(path: str | os.PathLike, format_: str, **settings) -> tuple[EncoderConfig, dict, dict]:
  """(EncoderConfig run as `settings` say, params as numpy arrays, the whole file's dict) of a
  file of `format_`; ValueError naming the file for anything else."""
  name = os.fspath(path)
  with open(path, "rb") as f:
    data = f.read()
  what = {ENCODER_FORMAT: "an encoder weights file",
          CLASSIFIER_FORMAT: "a text classifier file"}.get(format_, format_)
  try:
    contents = serialization.msgpack_restore(data)
  except Exception as e:  # noqa: BLE001 - msgpack's errors name no file
    raise ValueError(f"{name!r} is not {what} ({type(e).__name__}: {e})") from None
  found = contents.get("format") if isinstance(contents, dict) else None
  if found != format_:
    raise ValueError(f"{name!r} is not {what}: its format is {found!r}, expected {format_!r}")
  if "contents" in contents:  # files written before the digest hold the contents unwrapped
    digest = hashlib.sha256(contents["contents"]).hexdigest()
    if digest != contents.get("sha256"):
      raise ValueError(f"{name!r} is damaged: its contents' SHA-256 is {digest}, the file "
                       f"records {contents.get('sha256')}")
    contents = serialization.msgpack_restore(contents["contents"])
  # A file may hold more fields than the record (how the run that wrote it ran): the reader's.
  record = {k: v for k, v in contents["config"].items() if k in EncoderConfig.record_fields()}
  config = EncoderConfig.from_record(record, **settings)
  return config, jax.tree.map(np.asarray, contents["params"]), contents


def save_weights(path: str | os.PathLike, config: EncoderConfig, variables) -> None:
  """Writes `config`'s record and the encoder's `variables` ({'params': …}) to `path`."""
  write(path, ENCODER_FORMAT, config, variables["params"])


def load_weights(path: str | os.PathLike, **settings) -> tuple[EncoderConfig, dict]:
  """(EncoderConfig, {'params': numpy arrays}) from a file `save_weights` wrote; `settings`
  are how it runs (EncoderConfig's training and execution fields: dtype, attention_impl, remat,
  dropout), the library's defaults where not given."""
  config, params, _ = read(path, ENCODER_FORMAT, **settings)
  return config, {"params": params}


def first_nonfinite(params) -> tuple[str, str] | None:
  """(path, 'NaN' or 'infinity') of the first floating array of `params` (numpy or jax, a
  path as 'encoder/layers_0/w_o/kernel') that holds one; None where every value is finite."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    if not jax.numpy.issubdtype(leaf.dtype, jax.numpy.inexact):
      continue
    xp = np if isinstance(leaf, np.ndarray) else jax.numpy  # a jax.Array is checked in place
    what = "NaN" if xp.isnan(leaf).any() else None if xp.isfinite(leaf).all() else "infinity"
    if what:
      return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path), what
  return None
