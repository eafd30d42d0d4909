"""The optimizers: the paper's (section 5.3), Adam(0.9, 0.98, 1e-9) with warm-up then
1/sqrt(step), and the usual fine-tuning recipe, AdamW with linear warm-up then linear decay
and no weight decay on biases and LayerNorm scales. optax provides every piece."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

RECIPES = ("paper", "adamw")


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


def warmup_then_linear_decay(peak: float, warmup_steps: int, num_steps: int) -> optax.Schedule:
  """0 -> `peak` over `warmup_steps` updates, then linearly to 0 at `num_steps`."""
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, warmup_steps),
       optax.linear_schedule(peak, 0.0, max(num_steps - warmup_steps, 1))], [warmup_steps])


def warmup_steps(optim, num_steps: int) -> int:
  """The warm-up the run gets: config.optim.warmup_steps, or for AdamW in a run no longer than
  it (a quick try), its first tenth, so that the linear decay has steps to run."""
  if optim.recipe == "adamw" and optim.warmup_steps >= num_steps:
    return max(1, num_steps // 10)
  return optim.warmup_steps


def warmup_note(optim, num_steps: int) -> str | None:
  """The one line that says a run warms up for fewer steps than config.optim.warmup_steps."""
  steps = warmup_steps(optim, num_steps)
  if steps == optim.warmup_steps:
    return None
  return (f"config.optim.warmup_steps: {optim.warmup_steps} is not shorter than the run's "
          f"{num_steps} steps; warming up for its first tenth ({steps} steps) instead")


def decays(params):
  """True for the weights weight decay applies to: not biases, not LayerNorm scales."""
  def leaf(path, _):
    name = str(getattr(path[-1], "key", path[-1]))
    return not (name.endswith("bias") or name == "scale")
  return jax.tree_util.tree_map_with_path(leaf, params)


def make_optimizer(optim, d_model: int,
                   num_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """config.optim's recipe, after optional global-norm clipping (optim.clip_norm):
  "paper": Adam with the paper's schedule (lr_scale, warmup_steps); "adamw": AdamW at
  optim.learning_rate with optim.weight_decay, warm-up then linear decay to 0 at num_steps."""
  if optim.recipe == "paper":
    schedule = paper_schedule(d_model, optim.warmup_steps, optim.lr_scale)
    tx = optax.adam(schedule, b1=optim.b1, b2=optim.b2, eps=optim.eps)
  else:
    schedule = warmup_then_linear_decay(optim.learning_rate, warmup_steps(optim, num_steps),
                                        num_steps)
    tx = optax.adamw(schedule, b1=optim.b1, b2=optim.b2, eps=optim.eps,
                     weight_decay=optim.weight_decay, mask=decays)
  if optim.clip_norm is None:
    return tx, schedule
  return optax.chain(optax.clip_by_global_norm(optim.clip_norm), tx), schedule


def smoothed_loss_sum(logits, targets, weights, label_smoothing: float) -> jax.Array:
  """Label-smoothed cross-entropy summed over the weighted (masked, labelled) positions
  (config.optim.label_smoothing); a target of weight 0 may be anything, -1 say."""
  logits = logits.astype(jnp.float32)
  labels = optax.smooth_labels(jax.nn.one_hot(targets, logits.shape[-1]), label_smoothing)
  return jnp.sum(optax.softmax_cross_entropy(logits, labels) * weights)
