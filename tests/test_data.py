"""The training pipeline: an exact shuffle per epoch, each process's rows, resumable state."""

import numpy as np
import pytest

from train.data import pipeline
from train.errors import RunError


def _windows(n=40, seq=4):
  """Window i holds the id 4 + i everywhere, so a batch tells which windows it read."""
  return np.repeat(np.arange(4, 4 + n, dtype=np.uint16)[:, None], seq, axis=1)


def _read(iterator, count):
  return [next(iterator)[:, 0].astype(int) - 4 for _ in range(count)]


def test_every_epoch_is_a_new_permutation_of_the_windows():
  batches = _read(pipeline.TrainBatches(_windows(), 8, seed=0), 10)  # two epochs of 5 batches
  first, second = np.concatenate(batches[:5]), np.concatenate(batches[5:])
  assert sorted(first) == sorted(second) == list(range(40))
  assert (first != second).any()
  again = _read(pipeline.TrainBatches(_windows(), 8, seed=0), 10)
  np.testing.assert_array_equal(batches, again)  # deterministic
  assert (np.array(_read(pipeline.TrainBatches(_windows(), 8, seed=1), 10)) != batches).any()


def test_each_process_reads_its_rows_and_the_state_resumes_anywhere(tmp_path):
  path = tmp_path / "train.bin"
  _windows().tofile(path)
  mapped = np.memmap(path, np.uint16, "r", shape=(40, 4))
  whole = _read(pipeline.TrainBatches(mapped, 8, seed=0), 6)
  halves = [pipeline.TrainBatches(mapped, 8, seed=0, rows=slice(i * 4, i * 4 + 4)) for i in (0, 1)]
  for batch in whole:
    np.testing.assert_array_equal(np.concatenate([_read(h, 1)[0] for h in halves]), batch)
  resumed = pipeline.TrainBatches(mapped, 8, seed=0)
  resumed.set_state(halves[0].get_state())
  assert halves[0].get_state() == {"batches": 6}
  np.testing.assert_array_equal(_read(resumed, 1)[0], _read(pipeline.TrainBatches(
      mapped, 8, seed=0), 7)[-1])
  resumed.close()
  resumed.close()  # idempotent
  with pytest.raises(ValueError, match="after close"):
    next(resumed)


def test_pipeline_errors_name_the_setting():
  with pytest.raises(RunError, match="config.train.batch_size: 64, expected at most the 40 "
                     "training rows"):
    pipeline.TrainBatches(_windows(), 64, seed=0)
  with pytest.raises(RunError, match="config.data.workers: -1, expected an integer >= 0"):
    pipeline.TrainBatches(_windows(), 8, seed=0, workers=-1)
  with pytest.raises(RunError, match=r"data position \{'next_index': 3\} is not a count"):
    pipeline.TrainBatches(_windows(), 8, seed=0).set_state({"next_index": 3})
