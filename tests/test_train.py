"""The training program: schedule, step, learning, checkpoints, exact resume, signals, NaN."""

import json
import os
import shutil
import signal
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests import runs, tiny
from train.data import dataset, tokens
from train.errors import RunError
from train.run import settings
from train.run.checkpoint import MANIFEST, Checkpointer, checkpoint_files, verify_share
from train.run.metrics import read_metrics
from train.run.optim import paper_schedule


def test_schedule_matches_the_paper_formula_counting_from_one():
  d_model, warmup = 512, 4000
  schedule = paper_schedule(d_model, warmup, lr_scale=2.0)
  formula = lambda step: 2.0 * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
  for step in (1, warmup, 10 * warmup):
    # optax passes the number of updates done: step - 1.
    np.testing.assert_allclose(schedule(step - 1), formula(step), rtol=1e-6)
  assert schedule(0) > 0  # the first update does not run at lr 0
  np.testing.assert_allclose(schedule(warmup - 1), 2.0 * (d_model * warmup) ** -0.5, rtol=1e-6)
  assert schedule(warmup - 2) < schedule(warmup - 1) > schedule(warmup)


def test_byte_tokenizer_round_trips_utf8():
  assert tokens.decode_bytes(tokens.encode_bytes("héllo")) == "héllo"


@pytest.fixture(scope="module")
def tiny_step():
  """(config, task, tx, schedule, jitted step) of the tiny config, traced and compiled once for
  the tests here that take steps by hand (each starts from a state of its own)."""
  config, task, tx, schedule = tiny.setup()
  return config, task, tx, schedule, tiny.jitted_step(task, tx, schedule)


def test_one_train_step(tiny_step):
  config, task, tx, schedule, step = tiny_step
  state = tiny.state(task, tx, config)
  batch = next(tiny.batches(config))
  chex.assert_shape(batch, (config.train.batch_size, config.train.seq_len))
  new_state, metrics = step(state, batch)
  assert int(new_state.step) == 1
  assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
  np.testing.assert_allclose(metrics["lr"], schedule(0))
  changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), state.params, new_state.params)
  assert all(jax.tree.leaves(changed))
  # The uniform prediction of 260 classes costs ln(260) = 5.56 nats before smoothing.
  assert 4.5 < float(metrics["loss"]) < 7.0


def test_checkpoint_round_trip_is_bitwise(tiny_step, tmp_path):
  config, task, tx, _, step = tiny_step
  state = tiny.state(task, tx, config)
  iterator = tiny.batches(config)
  for _ in range(3):  # Adam's moments are non-zero after a few updates
    state, _ = step(state, next(iterator))
  checkpointer = Checkpointer(str(tmp_path / "checkpoints"), keep=2)
  checkpointer.save(3, state, iterator, {})
  checkpointer.wait()
  expected_next = next(iterator)

  fresh = tiny.state(task, tx, config, seed=1)
  fresh_iterator = tiny.batches(config)  # the same pipeline, at its start
  restored, meta = Checkpointer(str(tmp_path / "checkpoints"), keep=2).restore_newest(
      fresh, fresh_iterator)
  assert meta["step"] == 3 and int(restored.step) == 3
  chex.assert_trees_all_equal(restored, state)  # params, Adam mu/nu, step, rng
  mu = restored.opt_state[0].mu
  assert any(bool(jnp.any(x != 0)) for x in jax.tree.leaves(mu))
  chex.assert_trees_all_equal(next(fresh_iterator), expected_next)


