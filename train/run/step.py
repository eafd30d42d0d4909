"""The train state and the jitted steps, bound once from a task and an optimizer.

`make_train_step` is the one place the training step is assembled: the loop, the benchmarks and the
tests all call it, for pretraining (`train.tasks.masked_lm.MaskedLMTask`) and fine-tuning
(`train.tasks.classify.ClassifyTask`) alike. A task says what differs between them
(`train.task.Task`); the step does the rest: the step's keys, gradients (accumulated over
microbatches when asked), the optimizer update and the metrics.
"""

from __future__ import annotations

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from flax_encoder import sharding
from train.task import Task


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # updates done so far
  params: Any
  opt_state: Any
  rng: jax.Array  # base key; step k's dropout and task keys are split from fold_in(rng, k)


def step_keys(rng: jax.Array, step) -> tuple[jax.Array, jax.Array]:
  """(dropout key, task key) of step `step` (counting from 0) of the run with base key `rng`."""
  dropout_rng, task_rng = jax.random.split(jax.random.fold_in(rng, step))
  return dropout_rng, task_rng


def _boxed_init(task: Task, tx, seed: int, seq_len: int):
  """A function returning a fresh TrainState whose parameters carry their logical axes."""

  def init():
    params_rng, run_rng = jax.random.split(jax.random.PRNGKey(seed))
    params = task.init(params_rng, seq_len)
    return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params),
                      rng=run_rng)

  return init


def init_state(task: Task, tx, seed: int, seq_len: int,
               mesh: jax.sharding.Mesh | None = None) -> TrainState:
  """A fresh train state. On `mesh` each array is created in place, split by the logical rules
  of flax_encoder.sharding (with fsdp > 1, parameters and Adam's moments along "embed")."""
  init = _boxed_init(task, tx, seed, seq_len)
  if mesh is None:
    return nn.unbox(init())
  shardings = sharding.logical_shardings(jax.eval_shape(init), mesh)
  return jax.jit(lambda: nn.unbox(init()), out_shardings=shardings)()


def abstract_state(task: Task, tx, seq_len: int, mesh: jax.sharding.Mesh) -> TrainState:
  """Shapes, dtypes and shardings on `mesh` of a train state, allocating nothing: the target
  that restores a checkpoint onto `mesh`."""
  return sharding.abstract_arrays(_boxed_init(task, tx, 0, seq_len), mesh)


def make_train_step(task: Task, tx: optax.GradientTransformation, schedule: optax.Schedule,
                    grad_accum_steps: int = 1):
  """train_step(state, rows) -> (state, metrics): one optimizer update on one batch.

  Pure: everything it depends on is in its arguments or bound here, so jit it once (donating
  the state) and resume exactly from any step. With `grad_accum_steps` = k the batch's
  gradient is accumulated over k microbatches of batch / k rows (rows i, i + k, …: each
  device keeps its own rows), one at a time in a `lax.scan`, so that only one microbatch's
  activations are alive at once. The task's random draws (masking) are made on the whole
  batch first, so they do not depend on k; the loss is normalised by the whole batch's count.
  """

  def train_step(state: TrainState, rows) -> tuple[TrainState, dict]:
    dropout_rng, task_rng = step_keys(state.rng, state.step)
    batch = task.batch(rows, task_rng)
    count = jnp.maximum(task.loss_count(batch), 1.0)
    loss_fn = lambda params, batch, rng: task.loss_sum(params, batch, rng) / count
    if grad_accum_steps == 1:
      loss, grads = jax.value_and_grad(loss_fn)(state.params, batch, dropout_rng)
    else:
      loss, grads = _accumulated(loss_fn, state.params, batch, dropout_rng, grad_accum_steps)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(step=state.step + 1,
                              params=optax.apply_updates(state.params, updates),
                              opt_state=opt_state)
    metrics = {"loss": loss, "lr": schedule(state.step), "grad_norm": optax.tree.norm(grads)}
    return new_state, metrics

  return train_step


def _accumulated(loss_fn, params, batch: dict, dropout_rng: jax.Array, k: int):
  """(loss, gradient) of `loss_fn` summed over k microbatches: batch rows i, i + k, i + 2k, …
  make microbatch i, and microbatch i draws its dropout from fold_in(dropout_rng, i)."""
  # [batch, ...] -> [k, batch / k, ...]: a device's contiguous block of rows holds rows of
  # every microbatch, so splitting needs no communication.
  micro = jax.tree.map(lambda x: jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1),
                       batch)

  def add(total, inputs):
    i, microbatch = inputs
    loss, grads = jax.value_and_grad(loss_fn)(params, microbatch,
                                              jax.random.fold_in(dropout_rng, i))
    return jax.tree.map(jnp.add, total, (loss, grads)), None

  zero = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
  (loss, grads), _ = jax.lax.scan(add, zero, (jnp.arange(k), micro))
  return loss, grads
