"""The training loop: masked-token prediction with the paper's optimizer, resumable exactly."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import time
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.experimental import multihost_utils
from tqdm import tqdm

from flax_encoder import EncoderConfig, sharding
from train import data
from train.checkpoint import Checkpointer
from train.metrics import MetricWriter, read_metrics
from train.optim import make_optimizer
from train.plots import plot_run
from train.task import MaskedLM, eval_sums, mask_tokens, predictions_per_row, smoothed_loss


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # updates done so far
  params: Any
  opt_state: Any
  rng: jax.Array  # base key; step k's dropout and masking keys are split from fold_in(rng, k)


def encoder_config(config: ml_collections.ConfigDict) -> EncoderConfig:
  """config.model (a ConfigDict of EncoderConfig fields) -> EncoderConfig."""
  fields = config.model.to_dict()
  if fields.get("vocab_size") is None:
    raise ValueError("config.model.vocab_size is unset: training takes it from the data "
                     "(use_data_vocab_size)")
  if fields.get("pad_id", data.PAD_ID) != data.PAD_ID:
    raise ValueError(f"config.model.pad_id must be {data.PAD_ID}, got {fields['pad_id']}")
  return EncoderConfig(**fields)


def use_data_vocab_size(config: ml_collections.ConfigDict, windows: data.Windows) -> None:
  """Sets config.model.vocab_size to the data's; an explicit value must agree with it."""
  given = config.model.vocab_size
  if given is not None and given != windows.vocab_size:
    raise ValueError(f"config.model.vocab_size={given} disagrees with the data: "
                     f"{windows.source} has a vocabulary of {windows.vocab_size}; leave it "
                     f"unset to take the data's")
  config.model.vocab_size = windows.vocab_size


def masked_lm(config: ml_collections.ConfigDict) -> MaskedLM:
  """The model config.model and config.task describe."""
  return MaskedLM(encoder_config(config), tie_embeddings=config.task.tie_embeddings,
                  head_at_every_position=config.task.head_at_every_position)


def masking(config: ml_collections.ConfigDict):
  """(tokens, key) -> masked batch: the corruption config.data and config.task describe."""
  predictions = predictions_per_row(config.data.mask_rate, config.train.seq_len,
                                    config.task.max_predictions_per_seq)
  return functools.partial(mask_tokens, mask_rate=config.data.mask_rate,
                           vocab_size=config.model.vocab_size, predictions=predictions)


def _boxed_init(model: MaskedLM, tx, seed: int, batch_size: int, seq_len: int):
  """A function returning a fresh TrainState whose parameters carry their logical axes."""

  def init():
    params_rng, run_rng = jax.random.split(jax.random.PRNGKey(seed))
    tokens = jnp.ones((batch_size, seq_len), jnp.int32)
    positions = jnp.zeros((batch_size, 1), jnp.int32)
    params = model.init(params_rng, tokens, positions)["params"]  # boxed: LogicallyPartitioned
    return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params),
                      rng=run_rng)

  return init


def init_state(model: MaskedLM, tx, seed: int, batch_size: int, seq_len: int,
               mesh: jax.sharding.Mesh | None = None) -> TrainState:
  """A fresh train state. On `mesh` each array is created in place, split by the logical rules
  of flax_encoder.sharding (with fsdp > 1, parameters and Adam's moments along "embed")."""
  init = _boxed_init(model, tx, seed, batch_size, seq_len)
  if mesh is None:
    return nn.unbox(init())
  shardings = sharding.logical_shardings(jax.eval_shape(init), mesh)
  return jax.jit(lambda: nn.unbox(init()), out_shardings=shardings)()


def abstract_state(model: MaskedLM, tx, seq_len: int, mesh: jax.sharding.Mesh) -> TrainState:
  """Shapes, dtypes and shardings on `mesh` of a train state, allocating nothing: the target
  that restores a checkpoint onto `mesh`."""
  boxed = jax.eval_shape(_boxed_init(model, tx, 0, 1, seq_len))
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      nn.unbox(boxed), sharding.logical_shardings(boxed, mesh))


def step_keys(rng: jax.Array, step) -> tuple[jax.Array, jax.Array]:
  """(dropout key, masking key) of step `step` (counting from 0) of the run with base key
  `rng`."""
  dropout_rng, mask_rng = jax.random.split(jax.random.fold_in(rng, step))
  return dropout_rng, mask_rng


