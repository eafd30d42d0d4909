"""The encoder's dense layer: Xavier-uniform weights, as the PyTorch tutorial port initialises
them, with logical axis names on the kernel and bias (flax_encoder.sharding maps them)."""

from __future__ import annotations

import flax.linen as nn


def dense(cfg, features: int, axes: tuple[str, str], name: str,
          kernel_init=None, bias: bool | None = None) -> nn.Dense:
  """nn.Dense whose kernel has logical axes `axes` (in, out) and whose bias has (out,).

  `cfg` gives the compute and parameter dtypes (an EncoderConfig) and whether it has a bias
  (`has_bias(name)`, unless `bias` says). The kernel is Xavier-uniform unless `kernel_init` is
  given.
  """
  kernel_init = kernel_init or nn.initializers.xavier_uniform()
  return nn.Dense(features, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                  use_bias=cfg.has_bias(name) if bias is None else bias,
                  kernel_init=nn.with_logical_partitioning(kernel_init, axes),
                  bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), axes[1:]),
                  name=name)