def _corrupt_one_file(directory):
  data_files = [os.path.join(d, f) for d, _, fs in os.walk(directory) for f in fs
                if os.path.getsize(os.path.join(d, f)) > 256]
  path = max(data_files, key=os.path.getsize)
  raw = bytearray(open(path, "rb").read())
  raw[len(raw) // 2: len(raw) // 2 + 64] = bytes(64)  # flip a stretch in the middle
  open(path, "wb").write(bytes(raw))


def test_uninterrupted_run_learns_and_writes_its_outputs(reference_run):
  losses = runs.losses(reference_run)
  assert sorted(losses) == list(range(1, 31))
  assert not any("mfu" in r for r in read_metrics(os.path.join(reference_run, "metrics.jsonl")))
  assert np.mean([losses[s] for s in range(26, 31)]) < np.mean([losses[s] for s in range(1, 6)])
  records = read_metrics(os.path.join(reference_run, "metrics.jsonl"))
  evals = [r for r in records if r["split"] == "eval"]
  assert [r["step"] for r in evals] == [15, 30]
  assert set(evals[-1]) >= {"loss", "accuracy", "baseline_accuracy"}
  assert evals[-1]["loss"] < evals[0]["loss"]
  first_train = next(r for r in records if r["split"] == "train")
  assert {"loss", "lr", "grad_norm", "tokens_per_s", "data_wait_s",
          "data_wait_fraction"} <= set(first_train)
  assert 0 <= first_train["data_wait_fraction"] < 1
  for name in ("loss.png", "accuracy.png", "learning_rate.png"):
    assert os.path.getsize(os.path.join(reference_run, "plots", name)) > 1000
  assert os.listdir(os.path.join(reference_run, "tensorboard"))
  # TensorBoard's own reader finds every logged value, at its step, in the event file.
  events = EventAccumulator(os.path.join(reference_run, "tensorboard"))
  events.Reload()
  for split, key in (("train", "loss"), ("train", "lr"), ("eval", "accuracy")):
    logged = [(r["step"], r[key]) for r in records if r["split"] == split]
    read = [(e.step, e.value) for e in events.Scalars(f"{split}/{key}")]
    assert [s for s, _ in read] == [s for s, _ in logged]
    np.testing.assert_allclose([v for _, v in read], [v for _, v in logged], rtol=1e-6)
  assert sorted(os.listdir(os.path.join(reference_run, "checkpoints"))) == ["16", "24", "30", "8"]


@pytest.mark.slow
def test_kill_9_and_restart_gives_the_same_losses_bit_for_bit(reference_run, tmp_path):
  workdir = str(tmp_path)
  proc = runs.train(workdir, popen=True)
  runs.wait_for_step(workdir, 19)
  proc.kill()  # SIGKILL: no handler runs
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  killed_at = max(runs.losses(workdir))
  assert 19 <= killed_at < 30
  result = runs.train(workdir)
  assert "resumed from the checkpoint at step" in result.stderr
  assert runs.losses(workdir) == runs.losses(reference_run)  # exact float equality, every step


@pytest.mark.slow
def test_sigterm_saves_at_the_step_reached_then_resumes_with_other_data_workers(
    reference_run, tmp_path):
  # Two grain worker processes, then one after the restart; the reference run read in-process.
  workdir = str(tmp_path)
  proc = runs.train(workdir, "--config.data.workers=2", popen=True)
  runs.wait_for_step(workdir, 3)
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=runs.limit(120))
  assert proc.returncode == 143, stderr[-2000:]
  stopped_at = max(runs.losses(workdir))
  assert stopped_at < 30
  assert str(stopped_at) in os.listdir(os.path.join(workdir, "checkpoints"))
  runs.train(workdir, "--config.data.workers=1")
  assert runs.losses(workdir) == runs.losses(reference_run)


def test_a_signal_landing_late_in_a_step_still_saves_the_step_that_stops(tmp_path, monkeypatch,
                                                                         capfd):
  # The signal arrives while step 5 logs its metrics, after the step decided whether to save.
  from train import loop
  write = loop.MetricWriter.write

  def write_then_signal(self, step, split, values):
    write(self, step, split, values)
    if step == 5 and split == "train":
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(loop.MetricWriter, "write", write_then_signal)
  exit_code = loop.run(tiny.get_config(), str(tmp_path))
  assert exit_code == 143
  stopped_at = max(runs.losses(str(tmp_path)))
  assert stopped_at == 6  # the next step sees the signal, saves and stops
  assert os.listdir(tmp_path / "checkpoints") == [str(stopped_at)]
  # said when it lands, not only once the step in flight is done
  assert "SIGTERM: stopping after the step in flight, with a checkpoint" in capfd.readouterr().err


