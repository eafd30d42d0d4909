"""Training options: documents kept apart in packed windows, gradient accumulation, the
profiler hook, the step's memory checked before the first step, and a progress bar that counts
finished steps."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import runs, tiny
from train import loop
from train.data.tokens import PAD_ID, SEPARATOR_ID
from train.errors import RunError
from train.run import memory
from train.run.memory import step_memory
from train.tasks import masked_lm


def test_documents_are_told_apart_by_the_separators():
  a, b, sep, pad = 7, 9, SEPARATOR_ID, PAD_ID
  tokens = jnp.asarray([[a, a, sep, b, b, b, sep, a, pad, pad],
                        [sep, a, a, a, a, a, a, a, a, a]])
  ids = masked_lm.document_ids(tokens)
  np.testing.assert_array_equal(ids, [[1, 1, 1, 2, 2, 2, 2, 3, 0, 0],
                                      [1, 2, 2, 2, 2, 2, 2, 2, 2, 2]])
  from flax_encoder import segment_positions
  np.testing.assert_array_equal(segment_positions(ids)[0], [0, 1, 2, 0, 1, 2, 3, 0, 0, 1])


def _losses(config, k, steps=6):
  config.train.grad_accum_steps = k
  config, task, tx, schedule = tiny.setup(config)
  state = tiny.state(task, tx, config)
  batches = tiny.batches(config)
  from train.run.step import make_train_step
  step = jax.jit(make_train_step(task, tx, schedule, grad_accum_steps=k))
  losses = []
  for _ in range(steps):
    state, metrics = step(state, next(batches))
    losses.append(float(metrics["loss"]))
  return losses, state


def test_accumulating_gradients_over_microbatches_gives_the_same_losses():
  config = tiny.get_config()  # documents apart, as by default
  config.model.dropout = 0.0  # the same draws then, whatever the split
  reference, state = _losses(config, 1)
  for k in (2, 4):
    losses, other = _losses(config, k)
    np.testing.assert_allclose(losses, reference, rtol=1e-5)
    assert int(other.step) == int(state.step)


@pytest.mark.slow
def test_a_run_with_microbatches_resumes_exactly(tmp_path):
  def config(steps):
    c = tiny.get_config()
    c.train.update(num_steps=steps, grad_accum_steps=2, checkpoint_every=8)
    c.task.cross_document_attention = False
    return c

  assert loop.run(config(16), str(tmp_path / "straight")) == 0
  assert loop.run(config(8), str(tmp_path / "resumed")) == 0
  assert loop.run(config(16), str(tmp_path / "resumed")) == 0
  assert runs.losses(str(tmp_path / "resumed")) == runs.losses(str(tmp_path / "straight"))


def test_the_profiler_traces_the_steps_asked_for_and_marks_them(tmp_path, capsys):
  config = tiny.get_config()
  config.train.update(num_steps=8, profile_start=3, profile_steps=2)
  assert loop.run(config, str(tmp_path)) == 0
  traces = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "profile") for f in fs
            if f.endswith((".xplane.pb", ".trace.json.gz"))]
  assert traces, os.listdir(tmp_path)
  records = {r["step"]: r for r in runs.read_metrics(str(tmp_path / "metrics.jsonl"))
             if r["split"] == "train"}
  assert [s for s, r in records.items() if r.get("profiled")] == [3, 4]
  err = capsys.readouterr().err
  assert "profile of steps 3 to 4" in err and "memory: the training step needs" in err


def test_a_step_that_cannot_fit_stops_before_it_runs_with_both_figures(tmp_path, monkeypatch):
  monkeypatch.setattr(memory, "available_bytes", lambda: 1000)
  with pytest.raises(RunError) as e:
    loop.run(tiny.get_config(), str(tmp_path))
  message = str(e.value)
  assert "needs" in message and "1000" not in message and "0.0 MB available" in message
  assert "config.train.grad_accum_steps" in message and "remat" in message
  assert not os.listdir(tmp_path / "checkpoints")  # not one step ran
  assert not os.path.exists(tmp_path / "tensorboard")  # no empty event file either


def test_a_state_that_cannot_fit_is_refused_before_it_is_allocated(tmp_path, monkeypatch):
  config = tiny.get_config()
  sizes = {}

  def measured(compiled):  # the step's own figures, and room for the step but not the state
    needs = step_memory(compiled)
    sizes.update(state=needs.state, step=needs.step)
    return dataclasses.replace(needs, available=needs.step + needs.state // 2)

  def never(*_, **__):
    raise AssertionError("the state was allocated before the check")

  monkeypatch.setattr(memory, "step_memory", measured)
  monkeypatch.setattr(loop, "init_state", never)
  with pytest.raises(RunError) as e:
    loop.run(config, str(tmp_path))
  assert sizes["state"] > 0 and "does not fit" in str(e.value)
  assert "the state and a batch" in str(e.value) and "config.mesh.fsdp" in str(e.value)


class _Loss:
  def __init__(self, ready):
    self.ready = ready

  def is_ready(self):
    return self.ready


class _Bar:
  n = 0

  def update(self, k):
    self.n += k


def test_the_progress_bar_counts_finished_steps_not_dispatched_ones():
  bar = _Bar()
  progress = loop._Progress(None, bar, log_every=10)
  losses = [_Loss(False) for _ in range(3)]
  for step, loss in enumerate(losses, 1):
    progress.add(step, {"loss": loss}, 8, 0.0)
  assert bar.n == 0
  losses[0].ready = True
  progress.add(4, {"loss": _Loss(False)}, 8, 0.0)
  assert bar.n == 1  # step 1 is done; 2 to 4 are still running


def test_mfu_is_logged_where_the_device_peak_is_known(tmp_path, monkeypatch):
  from train.run import throughput
  assert throughput.device_peak("NVIDIA H100 80GB HBM3") == 989e12
  assert throughput.device_peak("cpu") is None
  config = tiny.get_config()
  config.train.num_steps, config.train.log_every = 4, 2
  monkeypatch.setattr(throughput, "flops_per_second_peak", lambda: 1e9)  # a slow device
  assert loop.run(config, str(tmp_path / "known")) == 0
  records = [r for r in runs.read_metrics(str(tmp_path / "known" / "metrics.jsonl"))
             if r["split"] == "train"]
  assert records and all(0 < r["mfu"] < 100 for r in records), records
  # Where the peak is unknown (a CPU) there is none: test_train's reference run.
