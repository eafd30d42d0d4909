"""Progress a person can watch: the training bar moves at every finished step, the predict bar
has a total, and a plot of a single evaluation shows every line of it."""

import gzip
import json
import time

import numpy as np
from PIL import Image

from train.data import sources
from train.loop import _Progress
from train.run.plots import plot_run
from train.task import Plots


class _Bar:
  """What tqdm is told: the steps shown, and the figures beside them."""

  def __init__(self):
    self.n, self.postfix = 0, {}

  def update(self, n):
    self.n += n

  def set_postfix(self, postfix):
    self.postfix = dict(postfix)


class _Loss:
  """A step's loss on a slow device: computed only while the host waits for it."""

  def __init__(self):
    self.ready = False

  def is_ready(self):
    return self.ready


def _device(monkeypatch, steps: int) -> list[_Loss]:
  """The losses of `steps` steps; each sleep of the waiting host finishes the oldest one."""
  losses = [_Loss() for _ in range(steps)]

  def sleep(seconds):
    next(loss for loss in losses if not loss.ready).ready = True

  monkeypatch.setattr(time, "sleep", sleep)
  return losses


def test_the_bar_moves_at_every_step_however_far_ahead_the_loop_is(monkeypatch):
  bar = _Bar()
  progress = _Progress(None, bar, log_every=1000)
  progress.SHOW_EVERY_S = 0.0
  losses = _device(monkeypatch, 10)
  for step, loss in enumerate(losses, 1):
    progress.add(step, {"loss": loss}, tokens=64, data_wait_s=0.0)
    # The loop runs no more than IN_FLIGHT steps ahead: the older ones were waited for.
    assert bar.n == max(step - _Progress.IN_FLIGHT, 0)
    assert all(loss.ready for loss in losses[:bar.n])
  assert float(bar.postfix["tok_s"].replace(",", "")) > 0  # before any log step


def test_slow_steps_run_one_at_a_time_so_that_a_stop_waits_for_one_step(monkeypatch):
  bar = _Bar()
  progress = _Progress(None, bar, log_every=1000)
  progress.SLOW_STEP_S = 0.0  # every step counts as slow
  losses = _device(monkeypatch, 5)
  for step, loss in enumerate(losses, 1):
    progress.add(step, {"loss": loss}, tokens=64, data_wait_s=0.0)
    assert bar.n == step and loss.ready  # nothing left in flight when the loop reads a stop


def test_the_input_is_counted_for_the_predict_bar(tmp_path):
  lines = [json.dumps({"text": str(i)}) for i in range(7)]
  plain = tmp_path / "in.jsonl"
  plain.write_text("\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]) + "\n")
  packed = tmp_path / "in.jsonl.gz"
  packed.write_bytes(gzip.compress(plain.read_bytes()))
  for path in (plain, packed):
    source = sources.Source(str(path))
    assert source.count() == 7 == sum(1 for _ in source.records())


def test_a_single_evaluation_shows_its_scores_and_the_baseline(tmp_path):
  labels = Plots(loss_title="loss", loss_unit="nats", train_loss="train",
                 metrics={"accuracy": "accuracy"}, baseline=("baseline_accuracy", "baseline"))
  records = [{"split": "train", "step": s, "loss": 1 / s} for s in range(1, 20)]
  records.append({"split": "eval", "step": 19, "loss": 0.5, "accuracy": 0.6,
                  "baseline_accuracy": 0.3})
  _, accuracy, _ = plot_run(records, lambda s: np.full(np.shape(s), 1e-3), 20, str(tmp_path),
                            labels)
  pixels = np.asarray(Image.open(accuracy).convert("RGB"), np.int32)
  below_legend = pixels[pixels.shape[0] // 3:]  # the scores 0.6 and 0.3 of a 0-1 axis
  # matplotlib's first two colours: the score's marker, the baseline's (C0, C1)
  for colour in ((31, 119, 180), (255, 127, 14)):
    assert (np.abs(below_legend - colour).sum(-1) < 30).sum() > 10, colour