def test_the_starts_evaluation_is_printed_and_a_signal_during_it_stops_before_a_step(
    tmp_path, monkeypatch, capfd):
  """The figures training starts from (train.eval_at_start) are a line of their own; a SIGTERM
  while they are computed stopped nothing until a step had trained, with no word."""
  from train import loop
  config = tiny.get_config()
  config.train.eval_at_start = True
  write = loop.MetricWriter.write

  def write_then_signal(self, step, split, values):
    write(self, step, split, values)
    if step == 0 and split == "eval":
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(loop.MetricWriter, "write", write_then_signal)
  assert loop.run(config, str(tmp_path)) == 143
  out, err = capfd.readouterr()
  start = [r for r in read_metrics(str(tmp_path / "metrics.jsonl")) if r["split"] == "eval"]
  assert out.startswith("step 0, before training: eval masked-token accuracy")
  assert out.rstrip().endswith(f"eval loss {start[0]['loss']:.3f}")
  assert "stopped by signal 15 before the first step; nothing trained or saved" in err
  assert runs.losses(str(tmp_path)) == {} and not os.listdir(tmp_path / "checkpoints")


def test_corrupt_newest_checkpoint_falls_back_to_an_older_one(reference_run, tiny_step,
                                                              tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(reference_run, workdir)
  _corrupt_one_file(os.path.join(workdir, "checkpoints", "30", "state"))
  config, task, tx, _, _ = tiny_step
  abstract = tiny.state(task, tx, config)
  checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), keep=5)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    state, meta = checkpointer.restore_newest(abstract)
  messages = [str(w.message) for w in caught if "step 30" in str(w.message)]
  assert messages and any(("corrupt" in m) or ("checksum" in m) for m in messages)
  assert meta["step"] == 24 and int(state.step) == 24
  assert os.path.isdir(os.path.join(workdir, "checkpoints_corrupt", "30"))  # kept, not deleted


def _flip(path, at, bit):
  with open(path, "r+b") as f:
    f.seek(at)
    byte = f.read(1)[0]
    f.seek(at)
    f.write(bytes([byte ^ (1 << bit)]))


def test_a_flipped_bit_in_any_file_of_a_checkpoint_fails_it_in_some_process(reference_run,
                                                                            tmp_path):
  directory = str(tmp_path / "24")
  shutil.copytree(os.path.join(reference_run, "checkpoints", "24"), directory)
  with open(os.path.join(directory, MANIFEST)) as f:
    recorded = sorted(json.load(f))
  # Every file orbax wrote before the commit: the arrays, their metadata, the JSON record.
  assert set(checkpoint_files(directory)) - set(recorded) <= {"commit_success.txt"}
  assert any(f.startswith("state/") for f in recorded) and "meta/metadata" in recorded
  assert verify_share(directory, 0, 1) is None
  rng = np.random.default_rng(0)
  for name in recorded:
    path = os.path.join(directory, name)
    if not os.path.getsize(path):
      continue
    at, bit = int(rng.integers(os.path.getsize(path))), int(rng.integers(8))
    _flip(path, at, bit)
    # Two processes split the files: exactly the one whose share holds it sees the flip.
    verdicts = [verify_share(directory, i, 2) for i in range(2)]
    owner = recorded.index(name) % 2
    assert verdicts[owner] and name in verdicts[owner] and verdicts[1 - owner] is None, name
    _flip(path, at, bit)
  assert verify_share(directory, 0, 1) is None
  os.remove(os.path.join(directory, recorded[-1]))
  assert f"is missing {recorded[-1]}" in verify_share(directory, 0, 1)


def test_non_finite_loss_halts_and_leaves_the_last_checkpoint(tmp_path):
  workdir = str(tmp_path)
  runs.train(workdir, "--config.train.num_steps=8")
  before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  meta_path = os.path.join(workdir, "checkpoints", "8", "meta", "metadata")
  meta_before = open(meta_path).read()
  # A rate of 1e30 sends the weights to overflow within a few steps.
  result = runs.train(workdir, "--config.train.num_steps=30", "--config.optim.lr_scale=1e30",
                      "--allow_changes", check=False)
  assert result.returncode == 1
  assert "non-finite training loss" in result.stderr
  assert "the newest checkpoint, step 8, is kept" in result.stderr
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before
  assert open(meta_path).read() == meta_before
  assert json.loads(meta_before)["step"] == 8


