"""The Flax encoder of a Hugging Face directory against transformers' own model of it, stage by
stage (`compare_hf`): the stages and any float64 patch are the family's
(flax_encoder.families), the comparison report.py's. `python -m flax_encoder.pytorch.parity
--hf DIR` prints it.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from flax_encoder import families
from flax_encoder.config import EncoderConfig
from flax_encoder.pytorch.report import Row, hooked, row, run_flax


def compare_hf(model, config: EncoderConfig, variables: dict, tokens: np.ndarray) -> list[Row]:
  """A transformers model against the Flax encoder `load_hf` reads from the same directory,
  stage by stage (the family's `stages`, then last_hidden_state), in config.dtype.

  Args:
    model: transformers' base model of the directory (`AutoModel.from_pretrained(dir,
      attn_implementation="eager")`: BertModel, RobertaModel, DistilBertModel …).
    config, variables: `load_hf(dir, scan_layers=False, …)`; config.dtype float32 or float64
      sets both sides' precision (float64 needs jax_enable_x64).
    tokens: int ids [batch, seq]; config.pad_id (the model's pad_token_id) is padding, and
      transformers gets attention_mask = tokens != pad_id.

  Returns:
    The rows in forward order, last_hidden_state last.
  """
  model_type = getattr(model.config, "model_type", None)
  family = families.MODEL_TYPES.get(model_type)
  if family is None:
    raise ValueError(f"model: a transformers {model_type!r} model, expected one of "
                     f"{sorted(families.MODEL_TYPES)}")
  if config.scan_layers:
    raise ValueError("config: scan_layers=True, expected False (load_hf(dir, "
                     "scan_layers=False)): the report reads each layer's output")
  model = model.to(torch.float64 if config.dtype == np.float64 else torch.float32).eval()
  points = family.stages(config.n_layers)
  modules = dict(model.named_modules())
  absent = [t for _, _, t in points if t not in modules]
  if absent:
    raise ValueError(f"model: a {type(model).__name__} without the modules {absent[:4]}, "
                     f"expected transformers' {model_type} names")
  # The Flax side first: it checks the tokens (ids, length) with errors that name them.
  output_flax, flax_value = run_flax(config, {"params": variables["params"]}, tokens)
  device = next(model.parameters()).device
  ids = torch.as_tensor(np.asarray(tokens), dtype=torch.int64, device=device)
  mask = (ids != config.pad_id).to(torch.int64)
  in_float64 = (family.float64() if family.float64 and config.dtype == np.float64
                else contextlib.nullcontext())
  with torch.no_grad(), in_float64:
    captured, output = hooked(modules, [t for _, _, t in points],
                              lambda: model(input_ids=ids, attention_mask=mask))
  rows = [row(name, flax_value(f), captured[t]) for name, f, t in points]
  rows.append(row("last_hidden_state", output_flax,
                  output.last_hidden_state.detach().cpu().numpy()))
  return rows


def base_model(transformers, path):
  """transformers' base model of the directory, eager attention, loaded without its load report
  and progress bar: a directory saved with a head (`*ForMaskedLM`) lists the head's weights as
  unexpected for the base model, which is all the report compares."""
  from transformers.utils import logging
  verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
  logging.set_verbosity_error()
  logging.disable_progress_bar()
  try:
    return transformers.AutoModel.from_pretrained(path, attn_implementation="eager")
  finally:
    logging.set_verbosity(verbosity)
    if bars:
      logging.enable_progress_bar()


@contextlib.contextmanager
def modernbert_in_float64():
  """Within it, transformers' ModernBERT turns queries and keys, and takes its eager softmax,
  in the model's dtype: it does both in float32 whatever the model's, so that a float64
  ModernBERT is ~1e-9 off float64 maths. The maths are unchanged. (The ModernBERT family's
  `float64`.)"""
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

  patched = ((module, "eager_attention_forward", attention),
             (module, "apply_rotary_pos_emb", rotary),
             (module.ModernBertRotaryEmbedding, "forward", angles))
  saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
  try:
    for owner, name, value in patched:
      setattr(owner, name, value)
    yield
  finally:
    for owner, name, value in saved:
      setattr(owner, name, value)
