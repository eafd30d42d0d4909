"""Where metrics go: metrics.jsonl (one JSON object per record) and TensorBoard event files."""

from __future__ import annotations

import json
import os


class MetricWriter:
  """Appends records {'step', 'split', ...metrics} to workdir/metrics.jsonl and TensorBoard."""

  def __init__(self, workdir: str):
    from tensorboardX import SummaryWriter

    self.path = os.path.join(workdir, "metrics.jsonl")
    self.tensorboard = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, split: str, metrics: dict) -> None:
    record = {"step": step, "split": split, **{k: float(v) for k, v in metrics.items()}}
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    for name, value in metrics.items():
      self.tensorboard.add_scalar(f"{split}/{name}", float(value), step)

  def truncate_after(self, step: int) -> None:
    """Drops records past `step`: a resumed run recomputes them (atomic rewrite)."""
    if not os.path.exists(self.path):
      return
    records = read_metrics(self.path)
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      for r in records:
        if r["step"] <= step:
          f.write(json.dumps(r) + "\n")
    os.replace(tmp, self.path)

  def close(self) -> None:
    self.tensorboard.close()


def read_metrics(path: str) -> list[dict]:
  """The records of a metrics.jsonl; a last line cut short by a kill is ignored."""
  records = []
  with open(path) as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return records