def test_trained_encoder_loads_in_three_lines_exports_and_draws_attention(
    reference_run, tmp_path):
  torch = pytest.importorskip("torch")

  from flax_encoder import Encoder
  from flax_encoder.pytorch import load_torch_checkpoint, reference
  from flax_encoder.weights import load_weights
  from train.outputs.draw_attention import main as attention_main
  from train.run.load import load_encoder
  from train.outputs.export import export

  cfg, variables = load_encoder(reference_run)
  ids = jnp.asarray(tokens.encode_bytes("def f(x): return x")[None])
  hidden = Encoder(cfg).apply(variables, ids)
  chex.assert_shape(hidden, (1, ids.shape[1], cfg.d_model))

  path = export(reference_run, str(tmp_path / "encoder.safetensors"))
  umask = os.umask(0)
  os.umask(umask)
  assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask  # not safetensors' 0600
  model = reference.Encoder(cfg)
  model.load_state_dict({k: torch.from_numpy(v) for k, v in load_torch_checkpoint(path).items()})
  expected = model.eval()(torch.tensor(np.asarray(ids))).detach().numpy()
  with jax.default_matmul_precision("highest"):
    np.testing.assert_allclose(hidden, expected, atol=1e-5)

  # The jax.export program, at the run's window length (32), padded input: same encoding.
  path = export(reference_run, str(tmp_path / "encoder.jaxexport"))
  with open(path, "rb") as f:
    exported = jax.export.deserialize(f.read())
  padded = jnp.zeros((2, 32), jnp.int32).at[0, :ids.shape[1]].set(ids[0])
  np.testing.assert_allclose(exported.call(padded)[:1, :ids.shape[1]], hidden, atol=1e-5)

  # The weights file a JAX program outside this checkout loads with the library alone.
  path = export(reference_run, str(tmp_path / "encoder.msgpack"))
  loaded_cfg, loaded = load_weights(path)
  assert loaded_cfg == cfg
  chex.assert_trees_all_equal(loaded, jax.device_get(variables))

  out = tmp_path / "attention.png"
  assert attention_main(["--workdir", reference_run, "--text", "hello world", "--out",
                         str(out)]) == 0
  assert out.stat().st_size > 5000
  with pytest.raises(FileNotFoundError, match="no checkpoints"):
    load_encoder(str(tmp_path / "empty"))


def test_the_vocab_size_comes_from_the_data_and_an_explicit_one_must_agree():
  config = tiny.get_config()
  source = "data/corpus (sentencepiece)"
  assert settings.encoder_config(config.model, 2004, source, 32).vocab_size == 2004
  config.model.vocab_size = 260
  with pytest.raises(RunError, match=r"config.model.vocab_size: 260, expected the data's 2004 "
                     r"\(data/corpus \(sentencepiece\)\)"):
    settings.encoder_config(config.model, 2004, source, 32)
  assert config.model.vocab_size == 260  # read, never written


@pytest.mark.parametrize("name", ["default", "base", "big", "small", "subword", "modern"])
def test_every_config_builds_a_valid_encoder_config(name, tmp_path):
  import importlib
  config = importlib.import_module(f"configs.{name}").get_config()
  assert config.model.vocab_size is None  # taken from the data
  config.data.prepared = None  # subword.py's, prepared by a command of its own
  windows = dataset.windows(config, str(tmp_path))
  cfg = settings.encoder_config(config.model, windows.vocab_size, windows.source,
                                config.train.seq_len)
  assert cfg.vocab_size == tokens.BYTE_VOCAB_SIZE and config.train.seq_len <= cfg.max_len
  if name == "small":
    assert (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_layers, cfg.max_len) == (312, 6, 1248, 3, 80)
    assert cfg.dropout == 0.05
  if name == "modern":
    assert [cfg.is_global(i) for i in range(cfg.n_layers)] == [True, False, False]
    assert cfg.position_embedding == "rotary" and cfg.glu and not cfg.dense_bias


def test_exporting_pytorch_weights_without_torch_is_one_line(reference_run, tmp_path):
  import subprocess
  import sys
  code = ("import sys; sys.modules['torch'] = None\n"  # as if torch were not installed
          "from train.export import main\n"
          f"sys.exit(main(['--workdir', {reference_run!r}, '--out', "
          f"{str(tmp_path / 'encoder.safetensors')!r}]))")
  result = subprocess.run([sys.executable, "-c", code], cwd=runs.ROOT, capture_output=True,
                          text=True, check=False)
  assert result.returncode == 2
  assert result.stderr.startswith("export: error: --out ") and "the torch extra" in result.stderr
  assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
