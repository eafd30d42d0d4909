"""PNG plots of a run: loss, accuracy against the baseline, and the learning-rate schedule."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _series(records, split, key):
  rows = [(r["step"], r[key]) for r in records if r["split"] == split and key in r]
  return np.array(rows).T if rows else np.zeros((2, 0))


def plot_run(records: list[dict], schedule, num_steps: int, out_dir: str) -> list[str]:
  """Writes loss.png, accuracy.png and learning_rate.png; returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  paths = []

  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(*_series(records, "train", "loss"), label="train (label-smoothed)")
  ax.plot(*_series(records, "eval", "loss"), "o-", label="eval cross-entropy")
  ax.set(xlabel="step", ylabel="loss (nats / masked token)", title="Masked-token loss")
  ax.legend()
  paths.append(_save(fig, out_dir, "loss.png"))

  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(*_series(records, "eval", "accuracy"), "o-", label="masked-token accuracy")
  ax.plot(*_series(records, "eval", "baseline_accuracy"), "--",
          label="baseline: most frequent token")
  ax.set(xlabel="step", ylabel="accuracy", ylim=(0, 1), title="Eval accuracy")
  ax.legend()
  paths.append(_save(fig, out_dir, "accuracy.png"))

  fig, ax = plt.subplots(figsize=(6, 4))
  steps = np.arange(num_steps)
  ax.plot(steps + 1, np.asarray(schedule(steps)))
  ax.set(xlabel="step", ylabel="learning rate", title="Warm-up, then 1/sqrt(step)")
  paths.append(_save(fig, out_dir, "learning_rate.png"))
  return paths


def _save(fig, out_dir, name):
  path = os.path.join(out_dir, name)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
