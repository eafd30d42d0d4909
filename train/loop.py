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
from flax_encoder.weights import first_nonfinite
from train import tasks
from train.data import pipeline
from train.errors import RunError
from train.run import host, launch, memory, optim, settings, throughput
from train.run.checkpoint import Checkpointer
from train.run.metrics import MetricWriter, read_metrics
from train.run.plots import plot_run
from train.run.step import abstract_state, init_state, make_train_step
from train.run.workdir import WorkdirLock, check_workdir
from train.task import Resume

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
      sums[name] = sums.get(name, 0.0) + np.asarray(value, np.float64)
  return sums


class StopRequest:
  """Turns SIGTERM / SIGINT into a request to stop after the current step."""

  EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}

  def __init__(self):
    self.signum = None
    self._previous = {s: signal.signal(s, self._handle) for s in self.EXIT_CODES}

  def _handle(self, signum, frame):
    self.signum = signum
    why = launch.orphaned()
    if why:
      print(f"[{jax.process_index()}] {why}; stopping at the next step all processes agree on",
            file=sys.stderr, flush=True)
    elif jax.process_count() == 1:  # said now: the step in flight may take a while
      print(f"\n{signal.Signals(signum).name}: stopping after the step in flight, with a "
            f"checkpoint", file=sys.stderr, flush=True)

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
  read): checked for a non-finite loss, written with the log window's throughput, shown on
  the progress bar, which counts the steps that have finished, not those dispatched, with the
  window's tokens/s so far every few seconds. The loop runs at most `IN_FLIGHT` steps ahead of
  the device: enough to keep it busy, few enough that the bar moves at every step (unbounded,
  a window of log_every steps was dispatched at once and the bar moved once per window).
  Where steps take SLOW_STEP_S or more, it runs none ahead: the host's work between two steps
  is then a small part of one, and a stop request waits for one step only."""

  IN_FLIGHT = 3
  SLOW_STEP_S = 1.0
  SHOW_EVERY_S = 2.0  # the throughput on the bar, at most this often

  def __init__(self, writer: MetricWriter | None, bar: tqdm, log_every: int,
               flops_at_peak: float | None = None):
    self.writer, self.bar, self.log_every = writer, bar, log_every
    self.shown, self.postfix = time.perf_counter(), {}
    # A step's flops on a device over the device's peak flop/s: the seconds a step would take
    # at peak (None where either is unknown); with the window's steps, its MFU.
    self.flops_at_peak = flops_at_peak
    self.pending = []  # (step, device metrics) not yet read
    self.counts = []  # their tokens
    self.finished = 0  # of them, those whose step is done (shown on the bar)
    # The log window: its start, tokens trained, and seconds the loop waited for the next
    # batch (steps run asynchronously, so a window is input-bound when that wait nears its
    # length); `profiled` marks a window that held profiled steps (slower).
    self.start, self.tokens, self.data_wait_s = time.perf_counter(), 0, 0.0
    self.profiled = False
    self.done_at, self.step_s = None, 0.0  # when the last step was seen done; the seconds since

  def add(self, step: int, metrics: dict, tokens: int, data_wait_s: float) -> None:
    self.pending.append((step, metrics))
    self.counts.append(tokens)
    self.tokens += tokens
    self.data_wait_s += data_wait_s
    ahead = 0 if self.step_s >= self.SLOW_STEP_S else self.IN_FLIGHT
    while self.finished < len(self.pending):
      loss = self.pending[self.finished][1]["loss"]
      if not loss.is_ready():
        if len(self.pending) - self.finished <= ahead:
          break
        while not loss.is_ready():  # not block_until_ready: a signal's handler runs meanwhile
          time.sleep(0.01)
      self._seen_done(1)
      self.finished += 1
      self.bar.update(1)
    now = time.perf_counter()
    if self.finished and now - self.shown >= self.SHOW_EVERY_S:
      self.shown = now
      self.postfix["tok_s"] = f"{sum(self.counts[:self.finished]) / (now - self.start):,.0f}"
      self.bar.set_postfix(self.postfix)

  def _seen_done(self, steps: int) -> None:
    """`steps` more steps are seen done now: the seconds a step takes, as far as seen."""
    now = time.perf_counter()
    self.step_s = 0.0 if self.done_at is None else (now - self.done_at) / steps
    self.done_at = now

  def flush(self, step: int, shares: dict) -> tuple[int, float] | None:
    """Reads and records the pending metrics, with the window's `shares` of the data sources;
    returns (step, loss) of a non-finite loss."""
    fetched, self.pending, self.counts = jax.device_get(self.pending), [], []
    if len(fetched) > self.finished:
      self._seen_done(len(fetched) - self.finished)
    self.bar.update(len(fetched) - self.finished)
    self.finished = 0
    bad = next(((s, m["loss"]) for s, m in fetched if not np.isfinite(m["loss"])), None)
    if bad is not None:
      return bad
    now = time.perf_counter()
    window = {"tokens_per_s": self.tokens / (now - self.start), "data_wait_s": self.data_wait_s,
              "data_wait_fraction": self.data_wait_s / (now - self.start), **shares}
    if self.flops_at_peak:
      window["mfu"] = self.flops_at_peak * len(fetched) / (now - self.start)
    resident = host.resident_bytes()
    if resident is not None:  # the process's, at the end of the window: it should stay flat
      window["host_resident_gb"] = resident / 1e9
    if self.profiled:
      window["profiled"] = 1.0
    self.start, self.tokens, self.data_wait_s, self.profiled = now, 0, 0.0, False
    for s, m in fetched:
      if self.writer and (s % self.log_every == 0 or s == step):
        self.writer.write(s, "train", {**m, **window})
    self.postfix = {"loss": f"{fetched[-1][1]['loss']:.3f}",
                    "tok_s": f"{window['tokens_per_s']:,.0f}"}
    self.bar.set_postfix(self.postfix)
    return None


class _Profiler:
  """A JAX profiler trace of steps start … start + steps - 1 under `directory`, by process 0."""

  def __init__(self, start: int, steps: int, directory: str):
    self.start, self.last, self.directory = start, start + steps - 1, directory
    self.on = steps > 0 and jax.process_index() == 0
    self.tracing = False

  def before(self, step: int) -> None:
    """Called before step `step` (counting from 1) is dispatched."""
    if self.on and step == self.start:
      jax.profiler.start_trace(self.directory)
      self.tracing = True

  def after(self, step: int, metrics, progress: _Progress) -> None:
    if self.tracing:
      progress.profiled = True
      if step == self.last:
        jax.block_until_ready(metrics)
        jax.profiler.stop_trace()
        self.tracing = False
        print(f"profile of steps {self.start} to {self.last} in {self.directory}",
              file=sys.stderr)


def run(config: ml_collections.ConfigDict, workdir: str, allow_changes: bool = False) -> int:
  """Trains (or resumes) the run in `workdir`; returns the process exit code.

  Mistakes in the config, the data or the workdir raise RunError before the first step; a
  resumed run must have its checkpoint's config, but for the fields that may change freely
  (train.run.settings.resume_kind), unless `allow_changes`.
  """
  definition = tasks.checked(config)
  train_config = config.train
  primary = jax.process_index() == 0  # the one process that writes metrics and plots
  if primary:
    check_workdir(workdir)

  with contextlib.ExitStack() as stack:
    if primary:
      stack.callback(WorkdirLock(workdir).release)
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"),
                                train_config.keep_checkpoints)
    stack.callback(checkpointer.close)
    stack.callback(checkpointer.wait)  # runs before close: the last save is on disk
    resume = _resume_point(checkpointer, config, allow_changes, definition)
    setup = definition.setup(config, workdir, Resume(resume is not None, allow_changes))
    if resume is not None:
      step, meta = resume
      source = setup.record.get("source", "the data")
      Resume(True, allow_changes).check_dataset(step, meta.get("dataset"),
                                                setup.record["dataset"], source)
      Resume.check_shapes(step, meta, setup.record, source)
    task = setup.task
    # How long, and the optimizer, follow the run: its training rows and where it starts.
    length = settings.length(train_config, len(jax.tree.leaves(setup.train)[0]))
    num_steps = length.num_steps
    optimizer = optim.resolve(config, num_steps)
    if primary:
      print(f"{length}; {optim.describe(config, optimizer, setup.encoder.d_model, num_steps)}",
            file=sys.stderr)
    tx, schedule = optim.make_optimizer(optimizer, setup.encoder.d_model, num_steps)
    mesh = _mesh(config)
    record = {"config": config.to_json(), **setup.record}

    packer = setup.packer and setup.packer(mesh.shape["data"] * mesh.shape["fsdp"])
    train_iter = pipeline.TrainBatches(setup.train, train_config.batch_size, train_config.seed,
                                   config.data.workers, sources=setup.sources, pack=packer)
    stack.callback(train_iter.close)
    writer = MetricWriter(workdir) if primary else None
    if writer:
      stack.callback(writer.close)
      writer.truncate_after(resume[0] if resume else 0)  # records past the checkpoint go
    eval_key = jax.random.PRNGKey(train_config.seed + _EVAL_SEED_OFFSET)
    eval_batch = jax.jit(task.batch)
    eval_data = [eval_batch(pipeline.to_devices(rows, mesh), jax.random.fold_in(eval_key, i))
                 for i, rows in enumerate(pipeline.eval_batches(
                     setup.eval, train_config.batch_size, setup.eval_fill))]
    # Compiled for the state's shapes and layout, and checked to fit, before it is allocated.
    target = abstract_state(task, tx, train_config.seq_len, mesh)
    train_step = _Steps(task, tx, schedule, target, config, mesh)
    if packer is None:
      train_step.compile(jax.tree.map(lambda x: jax.ShapeDtypeStruct(
          (train_config.batch_size, *x.shape[1:]), x.dtype), setup.train))
    else:  # the shape that holds the first batches: most batches, with texts' lengths as random
      train_step.compile(packer.spec(max(packer.rows(train_iter.batch_indices(k))
                                         for k in range(min(num_steps, _PACKED_SAMPLE)))))
    if resume is None:
      state = init_state(task, tx, train_config.seed, train_config.seq_len, mesh)
      if setup.start_params is not None:
        _check_finite(setup.start_params, config, setup.record.get("start"))
        state = _with_params(state, setup.start_params)
        fresh = sorted(set(state.params) - set(setup.start_params))
        if fresh and primary:  # as transformers names the weights it makes anew
          print(f"parameters made afresh, not in the start: {', '.join(fresh)}",
                file=sys.stderr)
    else:
      state = checkpointer.restore(resume[0], target, train_iter)
      print(f"resumed from the checkpoint at step {resume[0]}", file=sys.stderr)
    stack.enter_context(jax.set_mesh(mesh))  # for the evaluation step, compiled at its first use
    stack.enter_context(nn.logical_axis_rules(sharding.RULES))
    eval_step = jax.jit(task.eval_sums)
    step = int(state.step)
    bar = stack.enter_context(tqdm(total=num_steps, initial=step, desc="train",
                                   unit="step", dynamic_ncols=True, disable=not primary))
    flops, peak = throughput.step_flops(train_step.first), throughput.flops_per_second_peak()
    progress = _Progress(writer, bar, train_config.log_every,
                         flops / peak if flops and peak else None)
    profiler = _Profiler(train_config.profile_start, train_config.profile_steps,
                         os.path.join(workdir, "profile"))
    stop = StopRequest()
    stack.callback(stop.restore)
    exit_code = 0

    def evaluate_at(step):
      # Its own bar: an evaluation of many batches takes a while (compiling, the first time).
      shown = tqdm(eval_data, desc=f"eval at step {step}", unit="batch", leave=False,
                   dynamic_ncols=True, disable=not primary)
      eval_metrics = task.eval_metrics(evaluate(eval_step, state.params, shown))
      if not np.isfinite(eval_metrics["loss"]):
        raise _non_finite("eval", step, eval_metrics["loss"], checkpointer, early=False)
      if writer:
        writer.write(step, "eval", eval_metrics)
      return eval_metrics

    if resume is None and train_config.eval_at_start:  # the figures training starts from
      started = evaluate_at(step)
      if primary:
        print(f"step {step}, before training: {definition.summary(started)}", flush=True)
      if stop.stopping(step, 1, after=state.params):  # a signal during that evaluation
        exit_code = stop.exit_code
        print(f"\nstopped by signal {stop.signum or 'to another process'} before the first "
              f"step; nothing trained or saved", file=sys.stderr)
      progress.start = time.perf_counter()  # the first window's tokens/s are training's alone
    while step < num_steps and not exit_code:
      profiler.before(step + 1)
      waiting = time.perf_counter()
      batch = pipeline.to_devices(next(train_iter), mesh)
      waited = time.perf_counter() - waiting
      state, metrics = train_step(state, batch)
      step += 1
      progress.add(step, metrics, task.token_count(batch), waited)
      profiler.after(step, metrics, progress)
      is_last = step == num_steps
      stopping = stop.stopping(step, train_config.log_every, after=metrics)
      save_now = step % length.checkpoint_every == 0 or is_last or stopping
      if step % train_config.log_every == 0 or save_now:
        bad = progress.flush(step, train_iter.shares())
        if bad is not None:
          raise _non_finite("training", *bad, checkpointer, early=bad[0] <= _EARLY_STEPS)
      if step % length.eval_every == 0 or is_last:
        evaluate_at(step)
      if save_now:
        checkpointer.save(step, state, train_iter, record)
      if stopping:
        exit_code = stop.exit_code
        print(f"\nstopped by signal {stop.signum or 'to another process'} at step {step}; "
              f"checkpoint saved", file=sys.stderr)
        break

  if exit_code == 0 and primary:
    records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    plot_run(records, schedule, num_steps, os.path.join(workdir, "plots"), definition.plots,
             optimizer.recipe)
    final = [r for r in records if r["split"] == "eval"][-1]
    print(f"step {step}: {definition.summary(final)}; plots in "
          f"{os.path.join(workdir, 'plots')}")
  return exit_code


# The batches whose packed shape the step is compiled for first.
_PACKED_SAMPLE = 100


class _Steps:
  """The training step, compiled for each shape of batch before a batch of it runs, its
  memory checked against the devices' (a RunError if it cannot fit) and logged: one shape,
  or a few counts of rows for packed batches (train.tasks.packed_pairs), the first compiled
  for the most rows the first batches need."""

  def __init__(self, task, tx, schedule, state, config, mesh):
    self.state, self.mesh, self.compiled = state, mesh, {}
    self.first, self.announced = None, None  # the first compile, and the memory it needs
    # The state keeps its layout from step to step (no recompiles, donation reuses its buffers).
    self.jitted = jax.jit(make_train_step(task, tx, schedule, config.train.grad_accum_steps),
                          out_shardings=(jax.tree.map(lambda x: x.sharding, state), None),
                          donate_argnums=0)

  def compile(self, batch):
    """The step compiled for `batch` (arrays or their shapes and dtypes)."""
    spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=sharding.batch_sharding(self.mesh)), batch)
    # The mesh and the rules in context let the encoder constrain its activations' layout.
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(sharding.RULES):
      compiled = self.jitted.lower(self.state, spec).compile()
    needs = memory.step_memory(compiled)
    # Packed batches that need fewer rows than the first compile steps of their own that fit
    # in its memory: no need to say each.
    quiet = self.announced is not None and needs.needed <= self.announced.needed
    if jax.process_index() == 0 and not quiet:
      # On a CPU the step's temporaries are host memory: the allocator decides whether
      # resident memory stays at the figure (train/run/host.py).
      held = f" (host malloc: {host.allocator()})" if jax.default_backend() == "cpu" else ""
      packed = isinstance(spec, dict) and "segment_ids" in spec and spec["tokens"].ndim == 2
      rows = spec["tokens"].shape if packed else None  # a rerank batch: [queries, docs, ids]
      said = str(needs)
      if rows and self.first is None:
        held = (f" (batches packed into {rows[0]} rows of {rows[1]} ids; a batch that needs "
                f"more compiles a step of its own){held}")
      elif rows:
        said = f"a batch needs {rows[0]} packed rows: {said}"
      print(f"memory: {said}{held}", file=sys.stderr)
    memory.check_fits(needs)
    self.compiled[_shapes(batch)] = compiled
    if self.first is None:
      self.first, self.announced = compiled, needs
    return compiled

  def __call__(self, state, batch):
    compiled = self.compiled.get(_shapes(batch)) or self.compile(batch)
    return compiled(state, batch)


def _shapes(batch) -> tuple:
  return tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(batch))


def _check_finite(start_params: dict, config, source: str | None) -> None:
  """RunError naming the first starting parameter that holds a NaN or an infinity, and where
  it came from (`source`): trained from, it makes every loss non-finite, which the loop would
  put down to the data or the learning rate."""
  init = config.get("init") or {}
  given = next((f"config.init.{name}" for name in optim.INITS if init.get(name)), "config.init")
  found = first_nonfinite(start_params)
  if found:
    raise RunError(f"{given}: {source}: its parameter {found[0]} holds {found[1]}, expected "
                   f"finite weights to start from")


def _with_params(state, start_params: dict):
  """`state` with the subtrees of its parameters that `start_params` names (numpy or jax
  arrays of the same shapes and dtypes) in place of the fresh ones, laid out as those."""
  def place(new, old):
    if new.shape != old.shape or new.dtype != old.dtype:
      raise ValueError(f"a starting parameter of shape {new.shape} {new.dtype} replaces one of "
                       f"{old.shape} {old.dtype}")
    if isinstance(new, jax.Array):
      return jax.device_put(new, old.sharding)
    host = np.asarray(new)
    return jax.make_array_from_callback(host.shape, old.sharding, lambda index: host[index])

  placed = {name: jax.tree.map(place, tree, state.params[name])
            for name, tree in start_params.items()}
  return state.replace(params={**state.params, **placed})


def _resume_point(checkpointer: Checkpointer, config, allow_changes: bool, definition):
  """(step, meta) of the checkpoint to resume from, or None; RunError if the config differs
  from the one it records in a way that needs --allow_changes or cannot resume at all."""
  held = checkpointer.steps()
  newest = checkpointer.newest()
  if newest is None:
    set_aside = sorted(os.listdir(checkpointer.quarantine)) if os.path.isdir(
        checkpointer.quarantine) else []
    if held or set_aside:  # a run was here: starting over would overwrite its history
      raise RunError(
          f"--workdir {os.path.dirname(checkpointer.directory)}: no checkpoint of the run in "
          f"it verifies (steps {', '.join(set_aside)} are in {checkpointer.quarantine}, kept); "
          f"expected one to resume from: put back a sound copy, or remove "
          f"{checkpointer.quarantine} to start the run over, or use another --workdir")
    return None
  step, meta = newest
  changed = settings.check_resume(meta["config"], config, step, allow_changes, definition)
  if changed and jax.process_index() == 0:
    print(f"resuming with changed settings: {'; '.join(map(str, changed))}", file=sys.stderr)
  return newest


def _mesh(config) -> jax.sharding.Mesh:
  """The device mesh config.mesh describes, which must split config.train.batch_size."""
  try:
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp)
    sharding.check_batch_divisible(config.train.batch_size, mesh, "config.train.batch_size")
  except ValueError as e:
    raise RunError(str(e) if str(e).startswith("config.") else f"config.mesh: {e}") from None
  shards = mesh.shape["data"] * mesh.shape["fsdp"]
  microbatch = config.train.batch_size // config.train.grad_accum_steps
  if microbatch % shards:
    raise RunError(f"config.train.grad_accum_steps: {config.train.grad_accum_steps}, expected "
                   f"microbatches (batch_size / grad_accum_steps = {microbatch} rows) that "
                   f"split over the {shards} devices of the mesh")
  if mesh.size > 1:
    print(f"mesh: data={mesh.shape['data']} x fsdp={mesh.shape['fsdp']} over {mesh.size} "
          f"{jax.default_backend()} devices in {jax.process_count()} process(es)", file=sys.stderr)
  return mesh


# A loss that is not finite within this many steps of the start points at the data as much as
# at the learning rate.
_EARLY_STEPS = 10


def _non_finite(split: str, step: int, loss, checkpointer: Checkpointer, early: bool) -> RunError:
  steps = checkpointer.steps()
  kept = (f"the newest checkpoint, step {steps[-1]}, is kept" if steps else
          "no checkpoint was written")
  if split == "eval":
    advice = "check the held-out windows of the data"
  elif early:
    advice = ("this early, suspect the data (ids it should not hold) as much as too high a "
              "learning rate (config.optim.lr_scale, config.optim.clip_norm)")
  else:
    advice = "lower config.optim.lr_scale or set config.optim.clip_norm"
  return RunError(f"non-finite {split} loss {loss} at step {step}; stopped before it could reach "
                  f"a checkpoint: {kept}; {advice}", exit_code=1)
