"""Relative attention schemes a family brings: a registry, as kernels.KERNELS is for kernels.

`EncoderConfig.relative_attention` holds a spec, "name" or "name,key=value,…", whose name is
one of `PARTS`; the module that computes it is imported when it is first needed, so
importing the encoder or its config imports no family. A part module defines `Part` with:

  Part.parse(spec) -> Part     its settings, ValueError(what was expected) where wrong
  part.spec() -> str           the spec, canonical (what a config records)
  Part.scope: str              where its parameters sit among the encoder's (once, for all
                               the layers): the name its checkpoints give them
  part.shared(cfg, name) -> nn.Module, named `name`, whose call (positions, seq) gives the
                               state every layer reads
  part.scores(cfg, q, k, w_q, w_k, state, deterministic) -> (bias, q): the bias every head
                               adds to its scores [batch, heads, q, k], and q as the kernel's
                               1/sqrt(head_dim) should scale it

Adding a scheme is its module and one line here. The config and attention import this module,
so a part's module imports none of the modules above them (config, attention, layer,
encoder): what it shares with them lies below (norm.layer_norm, dropout.Dropout), and it reads
the config it is given without importing its class. tests/test_layout.py follows this table's
names as imports and fails on a circle.
"""

from __future__ import annotations

import importlib

# name -> the module that defines its Part
PARTS = {"disentangled": "flax_encoder.families.disentangled",  # DeBERTa's c2p and p2c
         "t5_bias": "flax_encoder.families.t5_bias"}  # MPNet's bias by T5's buckets


def part(spec: str):
  """The Part of `spec` (EncoderConfig.relative_attention); ValueError naming what was
  expected where its name or settings are not one."""
  name = spec.split(",", 1)[0].strip()
  if name not in PARTS:
    raise ValueError(f"one of {sorted(PARTS)}, then its settings ('disentangled,buckets=256')")
  return importlib.import_module(PARTS[name]).Part.parse(spec)