def train_step(state: TrainState, tokens: jax.Array, *, model, tx, schedule, masking,
               label_smoothing: float) -> tuple[TrainState, dict]:
  """One Adam update on one batch of token ids [batch, seq], corrupted here by
  `masking(tokens, key)`. Pure: everything it depends on is in its arguments."""
  dropout_rng, mask_rng = step_keys(state.rng, state.step)
  batch = masking(tokens, mask_rng)

  def loss_fn(params):
    logits = model.apply({"params": params}, batch["inputs"], batch["positions"],
                         deterministic=False, rngs={"dropout": dropout_rng})
    return smoothed_loss(logits, batch["targets"], batch["weights"], label_smoothing)

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  new_state = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                            opt_state=opt_state)
  metrics = {"loss": loss, "lr": schedule(state.step), "grad_norm": optax.tree.norm(grads)}
  return new_state, metrics


def eval_step(params, batch: dict, *, model, baseline_token: int) -> dict:
  logits = model.apply({"params": params}, batch["inputs"], batch["positions"])
  return eval_sums(logits, batch["targets"], batch["weights"], baseline_token)


def evaluate(eval_fn, params, batches) -> dict:
  # One batch at a time, summed on the host: with several processes on CPU, independent
  # computations in flight together can interleave their gloo collectives differently in
  # each process and deadlock.
  sums = {}
  for batch in batches:
    for name, value in jax.device_get(eval_fn(params, batch)).items():
      sums[name] = sums.get(name, 0.0) + float(value)
  count = max(float(sums["count"]), 1.0)
  return {"loss": sums["ce"] / count, "accuracy": sums["correct"] / count,
          "baseline_accuracy": sums["baseline_correct"] / count}


class StopRequest:
  """Turns SIGTERM / SIGINT into a request to stop after the current step."""

  EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}

  def __init__(self):
    self.signum = None
    self._previous = {s: signal.signal(s, self._handle) for s in self.EXIT_CODES}

  def _handle(self, signum, frame):
    self.signum = signum

  @property
  def exit_code(self) -> int:
    """128 + the signal; 143 where another process was signalled and this one stops with it."""
    return self.EXIT_CODES.get(self.signum, 143)

  def restore(self):
    for s, handler in self._previous.items():
      signal.signal(s, handler)


