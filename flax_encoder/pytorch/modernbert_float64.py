"""transformers' ModernBERT computed in float64 throughout, for the float64 parity report
(flax_encoder.pytorch.hf_parity's FLOAT64) and the tests. Needs torch and transformers."""

from __future__ import annotations

import contextlib

import torch

from flax_encoder.pytorch.rotary_float64 import patched


@contextlib.contextmanager
def modernbert_in_float64():
  """Within it, transformers' ModernBERT turns queries and keys, and takes its eager softmax,
  in the model's dtype: it does both in float32 whatever the model's, so that a float64
  ModernBERT is ~1e-9 off float64 maths. The maths are unchanged."""
  from transformers.models.modernbert import modeling_modernbert as module

  def attention(_, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
      weights = weights + attention_mask
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

  def rotary(q, k, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    turn = lambda x: x * cos + module.rotate_half(x) * sin
    return turn(q), turn(k)

  def angles(self, x, position_ids, layer_type):
    theta = self.config.rope_parameters[layer_type]["rope_theta"]
    dim = self.config.hidden_size // self.config.num_attention_heads
    inv_freq = theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    turned = position_ids[..., None].to(torch.float64) * inv_freq
    turned = torch.cat((turned, turned), dim=-1)
    return turned.cos().to(x.dtype), turned.sin().to(x.dtype)

  with patched((module, "eager_attention_forward", attention),
               (module, "apply_rotary_pos_emb", rotary),
               (module.ModernBertRotaryEmbedding, "forward", angles)):
    yield
