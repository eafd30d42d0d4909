"""The config's norm, LayerNorm or RMSNorm, for every module that normalises: the layers, the
encoder, the heads and a family's relative attention scheme. It imports no module of the
library, not even the config: the config reads a scheme's spec when it is made, and a scheme
(families/disentangled.py) normalises its table, so a norm that imported either would close
a circle."""

from __future__ import annotations

import flax.linen as nn


def layer_norm(cfg, name: str) -> nn.Module:
  """The norm of the EncoderConfig `cfg` (norm_type): LayerNorm, or RMSNorm (a scale, no bias),
  named `name`."""
  if cfg.norm_type == "rms":
    return nn.RMSNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                      name=name, scale_init=nn.with_logical_partitioning(nn.initializers.ones,
                                                                         ("embed",)))
  # PyTorch's LayerNorm uses eps=1e-5 (Flax: 1e-6) and a two-pass variance; Flax's default
  # E[x^2] - E[x]^2 loses digits when the mean is large.
  return nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                      use_fast_variance=False, use_bias=cfg.norm_bias, name=name,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))
