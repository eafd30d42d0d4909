"""PNG plots of a run: loss, held-out scores against the baseline, and the learning-rate
schedule, labelled as the task says (`train.task.Plots`)."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from train.task import Plots  # noqa: E402


def _series(records, split, key):
  rows = [(r["step"], r[key]) for r in records if r["split"] == split and key in r]
  return np.array(rows).T if rows else np.zeros((2, 0))


_SCHEDULE_TITLES = {"paper": "Warm-up, then 1/sqrt(step)",
                   "adamw": "Linear warm-up, then linear decay"}


def plot_run(records: list[dict], schedule, num_steps: int, out_dir: str, labels: Plots,
             recipe: str = "paper") -> list[str]:
  """Writes loss.png, accuracy.png and learning_rate.png, titled and labelled for the task
  (`labels`, its definition's); returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  paths = []

  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(*_series(records, "train", "loss"), label=labels.train_loss)
  ax.plot(*_series(records, "eval", "loss"), "o-", label=labels.eval_loss)
  if labels.loss_baseline:
    metric, label = labels.loss_baseline
    ax.plot(*_series(records, "eval", metric), "x--", label=label)
  ax.set(xlabel="step", ylabel=f"loss ({labels.loss_unit})", title=labels.loss_title,
         xlim=(0, num_steps))
  ax.legend()
  paths.append(_save(fig, out_dir, "loss.png"))

  fig, ax = plt.subplots(figsize=(6, 4))
  for metric, label in labels.metrics.items():
    ax.plot(*_series(records, "eval", metric), "o-", label=label)
  if labels.baseline:  # marked, as the scores are: a single evaluation is a point, no line
    metric, label = labels.baseline
    ax.plot(*_series(records, "eval", metric), "x--", label=label)
  ax.set(xlabel="step", ylabel="held-out score", ylim=labels.score_range,
         title=labels.accuracy_title, xlim=(0, num_steps))
  ax.legend()
  paths.append(_save(fig, out_dir, "accuracy.png"))

  fig, ax = plt.subplots(figsize=(6, 4))
  steps = np.arange(num_steps)
  ax.plot(steps + 1, np.asarray(schedule(steps)))
  ax.set(xlabel="step", ylabel="learning rate", title=_SCHEDULE_TITLES.get(recipe, recipe))
  paths.append(_save(fig, out_dir, "learning_rate.png"))
  return paths


def _save(fig, out_dir, name):
  path = os.path.join(out_dir, name)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
