"""The training loop: a task's steps with the paper's optimizer, resumable exactly."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils
from tqdm import tqdm

from flax_encoder import sharding
from train import data, masked_lm, settings
from train.checkpoint import Checkpointer
from train.metrics import MetricWriter, read_metrics
from train.optim import make_optimizer
from train.plots import plot_run
from train.step import init_state, make_train_step

# The held-out batches are masked once, with keys of their own (fold_in(PRNGKey(seed +
# _EVAL_SEED_OFFSET), i) for batch i) that no training step draws, so that evaluations compare
# across steps and across runs with the same seed.
_EVAL_SEED_OFFSET = 2


def evaluate(eval_fn, params, batches) -> dict:
  """The sums of `eval_fn` over `batches`, added up on the host."""
  # One batch at a time, summed on the host: with several processes on CPU, independent
  # computations in flight together can interleave their gloo collectives differently in
  # each process and deadlock.
  sums = {}
  for batch in batches:
    for name, value in jax.device_get(eval_fn(params, batch)).items():
      sums[name] = sums.get(name, 0.0) + float(value)
  return sums


class StopRequest:
  """Turns SIGTERM / SIGINT into a request to stop after the current step."""

  EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}

  def __init__(self):
    self.signum = None
    self._previous = {s: signal.signal(s, self._handle) for s in self.EXIT_CODES}

  def _handle(self, signum, frame):
    self.signum = signum

  def stopping(self, step: int, log_every: int, after) -> bool:
    """Whether to stop after `step`. Several processes must stop (and save) at the same step:
    at each log step they learn, through a collective run once the computation of `after` is
    done, whether any of them was signalled."""
    # Read the flag once: a signal landing later in this step is seen by the next one, so
    # the step that stops is always the step that saves.
    signalled = self.signum is not None
    if jax.process_count() == 1:
      return signalled
    if step % log_every:
      return False
    jax.block_until_ready(after)  # never run the two computations' collectives together
    return bool(multihost_utils.process_allgather(np.int32(signalled)).any())

  @property
  def exit_code(self) -> int:
    """128 + the signal; 143 where another process was signalled and this one stops with it."""
    return self.EXIT_CODES.get(self.signum, 143)

  def restore(self):
    for s, handler in self._previous.items():
      signal.signal(s, handler)


class _Progress:
  """Step metrics on their way to the host, read once per log step (the loop's only host
  sync): checked for a non-finite loss, written with the log window's throughput, shown on
  the progress bar."""

  def __init__(self, writer: MetricWriter | None, bar: tqdm, log_every: int):
    self.writer, self.bar, self.log_every = writer, bar, log_every
    self.pending = []  # (step, device metrics) not yet read
    # The log window: its start, tokens trained, and seconds the loop waited for the next
    # batch (steps run asynchronously, so a window is input-bound when that wait nears its
    # length).
    self.start, self.tokens, self.data_wait_s = time.perf_counter(), 0, 0.0

  def add(self, step: int, metrics: dict, tokens: int, data_wait_s: float) -> None:
    self.pending.append((step, metrics))
    self.tokens += tokens
    self.data_wait_s += data_wait_s
    self.bar.update(1)

  def flush(self, step: int) -> tuple[int, float] | None:
    """Reads and records the pending metrics; returns (step, loss) of a non-finite loss."""
    fetched, self.pending = jax.device_get(self.pending), []
    bad = next(((s, m["loss"]) for s, m in fetched if not np.isfinite(m["loss"])), None)
    if bad is not None:
      return bad
    now = time.perf_counter()
    window = {"tokens_per_s": self.tokens / (now - self.start), "data_wait_s": self.data_wait_s,
              "data_wait_fraction": self.data_wait_s / (now - self.start)}
    self.start, self.tokens, self.data_wait_s = now, 0, 0.0
    for s, m in fetched:
      if self.writer and (s % self.log_every == 0 or s == step):
        self.writer.write(s, "train", {**m, **window})
    self.bar.set_postfix(loss=f"{fetched[-1][1]['loss']:.3f}",
                         tok_s=f"{window['tokens_per_s']:,.0f}")
    return None


def run(config: ml_collections.ConfigDict, workdir: str) -> int:
  """Trains (or resumes) the run in `workdir`; returns the process exit code."""
  os.makedirs(workdir, exist_ok=True)
  train_config = config.train
  windows = data.windows(config, workdir)
  cfg = settings.encoder_config(config.model, windows.vocab_size, windows.source,
                                train_config.seq_len)
  task = masked_lm.task(config, cfg, data.most_frequent_token(windows.train))
  tx, schedule = make_optimizer(config.optim, cfg.d_model)
  mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp)
  sharding.check_batch_divisible(train_config.batch_size, mesh, "config.train.batch_size")
  if mesh.size > 1:
    print(f"mesh: data={mesh.shape['data']} x fsdp={mesh.shape['fsdp']} over {mesh.size} "
          f"{jax.default_backend()} devices in {jax.process_count()} process(es)", file=sys.stderr)
  primary = jax.process_index() == 0  # the one process that writes metrics and plots
  record = {"config": config.to_json(), "encoder": settings.encoder_record(cfg)}

  with contextlib.ExitStack() as stack:
    train_iter = data.TrainBatches(windows.train, train_config.batch_size, train_config.seed,
                                   config.data.workers)
    stack.callback(train_iter.close)
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"),
                                train_config.keep_checkpoints)
    stack.callback(checkpointer.close)
    stack.callback(checkpointer.wait)  # runs before close: the last save is on disk
    writer = MetricWriter(workdir) if primary else None
    if writer:
      stack.callback(writer.close)

    eval_key = jax.random.PRNGKey(train_config.seed + _EVAL_SEED_OFFSET)
    eval_batch = jax.jit(task.batch)
    eval_data = [eval_batch(data.to_devices(rows, mesh), jax.random.fold_in(eval_key, i))
                 for i, rows in enumerate(data.eval_batches(
                     windows.eval[:config.data.max_eval_windows], train_config.batch_size))]
    state = init_state(task, tx, train_config.seed, train_config.seq_len, mesh)
    restored = checkpointer.restore_newest(state, train_iter)
    if restored is not None:
      state = restored[0]
      if writer:
        writer.truncate_after(int(state.step))
      print(f"resumed from the checkpoint at step {int(state.step)}", file=sys.stderr)

    # The mesh and the rules in context let the encoder constrain its activations' layout.
    stack.enter_context(jax.set_mesh(mesh))
    stack.enter_context(nn.logical_axis_rules(sharding.RULES))
    # The state keeps its layout from step to step (no recompiles, donation reuses its buffers).
    state_shardings = jax.tree.map(lambda x: x.sharding, state)
    train_step = jax.jit(make_train_step(task, tx, schedule),
                         out_shardings=(state_shardings, None), donate_argnums=0)
    eval_step = jax.jit(task.eval_sums)
    step = int(state.step)
    bar = stack.enter_context(tqdm(total=train_config.num_steps, initial=step, desc="train",
                                   unit="step", dynamic_ncols=True, disable=not primary))
    progress = _Progress(writer, bar, train_config.log_every)
    stop = StopRequest()
    stack.callback(stop.restore)
    exit_code = 0
    while step < train_config.num_steps:
      waiting = time.perf_counter()
      batch = data.to_devices(next(train_iter), mesh)
      waited = time.perf_counter() - waiting
      state, metrics = train_step(state, batch)
      step += 1
      progress.add(step, metrics, int(batch.size), waited)
      is_last = step == train_config.num_steps
      stopping = stop.stopping(step, train_config.log_every, after=metrics)
      save_now = step % train_config.checkpoint_every == 0 or is_last or stopping
      if step % train_config.log_every == 0 or save_now:
        bad = progress.flush(step)
        if bad is not None:
          steps = checkpointer.steps()
          kept = f"the newest checkpoint (step {steps[-1]})" if steps else "no checkpoint"
          print(f"\nerror: non-finite training loss {bad[1]} at step {bad[0]}. Stopping; {kept} "
                f"is left untouched. Lower config.optim.lr_scale or set config.optim.clip_norm.",
                file=sys.stderr)
          exit_code = 1
          break
      if step % train_config.eval_every == 0 or is_last:
        sums = evaluate(eval_step, state.params, eval_data)
        if writer:
          writer.write(step, "eval", task.eval_metrics(sums))
      if save_now:
        checkpointer.save(step, state, train_iter, record)
      if stopping:
        exit_code = stop.exit_code
        print(f"\nstopped by signal {stop.signum or 'to another process'} at step {step}; "
              f"checkpoint saved", file=sys.stderr)
        break

  if exit_code == 0 and primary:
    records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    plot_run(records, schedule, train_config.num_steps, os.path.join(workdir, "plots"))
    final = [r for r in records if r["split"] == "eval"][-1]
    print(f"step {step}: eval accuracy {final['accuracy']:.3f} (baseline "
          f"{final['baseline_accuracy']:.3f}), eval loss {final['loss']:.3f}; plots in "
          f"{os.path.join(workdir, 'plots')}")
  return exit_code
