"""The Flax encoder of a Hugging Face directory against transformers' own model of it, stage by
stage (`compare_hf`): the stages are the family's (flax_encoder.families), the comparison
report.py's, the patches that make a transformers model compute in float64 this module's
(`FLOAT64`). `python -m flax_encoder.pytorch.parity
--hf DIR` prints it.
"""

from __future__ import annotations

import collections
import contextlib
import functools

import numpy as np
import torch

from flax_encoder import families
from flax_encoder.config import EncoderConfig
from flax_encoder.masks import text_tokens
from flax_encoder.pytorch.modernbert_float64 import modernbert_in_float64
from flax_encoder.pytorch.report import Row, row, run_flax
from flax_encoder.pytorch.rotary_float64 import (deberta_in_float64, eurobert_in_float64,
                                                  rotary_in_float64)

# family name -> a context within which transformers' model of it computes in float64 where
# it otherwise keeps float32 (only the maths' dtype changes)
FLOAT64 = {"modernbert": modernbert_in_float64,
           "nomic_bert": functools.partial(rotary_in_float64, "nomic_bert",
                                           "NomicBertRotaryEmbedding"),
           "gte": functools.partial(rotary_in_float64, "gte", "GteRotaryEmbedding"),
           "jina_embeddings_v3": functools.partial(rotary_in_float64, "jina_embeddings_v3",
                                                   "JinaEmbeddingsV3RotaryEmbedding"),
           "eurobert": eurobert_in_float64, "deberta-v2": deberta_in_float64}


def compare_hf(model, config: EncoderConfig, variables: dict, tokens: np.ndarray) -> list[Row]:
  """A transformers model against the Flax encoder `load_hf` reads from the same directory,
  stage by stage (the family's `stages`, then last_hidden_state), in config.dtype.

  Args:
    model: transformers' base model of the directory (`AutoModel.from_pretrained(dir,
      attn_implementation="eager")`: BertModel, RobertaModel, DistilBertModel …).
    config, variables: `load_hf(dir, scan_layers=False, …)`; config.dtype float32 or float64
      sets both sides' precision (float64 needs jax_enable_x64).
    tokens: int ids [batch, seq]; the run of config.pad_id (the model's pad_token_id) that
      ends a row is padding (`masks.text_tokens`), transformers' attention_mask 0.

  Returns:
    The rows in forward order, last_hidden_state last, each compared at the real tokens.
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
  real = np.array(text_tokens(np.asarray(tokens), config.pad_id))  # writable, as torch wants
  mask = torch.as_tensor(real, dtype=torch.int64, device=device)
  in_float64 = (FLOAT64[family.name]() if family.name in FLOAT64 and config.dtype == np.float64
                else contextlib.nullcontext())
  with torch.no_grad(), in_float64:
    calls, output = _every_call(modules, {t for _, _, t in points},
                                lambda: model(input_ids=ids, attention_mask=mask))
  seen: collections.Counter = collections.Counter()  # a module's stages so far: its next call
  # Compared at the real tokens: what a padding position holds is no one's (DeBERTa zeroes its
  # embeddings there, the others do not).
  rows = []
  for name, f, t in points:
    rows.append(row(name, flax_value(f), calls[t][seen[t]], real))
    seen[t] += 1
  rows.append(row("last_hidden_state", output_flax,
                  output.last_hidden_state.detach().cpu().numpy(), real))
  return rows


def _every_call(modules: dict, names, run):
  """run() with a forward hook on each module of `names` -> ({name: its outputs, one per call,
  as numpy}, run()'s result): ALBERT's one layer runs at every depth."""
  calls: dict[str, list] = collections.defaultdict(list)

  def hook(name):
    def save(_, args, output):
      output = output[0] if isinstance(output, tuple) else output
      calls[name].append(output.detach().cpu().numpy())
    return save

  handles = [modules[name].register_forward_hook(hook(name)) for name in names]
  try:
    return calls, run()
  finally:
    for h in handles:
      h.remove()


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
