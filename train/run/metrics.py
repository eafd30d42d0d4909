"""Where metrics go: metrics.jsonl (one JSON object per record) and TensorBoard event files."""

from __future__ import annotations

import contextlib
import json
import os
import time

from train.errors import RunError


class MetricWriter:
  """Appends records {'step', 'split', ...metrics} to workdir/metrics.jsonl and to a TensorBoard
  event file, in the calling thread: a write that fails (a full disk) is a RunError naming the
  file, never a writer thread that dies and leaves the loop waiting on its queue. The event
  file is opened at the first record, so a start killed before one leaves none."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.tensorboard = os.path.join(workdir, "tensorboard")
    self._events = None  # tensorboardX's synchronous event file writer, once opened

  def write(self, step: int, split: str, metrics: dict) -> None:
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.summary import scalar

    record = {"step": step, "split": split, **{k: float(v) for k, v in metrics.items()}}
    with self._writing(self.path), open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    with self._writing(self.tensorboard):
      if self._events is None:
        from tensorboardX.event_file_writer import EventsWriter
        os.makedirs(self.tensorboard, exist_ok=True)
        self._events = EventsWriter(os.path.join(self.tensorboard, "events"))
      for name, value in metrics.items():
        self._events.write_event(Event(wall_time=time.time(), step=step,
                                       summary=scalar(f"{split}/{name}", float(value))))
      self._events.flush()

  @contextlib.contextmanager
  def _writing(self, path: str):
    try:
      yield
    except OSError as e:
      self.close()  # the event file is not written to again
      raise RunError(f"{path}: cannot write the run's metrics ({e.strerror or e})",
                     exit_code=1) from None

  def truncate_after(self, step: int) -> None:
    """Drops records past `step`: a resumed run recomputes them (atomic rewrite)."""
    if not os.path.exists(self.path):
      return
    records = read_metrics(self.path)
    tmp = self.path + ".tmp"
    with self._writing(self.path):
      with open(tmp, "w") as f:
        for r in records:
          if r["step"] <= step:
            f.write(json.dumps(r) + "\n")
      os.replace(tmp, self.path)

  def close(self) -> None:
    if self._events is not None:
      events, self._events = self._events, None
      with contextlib.suppress(OSError):  # the records are flushed as written
        events.close()


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
