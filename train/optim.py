"""The paper's optimizer (section 5.3): Adam(0.9, 0.98, 1e-9) with warm-up then 1/sqrt(step)."""

from __future__ import annotations

import jax.numpy as jnp
import optax


def paper_schedule(d_model: int, warmup_steps: int, lr_scale: float = 1.0) -> optax.Schedule:
  """lr = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1.

  optax calls a schedule with the number of updates done so far (0 for the first update), so
  step = count + 1: the first update runs at lr_scale * d_model^-0.5 * warmup^-1.5, not at 0.
  """
  if warmup_steps <= 0:
    raise ValueError(f"config.optim.warmup_steps must be positive, got {warmup_steps}")

  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    return lr_scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

  return schedule


def make_optimizer(optim, d_model: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Adam with the paper's schedule, after optional global-norm clipping (optim.clip_norm)."""
  schedule = paper_schedule(d_model, optim.warmup_steps, optim.lr_scale)
  adam = optax.adam(schedule, b1=optim.b1, b2=optim.b2, eps=optim.eps)
  if optim.clip_norm is None:
    return adam, schedule
  return optax.chain(optax.clip_by_global_norm(optim.clip_norm), adam), schedule
