"""Where metrics go: metrics.jsonl (one JSON object per record) and TensorBoard event files."""

from __future__ import annotations

import contextlib
import json
import os
import socket
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
    self._events = None  # TensorBoard's record writer over the event file, once opened

  def write(self, step: int, split: str, metrics: dict) -> None:
    # TensorBoard's own protos and record framing, written in this thread (no writer thread to
    # die) and without tensorboardX, whose import loads torch wherever torch is installed.
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    record = {"step": step, "split": split, **{k: float(v) for k, v in metrics.items()}}
    with self._writing(self.path), open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    with self._writing(self.tensorboard):
      if self._events is None:
        self._events = self._open_events()
      for name in metrics:
        summary = Summary(value=[Summary.Value(tag=f"{split}/{name}", simple_value=record[name])])
        self._events.write(Event(wall_time=time.time(), step=step,
                                 summary=summary).SerializeToString())
      self._events.flush()

  def _open_events(self):
    """A new event file named as TensorBoard looks for them, its first record the version."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter
    os.makedirs(self.tensorboard, exist_ok=True)
    name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
    events = RecordWriter(open(os.path.join(self.tensorboard, name), "wb"))
    events.write(Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
    return events

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
