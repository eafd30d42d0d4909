"""From the config as given and the data to the typed values a run is built from.

The ConfigDict from the command line is read, never written back: what the run derives (the
vocabulary from the data, the encoder's config) is returned here as a value and passed to
whoever needs it, so no function depends on another having run first.
"""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np

from flax_encoder import EncoderConfig
from train.tokens import PAD_ID


def encoder_config(model: ml_collections.ConfigDict, vocab_size: int, source: str,
                   seq_len: int) -> EncoderConfig:
  """config.model with the data's vocabulary -> EncoderConfig.

  An explicit config.model.vocab_size must agree with the data's (`source` names it), and the
  windows (`seq_len`) must fit the positional table.
  """
  fields = model.to_dict()
  given = fields.pop("vocab_size", None)
  if given is not None and given != vocab_size:
    raise ValueError(f"config.model.vocab_size={given} disagrees with the data: {source} has a "
                     f"vocabulary of {vocab_size}; leave it unset to take the data's")
  cfg = EncoderConfig(vocab_size=vocab_size, pad_id=PAD_ID, **fields)
  if seq_len > cfg.max_len:
    raise ValueError(f"config.train.seq_len={seq_len} exceeds config.model.max_len="
                     f"{cfg.max_len}")
  return cfg


def encoder_record(cfg: EncoderConfig) -> dict:
  """An EncoderConfig as JSON-able fields (dtypes by name); EncoderConfig(**record) rebuilds it."""
  fields = dataclasses.asdict(cfg)
  return {k: np.dtype(v).name if k in ("dtype", "param_dtype") else v for k, v in fields.items()}
