"""The optimizers: the paper's (section 5.3), Adam(0.9, 0.98, 1e-9) with warm-up then
1/sqrt(step), and the usual fine-tuning recipe, AdamW with linear warm-up then linear decay
and no weight decay on biases and LayerNorm scales. optax provides every piece.

The config.optim fields a config leaves unset (configs/classify.py leaves `RECIPE_FIELDS`
unset) take the values of the recipe for where the encoder starts: `resolve` sets them, in
this one place, from scratch's or a pretrained encoder's (`recipe_for`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import optax

RECIPES = ("paper", "adamw")


@dataclasses.dataclass(frozen=True)
class Recipe:
  """The values config.optim's `RECIPE_FIELDS` take where a config leaves them unset."""

  name: str
  recipe: str
  learning_rate: float
  weight_decay: float
  warmup: int | float  # steps, or (a float) a share of the run's steps

  def value(self, field: str, num_steps: int | None = None):
    """Its value of config.optim.`field`: a share of warm-up counted in the steps of a run of
    `num_steps`, or said as a share where they are not known yet (None: on resume's checks)."""
    if field != "warmup_steps":
      return getattr(self, field)
    if isinstance(self.warmup, int):
      return self.warmup
    if num_steps is None:
      return f"{self.warmup:.0%} of the steps"
    return max(1, round(self.warmup * num_steps))


RECIPE_FIELDS = ("recipe", "learning_rate", "warmup_steps", "weight_decay")
SCRATCH = Recipe("from-scratch", "adamw", 1e-3, 0.01, 100)
# A pretrained encoder is fine-tuned far more gently, or 1e-3 wrecks what it learnt: BERT's
# and RoBERTa's recipe (their papers search 1e-5 … 1e-4; transformers' Trainer defaults to
# 5e-5), warming up over the run's first 6% (RoBERTa's GLUE runs).
PRETRAINED = Recipe("pretrained", "adamw", 5e-5, 0.01, 0.06)
INITS = ("run", "torch_checkpoint", "hf")  # config.init's fields that name a pretrained start


def recipe_for(config) -> tuple[Recipe, str]:
  """The recipe config.optim's unset fields take and why: PRETRAINED where config.init names
  the encoder's start, else SCRATCH. `config`: a ConfigDict or its dict, as a checkpoint
  records it."""
  init = config.get("init") or {}
  given = next((name for name in INITS if init.get(name)), None)
  if given:
    return PRETRAINED, f"config.init.{given} is set"
  return SCRATCH, "no config.init is set"


def unset(config) -> tuple[str, ...]:
  """The `RECIPE_FIELDS` that `config` (a ConfigDict or its dict) leaves to the recipe."""
  optim = config.get("optim") or {}
  return tuple(f for f in RECIPE_FIELDS if f in optim and optim[f] is None)


def resolve(config, num_steps: int) -> ml_collections.ConfigDict:
  """config.optim with the fields it leaves unset set by its recipe (`recipe_for`) for a run
  of `num_steps`; a value the config gives stays. A new ConfigDict: `config` is not changed."""
  recipe, _ = recipe_for(config)
  return ml_collections.ConfigDict({**config.optim.to_dict(),
                                    **{f: recipe.value(f, num_steps) for f in unset(config)}})


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
  """`peak` * step / `warmup_steps` for the first `warmup_steps` updates (step counted from 1),
  then linearly to 0 at `num_steps`.

  optax calls a schedule with the updates done so far (0 for the first): a warm-up from 0 at
  count 0 would run the first update at learning rate 0, and a one-step run would never move
  its weights. Counted from 1, the first update runs at peak / warmup_steps and the warm-up's
  last at `peak`; the decay from there, to 0 at `num_steps`, is as it always was.
  """
  decay = max(num_steps - warmup_steps, 1)

  def schedule(count):
    count = jnp.asarray(count, jnp.float32)
    rising = (count + 1.0) / warmup_steps
    falling = (num_steps - count) / decay
    return peak * jnp.clip(jnp.minimum(rising, falling), 0.0, 1.0)

  return schedule


def warmup_steps(optim, num_steps: int) -> int:
  """The warm-up the run gets: config.optim.warmup_steps, or for AdamW in a run no longer than
  it (a quick try), its first tenth, so that the linear decay has steps to run."""
  if optim.recipe == "adamw" and optim.warmup_steps >= num_steps:
    return max(1, num_steps // 10)
  return optim.warmup_steps


def warmup_note(optim, num_steps: int) -> str | None:
  """What the start line says of a run that warms up for fewer steps than
  config.optim.warmup_steps, or None."""
  steps = warmup_steps(optim, num_steps)
  if steps == optim.warmup_steps:
    return None
  return (f"config.optim.warmup_steps {optim.warmup_steps} is not shorter than the run's "
          f"{num_steps} steps: warming up for its first tenth ({steps} steps) instead")


def decays(params):
  """True for the weights weight decay applies to: not biases, not LayerNorm scales."""
  def leaf(path, _):
    name = str(getattr(path[-1], "key", path[-1]))
    return not (name.endswith("bias") or name == "scale")
  return jax.tree_util.tree_map_with_path(leaf, params)


def describe(config, optim, d_model: int, num_steps: int) -> str:
  """The line that says the optimizer a run of `num_steps` gets (`optim`: `resolve`'s) and
  where its values came from (`config`: as given): the warm-up it runs, and why where that is
  not config.optim.warmup_steps."""
  warmup = warmup_steps(optim, num_steps)
  cut = warmup_note(optim, num_steps)
  if optim.recipe == "paper":
    peak = optim.lr_scale * d_model**-0.5 * warmup**-0.5
    line = (f"optimizer: paper, Adam({optim.b1:g}, {optim.b2:g}, {optim.eps:g}), warm-up "
            f"{warmup} steps to a peak learning rate of {peak:.2g}, then 1/sqrt(step)")
  else:
    line = (f"optimizer: adamw, peak learning rate {optim.learning_rate:g}, warm-up {warmup} "
            f"steps ({warmup / num_steps:.0%}{'; ' + cut if cut else ''}), linear decay, "
            f"weight decay {optim.weight_decay:g}")
  filled = unset(config)
  if not filled:
    return line
  recipe, why = recipe_for(config)
  if len(filled) == len(RECIPE_FIELDS):
    return f"{line} (the {recipe.name} recipe: {why})"
  # A warm-up given but cut is not what the run runs "as given".
  given = [f"config.optim.{f}" for f in RECIPE_FIELDS
           if f not in filled and not (cut and f == "warmup_steps")]
  said = [f"{', '.join(given)} as given"] if given else []
  if cut and "warmup_steps" not in filled:
    said.append("config.optim.warmup_steps given but cut to fit the run")
  return f"{line} ({', '.join(said)}, the rest the {recipe.name} recipe's: {why})"


def make_optimizer(optim, d_model: int,
                   num_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """config.optim's recipe (every field set: `resolve`'s where the config leaves some unset),
  after optional global-norm clipping (optim.clip_norm):
  "paper": Adam with the paper's schedule (lr_scale, warmup_steps); "adamw": AdamW at
  optim.learning_rate with optim.weight_decay, warm-up then linear decay to 0 at num_steps."""
  left = [f for f in RECIPE_FIELDS if optim.get(f) is None]
  if left:
    raise ValueError(f"config.optim.{left[0]} is unset: pass resolve(config, num_steps), "
                     f"which sets it from the recipe")
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
