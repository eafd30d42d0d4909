"""A run is never lost or corrupted by a mistake: one run per workdir, resume that refuses a
changed run instead of discarding it, configs and data checked before the first step, and one
line (no traceback) for each mistake or failing resource."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import chex
import jax
import numpy as np
import pytest

from tests import runs, tiny
from train.run.metrics import read_metrics


def _one_error_line(result, *words):
  """The run failed with exit code 2 and one `error:` line holding `words`, no traceback."""
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1, result.stderr[-3000:]
  for word in words:
    assert word in errors[0], errors[0]
  return errors[0]


def _records(workdir):
  return read_metrics(os.path.join(workdir, "metrics.jsonl"))


def _tree(directory):
  """Every file below `directory` with its size: what a run must leave untouched."""
  return {os.path.relpath(os.path.join(d, f), directory): os.path.getsize(os.path.join(d, f))
          for d, _, fs in os.walk(directory) for f in fs}


# --- One run per workdir --------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_run_on_the_same_workdir_exits_at_once_naming_the_first(tmp_path):
  workdir = str(tmp_path / "run")
  first = runs.train(workdir, "--config.train.num_steps=100000", popen=True)
  runs.wait_for_step(workdir, 2)
  second = runs.train(workdir, check=False)
  _one_error_line(second, f"--workdir {workdir}", f"pid {first.pid}", os.uname().nodename)
  assert second.returncode == 2
  first.send_signal(signal.SIGTERM)
  assert first.wait(timeout=runs.limit(120)) == 143
  steps = [r["step"] for r in _records(workdir) if r["split"] == "train"]
  assert steps == sorted(set(steps))  # one run's records, in order, none twice
  # The lock dies with its holder: after kill -9, the next run takes the workdir.
  third = runs.train(workdir, "--config.train.num_steps=100000", popen=True)
  runs.wait_for_step(workdir, max(steps) + 1)
  third.kill()
  third.wait()
  assert "resumed from the checkpoint" in runs.train(workdir).stderr


# --- Resume refuses instead of discarding ---------------------------------------------------


@pytest.fixture(scope="module")
def eight_steps(tmp_path_factory):
  """A workdir holding a run of the tiny config stopped at its checkpoint of step 8 (made once
  for all pytest-xdist workers: each test copies it)."""
  workdir, _ = runs.once_per_session(
      tmp_path_factory, "eight_steps",
      lambda directory: runs.train(directory, "--config.train.num_steps=8").returncode)
  return workdir


def test_resume_with_another_model_size_is_refused_and_moves_nothing(eight_steps, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(eight_steps, workdir)
  before = _tree(workdir)
  result = runs.train(workdir, "--config.model.d_model=32", check=False)
  assert result.returncode == 2
  _one_error_line(result, "config.model.d_model", "32", "16", "step 8")
  assert _tree(workdir) == before  # nothing moved aside, nothing written
  assert not os.path.exists(os.path.join(workdir, "checkpoints_corrupt"))
  # Back to the run's own config, it resumes where it was.
  result = runs.train(workdir, "--config.train.num_steps=10")
  assert "resumed from the checkpoint at step 8" in result.stderr


def test_a_run_whose_checkpoints_all_fail_verification_is_not_started_over(eight_steps,
                                                                          tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(eight_steps, workdir)
  state = os.path.join(workdir, "checkpoints", "8", "state")
  path = max((os.path.join(d, f) for d, _, fs in os.walk(state) for f in fs),
             key=os.path.getsize)
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    f.write(bytes(64))
  history = open(os.path.join(workdir, "metrics.jsonl")).read()
  for _ in range(2):  # the second start finds the checkpoint moved aside: still no
    result = runs.train(workdir, check=False)
    assert result.returncode == 2
    _one_error_line(result, f"--workdir {workdir}", "no checkpoint", "verifies", "steps 8",
                    "checkpoints_corrupt")
    assert open(os.path.join(workdir, "metrics.jsonl")).read() == history  # kept
  assert os.listdir(os.path.join(workdir, "checkpoints_corrupt")) == ["8"]


def test_settings_that_change_the_run_need_allow_changes_others_may_change(eight_steps,
                                                                          tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(eight_steps, workdir)
  for override, shown in (("--config.train.batch_size=4", "8"),
                          ("--config.optim.lr_scale=1.0", "2.0"),
                          ("--config.train.seed=1", "0")):
    result = runs.train(workdir, override, check=False)
    assert result.returncode == 2
    line = _one_error_line(result, override[len("--"):].split("=")[0], shown, "--allow_changes")
    assert "step 8" in line
  result = runs.train(workdir, "--config.optim.lr_scale=1.0", "--allow_changes",
                      "--config.train.num_steps=10", "--config.train.log_every=2",
                      "--config.train.keep_checkpoints=2")
  assert "resumed from the checkpoint at step 8" in result.stderr
  assert "config.optim.lr_scale: 1.0 (the checkpoint has 2.0)" in result.stderr  # said, once


def test_a_corpus_changed_since_it_was_prepared_is_refused(tmp_path):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("a corpus of my own, long enough for a few windows. " * 60)
  workdir = str(tmp_path / "run")
  runs.train(workdir, f"--config.data.paths=('{corpus}',)", "--config.train.num_steps=8",
             "--config.train.batch_size=4")
  corpus.write_text("the same file with other words in it now, long enough too. " * 60)
  before = _tree(workdir)
  result = runs.train(workdir, f"--config.data.paths=('{corpus}',)",
                      "--config.train.batch_size=4", check=False)
  assert result.returncode == 2
  _one_error_line(result, "config.data.paths", str(corpus), "changed", "--allow_changes")
  assert _tree(workdir) == before
  result = runs.train(workdir, f"--config.data.paths=('{corpus}',)", "--allow_changes",
                      "--config.train.batch_size=4", "--config.train.num_steps=10")
  assert "resumed from the checkpoint at step 8" in result.stderr


# --- Configs checked before anything is built -----------------------------------------------


@pytest.mark.parametrize("field, value, expected", [
    ("train.num_steps", 0, "an integer >= 1"),
    ("train.num_steps", -5, "an integer >= 1"),
    ("train.checkpoint_every", 0, "an integer >= 1"),
    ("train.log_every", 0, "an integer >= 1"),
    ("train.eval_every", 0, "an integer >= 1"),
    ("train.keep_checkpoints", 0, "an integer >= 1"),
    ("train.batch_size", 0, "an integer >= 1"),
    ("data.workers", -1, "an integer >= 0"),
    ("task.mask_rate", 0.0, "a number in (0, 1]"),
    ("optim.warmup_steps", 0, "an integer >= 1"),
    ("optim.lr_scale", -1.0, "a number > 0"),
    ("optim.label_smoothing", 1.0, "a number in [0, 1)"),
    ("model.d_model", 15, "divisible by n_heads"),
    ("model.attention_impl", "flash", "one of"),
])
def test_every_field_is_checked_with_one_line_naming_it(field, value, expected):
  from train import tasks
  from train.errors import RunError
  config = tiny.get_config()
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(RunError) as e:
    tasks.checked(config)
  assert str(e.value).startswith(f"config.{field}: {value!r}") and expected in str(e.value)
  assert "\n" not in str(e.value)


def test_bad_configs_stop_before_anything_is_built(tmp_path):
  workdir = tmp_path / "run"
  result = runs.train(str(workdir), "--config.train.num_steps=0", check=False)
  assert result.returncode == 2
  _one_error_line(result, "config.train.num_steps: 0", "an integer >= 1")
  assert not workdir.exists() or not os.listdir(workdir)
  for override, words in (("--config.train.nonexistent=1", ("--config.train.nonexistent",
                                                             "no such field")),
                          ("--config.train.num_step=1", ("num_step", 'Did you mean "num_steps"'))):
    result = runs.train(str(workdir), override, check=False)
    assert result.returncode == 2
    _one_error_line(result, *words)
  (tmp_path / "broken.py").write_text("x = \n")
  # a file whose code raises as it is imported: a traceback and exit 1 it was
  (tmp_path / "raising.py").write_text("raise RuntimeError('the cluster is not reachable')\n")
  for config, words in ((str(tmp_path / "missing.py"), ("missing.py", "No such file")),
                        (str(tmp_path / "broken.py"), ("broken.py", "line 1", "invalid syntax")),
                        (str(tmp_path / "raising.py"),
                         ("raising.py", "RuntimeError: the cluster is not reachable")),
                        (f"{runs.TINY}:extra", ("tiny.py:extra", "get_config() takes 0"))):
    result = runs.train(str(workdir), config=config, check=False)
    assert result.returncode == 2
    _one_error_line(result, "--config", *words)


@pytest.mark.parametrize("impl, backend", [("cudnn", "gpu"), runs.triton("triton", "gpu"),
                                           ("splash", "tpu")])
def test_an_attention_kernel_this_backend_cannot_run_is_one_line(tmp_path, impl, backend):
  if jax.default_backend() == backend:
    pytest.skip(f"this machine runs {impl}")
  result = runs.train(str(tmp_path / "run"), f"--config.model.attention_impl={impl}",
                      "--config.model.dtype=bfloat16", check=False)
  assert result.returncode == 2
  _one_error_line(result, f"config.model.attention_impl: {impl!r} needs", "'xla'")


# --- Prepared data verified on load ---------------------------------------------------------


@pytest.fixture
def prepared(tmp_path):
  from train.data import prepare
  directory = str(tmp_path / "prepared")
  prepare.prepare([prepare.BUILTIN], directory, seq_len=32, eval_fraction=0.05, progress=False)
  return directory


def _set_id(path, index, value):
  ids = np.memmap(path, np.uint16, "r+")
  ids[index] = value
  ids.flush()


@pytest.mark.parametrize("damage, words", [
    ("flip a high bit in eval.bin", ("eval.bin", "32", "outside the vocabulary of 260")),
    ("an id past the vocabulary in train.bin", ("train.bin", "300", "outside the vocabulary")),
    ("a smaller vocab_size in dataset.json", ("train.bin", "outside the vocabulary of 100")),
    ("dataset.json that is not JSON", ("dataset.json", "not valid JSON")),
])
def test_corrupt_prepared_data_is_one_line_at_start(prepared, tmp_path, damage, words):
  if damage.startswith("flip"):
    path = os.path.join(prepared, "eval.bin")
    ids = np.memmap(path, np.uint16, "r+")
    ids[5] ^= 1 << 15
    ids.flush()
  elif damage.startswith("an id"):
    _set_id(os.path.join(prepared, "train.bin"), 1000, 300)
  else:
    path = os.path.join(prepared, "dataset.json")
    text = open(path).read()
    if "smaller" in damage:
      meta = json.loads(text)
      meta["vocab_size"] = 100
      text = json.dumps(meta)
    else:
      text = text[:len(text) // 2]
    open(path, "w").write(text)
  result = runs.train(str(tmp_path / "run"), f"--config.data.prepared={prepared}", check=False)
  assert result.returncode == 2
  _one_error_line(result, *words)
  checkpoints = tmp_path / "run" / "checkpoints"  # stopped before the first step
  assert not (checkpoints.exists() and os.listdir(checkpoints))
  assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")


def test_a_non_finite_eval_loss_stops_the_run(tmp_path, monkeypatch):
  from train import loop
  from train.errors import RunError
  evaluate = loop.evaluate

  def poisoned(*args):
    sums = evaluate(*args)
    return {**sums, "ce": float("nan")}

  monkeypatch.setattr(loop, "evaluate", poisoned)
  config = tiny.get_config()
  config.train.num_steps = 16
  with pytest.raises(RunError, match=r"non-finite eval loss nan at step 15.*the newest "
                     r"checkpoint, step 8, is kept"):
    loop.run(config, str(tmp_path))
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["8"]


def test_the_non_finite_loss_message_tells_the_truth_about_checkpoints(tmp_path):
  # A rate of 1e30 overflows the weights at once: no checkpoint was ever written.
  result = runs.train(str(tmp_path / "run"), "--config.optim.lr_scale=1e30", check=False)
  assert result.returncode == 1
  line = _one_error_line_any_code(result, "non-finite training loss")
  assert "no checkpoint was written" in line and "data" in line and "untouched" not in line


def _one_error_line_any_code(result, *words):
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert all(word in errors[0] for word in words), errors[0]
  return errors[0]


# --- metrics.jsonl consistent with the checkpoints -------------------------------------------


@pytest.mark.slow
def test_kill_9_before_the_first_checkpoint_leaves_no_duplicate_records(tmp_path):
  workdir = str(tmp_path / "run")
  proc = runs.train(workdir, "--config.train.checkpoint_every=1000", popen=True)
  runs.wait_for_step(workdir, 5)
  proc.kill()
  proc.wait()
  runs.train(workdir, "--config.train.checkpoint_every=1000")
  steps = [(r["step"], r["split"]) for r in _records(workdir)]
  assert len(steps) == len(set(steps))
  assert [s for s, split in steps if split == "train"] == list(range(1, 31))


# --- The launcher's children die with it ----------------------------------------------------


@pytest.mark.slow
def test_killing_the_launcher_stops_its_processes_within_seconds(tmp_path):
  workdir = str(tmp_path / "run")
  cmd = [sys.executable, "-m", "train.launch", "--processes", "2", "--devices-per-process", "1",
         "--", f"--config={runs.TINY}", f"--workdir={workdir}", "--config.train.num_steps=100000"]
  launcher = subprocess.Popen(cmd, cwd=runs.ROOT, env=runs.environment(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  runs.wait_for_step(workdir, 3)
  children = _children(launcher.pid)
  assert len(children) == 2
  launcher.kill()
  launcher.wait()
  deadline = time.time() + runs.limit(60)
  while any(_alive(pid) for pid in children) and time.time() < deadline:
    time.sleep(0.2)
  assert not any(_alive(pid) for pid in children), "the launcher's processes outlived it"
  err = launcher.stderr.read()
  assert err.count("launcher") >= 1 and "died" in err, err[-2000:]


def _children(parent):
  pids = []
  for entry in os.listdir("/proc"):
    try:
      with open(f"/proc/{entry}/stat") as f:
        if int(f.read().split(")")[-1].split()[1]) == parent:
          pids.append(int(entry))
    except (OSError, ValueError):
      continue
  return pids


def _alive(pid):
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(")")[-1].split()[0] != "Z"
  except FileNotFoundError:
    return False


# --- Disk full, read-only, workdir is a file, remote workdirs -------------------------------


def _with_file_size_limit(limit, *args):
  """`python -m train args` with every file it writes limited to `limit` bytes: a write past
  it fails with EFBIG (Python ignores SIGXFSZ), as one past a full disk fails with ENOSPC."""
  code = ("import resource, runpy, sys\n"
          f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
          f"sys.argv = ['train', *{list(args)!r}]\n"
          "runpy.run_module('train', run_name='__main__')")
  return [sys.executable, "-c", code]


@pytest.mark.slow
def test_a_save_that_cannot_be_written_is_one_line_and_loses_nothing(eight_steps, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(eight_steps, workdir)
  # Every file is limited to 20 KB, as a full disk would stop it: the next checkpoint's
  # arrays do not fit; metrics and events do. (No compilation cache: its files are larger.)
  cmd = _with_file_size_limit(20 << 10, f"--config={runs.TINY}", f"--workdir={workdir}",
                              "--config.train.num_steps=16")
  env = {k: v for k, v in runs.environment().items() if not k.startswith("JAX_")}
  result = subprocess.run(cmd, cwd=runs.ROOT, env=env, capture_output=True, text=True,
                          timeout=runs.limit(300))
  assert result.returncode == 1
  line = _one_error_line_any_code(result, "checkpoint", os.strerror(errno.EFBIG))
  assert "step 8" in line
  assert len(result.stderr) < 4000, result.stderr[-4000:]  # no pages of orbax tracebacks
  assert [d for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit()] == ["8"]
  # The next start cleans up the half-written checkpoint and resumes from step 8 exactly.
  result = runs.train(workdir, "--config.train.num_steps=16")
  assert "resumed from the checkpoint at step 8" in result.stderr
  assert not [d for d in os.listdir(os.path.join(workdir, "checkpoints")) if "tmp" in d]
  reference = str(tmp_path / "reference")
  shutil.copytree(eight_steps, reference)
  runs.train(reference, "--config.train.num_steps=16")
  assert runs.losses(workdir) == runs.losses(reference)


def test_metrics_on_a_full_disk_stop_the_run_with_one_line_naming_them(eight_steps, tmp_path):
  # The TensorBoard events alone cannot be written: a writer thread would die there and leave
  # the loop waiting on its queue for ever, deaf to Ctrl-C.
  workdir = str(tmp_path / "run")
  shutil.copytree(eight_steps, workdir)
  shutil.rmtree(os.path.join(workdir, "tensorboard"))
  with runs.full_file_system(os.path.join(workdir, "tensorboard")):
    result = runs.train(workdir, "--config.train.num_steps=16", check=False)
  assert result.returncode == 1
  _one_error_line_any_code(result, f"{workdir}/tensorboard: cannot write the run's metrics",
                           os.strerror(errno.ENOSPC))
  assert "resumed from the checkpoint at step 8" in runs.train(workdir).stderr


def test_a_workdir_that_is_a_file_or_a_url_is_one_line(tmp_path):
  path = tmp_path / "a-file"
  path.write_text("not a directory")
  _one_error_line(runs.train(str(path), check=False), f"--workdir {path}", "not a directory")
  _one_error_line(runs.train("gs://bucket/run", check=False), "--workdir gs://bucket/run",
                  "mount")


def test_a_read_only_workdir_names_the_cause(eight_steps, tmp_path):
  mount = tmp_path / "ro"
  mount.mkdir()
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)],
                    capture_output=True).returncode != 0:
    pytest.skip("cannot mount a file system here to make read-only")
  try:
    workdir = str(mount / "run")
    shutil.copytree(eight_steps, workdir)
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    result = runs.train(workdir, check=False)
    _one_error_line_any_code(result, f"--workdir {workdir}", os.strerror(errno.EROFS))
    assert "remove" not in result.stderr
  finally:
    subprocess.run(["umount", str(mount)], check=False)


# --- Readers fall back, PyTorch files that are not checkpoints ------------------------------


def test_load_encoder_and_export_fall_back_past_an_incomplete_newest_checkpoint(
    reference_run, tmp_path):
  from train.outputs.export import export
  from train.run.load import load_encoder
  workdir, older = str(tmp_path / "run"), str(tmp_path / "older")
  shutil.copytree(reference_run, workdir)
  shutil.copytree(reference_run, older)
  newest = os.path.join(workdir, "checkpoints", "30")
  os.remove(os.path.join(newest, "meta", "metadata"))  # incomplete: a file missing
  shutil.rmtree(os.path.join(older, "checkpoints", "30"))
  _, variables = load_encoder(workdir)
  _, expected = load_encoder(older)  # step 24's
  chex.assert_trees_all_equal(jax.device_get(variables), jax.device_get(expected))
  assert os.path.isdir(newest)  # a reader moves nothing
  path = export(workdir, str(tmp_path / "encoder.msgpack"))
  assert os.path.getsize(path) > 1000


def test_a_pt_file_that_is_no_pickle_is_named(tmp_path):
  pytest.importorskip("torch")
  from flax_encoder.pytorch import load_torch_checkpoint
  path = tmp_path / "model.pt"
  path.write_text("e" * 200)
  with pytest.raises(ValueError, match=r"model.pt' is not a PyTorch checkpoint"):
    load_torch_checkpoint(path)
