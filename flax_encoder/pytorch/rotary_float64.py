"""transformers' rotary encoders (NomicBERT, GTE, Jina v3, EuroBERT) and DeBERTa computed in
float64 throughout, for the float64 parity report (flax_encoder.pytorch.hf_parity's FLOAT64) and
the tests. Needs torch and transformers."""

from __future__ import annotations

import contextlib
import importlib

import torch


@contextlib.contextmanager
def patched(*changes):
  """Within it, each (owner, name, value) of `changes` has owner.name = value; as before after."""
  saved = [(owner, name, getattr(owner, name)) for owner, name, _ in changes]
  try:
    for owner, name, value in changes:
      setattr(owner, name, value)
    yield
  finally:
    for owner, name, value in saved:
      setattr(owner, name, value)


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

  with patched((owner, "forward", angles)):
    yield


@contextlib.contextmanager
def eurobert_in_float64():
  """Within it, transformers' EuroBERT computes its rotary angles, its RMSNorm and its eager
  softmax in the model's dtype (it does all three in float32 whatever the model's)."""
  from transformers.models.eurobert import modeling_eurobert as module

  def rms_norm(self, x):
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * x

  def attention(self, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    key = module.repeat_kv(key, self.num_key_value_groups)
    value = module.repeat_kv(value, self.num_key_value_groups)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
      weights = weights + attention_mask
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

  with patched((module.EuroBertRMSNorm, "forward", rms_norm),
               (module, "eager_attention_forward", attention)), rotary_in_float64(
                   "eurobert", "EuroBertRotaryEmbedding"):
    yield


@contextlib.contextmanager
def deberta_in_float64():
  """Within it, transformers' DeBERTa v2 scales its scores by sqrt(head_dim · factor) in the
  model's dtype (it rounds that scale to float32 whatever the model's)."""
  from transformers.models.deberta_v2 import modeling_deberta_v2 as module

  def scale(query_layer, scale_factor):
    return torch.sqrt(torch.tensor(query_layer.size(-1), dtype=query_layer.dtype) *
                      scale_factor)

  with patched((module, "scaled_size_sqrt", scale)):
    yield
