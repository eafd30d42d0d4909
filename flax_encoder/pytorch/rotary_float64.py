"""transformers' rotary BERTs (NomicBERT, GTE) computed in float64 throughout, for the float64
parity report (flax_encoder.pytorch.hf_parity's FLOAT64) and the tests. Needs torch and
transformers."""

from __future__ import annotations

import contextlib
import importlib

import torch


@contextlib.contextmanager
def rotary_in_float64(model_type: str, rotary: str):
  """Within it, the rotary embedding `rotary` of transformers' `model_type` model computes its
  angles in the model's dtype: it does so in float32 whatever the model's, so that a float64
  model is ~1e-8 off float64 maths. The maths are unchanged."""
  module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
  owner = getattr(module, rotary)

  def angles(self, x, position_ids):
    config = self.config
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    theta = config.rope_parameters["rope_theta"]
    inv_freq = theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    turned = position_ids[..., None].to(torch.float64) * inv_freq
    turned = torch.cat((turned, turned), dim=-1)
    return turned.cos().to(x.dtype), turned.sin().to(x.dtype)

  saved = owner.forward
  try:
    owner.forward = angles
    yield
  finally:
    owner.forward = saved