def run(config: ml_collections.ConfigDict, workdir: str) -> int:
  """Trains (or resumes) the run in `workdir`; returns the process exit code."""
  os.makedirs(workdir, exist_ok=True)
  t = config.train
  windows = data.windows(config, workdir)
  use_data_vocab_size(config, windows)
  cfg = encoder_config(config)
  if t.seq_len > cfg.max_len:
    raise ValueError(f"config.train.seq_len={t.seq_len} exceeds config.model.max_len="
                     f"{cfg.max_len}")
  train_iter = data.TrainBatches(windows.train, t.batch_size, t.seed, config.data.workers)
  baseline_token = data.most_frequent_token(windows.train)

  mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp)
  sharding.check_batch_divisible(t.batch_size, mesh, "config.train.batch_size")
  if mesh.size > 1:
    print(f"mesh: data={mesh.shape['data']} x fsdp={mesh.shape['fsdp']} over {mesh.size} "
          f"{jax.default_backend()} devices in {jax.process_count()} process(es)", file=sys.stderr)
  # The held-out split, masked once with fixed keys and left on the devices for every
  # evaluation, so that evaluations compare across steps and runs.
  mask = masking(config)
  mask_eval, eval_key = jax.jit(mask), jax.random.PRNGKey(t.seed + 2)
  eval_data = [mask_eval(data.to_devices(rows, mesh), jax.random.fold_in(eval_key, i))
               for i, rows in enumerate(data.eval_batches(
                   windows.eval[:config.data.max_eval_windows], t.batch_size))]
  model = masked_lm(config)
  tx, schedule = make_optimizer(config.optim, cfg.d_model)
  state = init_state(model, tx, t.seed, t.batch_size, t.seq_len, mesh)

  checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), t.keep_checkpoints)
  primary = jax.process_index() == 0  # the one process that writes metrics and plots
  writer = MetricWriter(workdir) if primary else None
  restored = checkpointer.restore_newest(state, train_iter)
  if restored is not None:
    state = restored[0]
    if writer:
      writer.truncate_after(int(state.step))
    print(f"resumed from the checkpoint at step {int(state.step)}", file=sys.stderr)

  # The state keeps its layout from step to step (no recompiles, donation reuses its buffers).
  state_shardings = jax.tree.map(lambda x: x.sharding, state)
  p_train_step = jax.jit(functools.partial(train_step, model=model, tx=tx, schedule=schedule,
                                           masking=mask,
                                           label_smoothing=config.optim.label_smoothing),
                         out_shardings=(state_shardings, None), donate_argnums=0)
  p_eval_step = jax.jit(functools.partial(eval_step, model=model, baseline_token=baseline_token))
  stop = StopRequest()
  step = int(state.step)
  config_json = config.to_json()
  pending = []  # (step, device metrics) not yet read on the host
  # Per log window: its start, tokens trained, and seconds the loop waited for the next batch
  # (steps run asynchronously, so a window is input-bound when that wait nears its length).
  window_start, window_tokens, data_wait_s = time.perf_counter(), 0, 0.0
  bar = tqdm(total=t.num_steps, initial=step, desc="train", unit="step", dynamic_ncols=True,
             disable=not primary)
  exit_code = 0
  # The mesh and the rules in context let the encoder constrain its activations' layout.
  context = contextlib.ExitStack()
  context.enter_context(jax.set_mesh(mesh))
  context.enter_context(nn.logical_axis_rules(sharding.RULES))
  try:
    while step < t.num_steps:
      waiting = time.perf_counter()
      batch = data.to_devices(next(train_iter), mesh)
      data_wait_s += time.perf_counter() - waiting
      state, metrics = p_train_step(state, batch)
      step += 1
      window_tokens += int(batch.size)
      pending.append((step, metrics))
      bar.update(1)
      is_last = step == t.num_steps
      # Read the flag once: a signal landing later in this step is seen by the next one, so
      # the step that stops is always the step that saves. Several processes must stop (and
      # save) at the same step: at each log step they learn, through a collective, whether
      # any of them was signalled.
      stopping = stop.signum is not None
      if jax.process_count() > 1:
        stopping = step % t.log_every == 0 and _any_process(stopping, after=metrics)
      save_now = step % t.checkpoint_every == 0 or is_last or stopping
      if step % t.log_every == 0 or save_now:
        # The only host sync of the loop: every loss since the last one is checked, so a
        # non-finite loss never reaches a checkpoint.
        fetched = jax.device_get(pending)
        pending = []
        bad = next(((s, m["loss"]) for s, m in fetched if not np.isfinite(m["loss"])), None)
        if bad is not None:
          steps = checkpointer.steps()
          kept = f"the newest checkpoint (step {steps[-1]})" if steps else "no checkpoint"
          print(f"\nerror: non-finite training loss {bad[1]} at step {bad[0]}. Stopping; {kept} "
                f"is left untouched. Lower config.optim.lr_scale or set config.optim.clip_norm.",
                file=sys.stderr)
          exit_code = 1
          break
        now = time.perf_counter()
        window = {"tokens_per_s": window_tokens / (now - window_start),
                  "data_wait_s": data_wait_s,
                  "data_wait_fraction": data_wait_s / (now - window_start)}
        window_start, window_tokens, data_wait_s = now, 0, 0.0
        for s, m in fetched:
          if writer and (s % t.log_every == 0 or s == step):
            writer.write(s, "train", {**m, **window})
        bar.set_postfix(loss=f"{fetched[-1][1]['loss']:.3f}",
                        tok_s=f"{window['tokens_per_s']:,.0f}")
      if step % t.eval_every == 0 or is_last:
        eval_metrics = evaluate(p_eval_step, state.params, eval_data)
        if writer:
          writer.write(step, "eval", eval_metrics)
      if save_now:
        checkpointer.save(step, state, train_iter, config_json)
      if stopping:
        exit_code = stop.exit_code
        print(f"\nstopped by signal {stop.signum or 'to another process'} at step {step}; "
              f"checkpoint saved", file=sys.stderr)
        break
  finally:
    context.close()
    bar.close()
    checkpointer.wait()
    checkpointer.close()
    train_iter.close()
    if writer:
      writer.close()
    stop.restore()

  if exit_code == 0 and primary:
    records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    plot_run(records, schedule, t.num_steps, os.path.join(workdir, "plots"))
    final = [r for r in records if r["split"] == "eval"][-1]
    print(f"step {step}: eval accuracy {final['accuracy']:.3f} (baseline "
          f"{final['baseline_accuracy']:.3f}), eval loss {final['loss']:.3f}; plots in "
          f"{os.path.join(workdir, 'plots')}")
  return exit_code


def _any_process(flag: bool, after) -> bool:
  """Whether `flag` is set in any process (a collective: every process must call it), once
  the computation of `after` is done, so that the two never run their collectives together."""
  jax.block_until_ready(after)
  return bool(multihost_utils.process_allgather(np.int32(flag)).any())
