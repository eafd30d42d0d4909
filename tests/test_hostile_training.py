"""Hostile training settings and inputs: a run's first step trains (never at learning rate 0),
a length no int32 step counter holds is refused before the workdir is made, a warm-up cut to
fit is said as cut, weights that start non-finite are named with their source, and JSON
nested past what the decoder can read is one line naming the file and line in every command
that reads JSON lines."""

import json
import os

import numpy as np
import pytest

from configs import classify as classify_config
from tests import runs
from train.errors import RunError
from train import tasks
from train.run import optim

CLASSIFY = os.path.join(runs.ROOT, "configs", "classify.py")
TINY_MODEL = ["--config.model.d_model=16", "--config.model.n_heads=2", "--config.model.d_ff=32",
              "--config.model.n_layers=1", "--config.model.max_len=32",
              "--config.train.seq_len=32", "--config.train.log_every=1"]
ROWS = [{"text": "abc def", "label": "a"}, {"text": "xyz 123", "label": "b"}]
DEEP = 200_000  # levels of nesting: far past the JSON decoder's recursion limit
DEEP_LINES = {"nested field": '{"text": ' + "[" * DEEP + "]" * DEEP + ', "label": "a"}',
              "open brackets": "[" * DEEP}


def _write(path, rows, extra: str | None = None):
  """JSON lines of `rows`, with the line `extra` after them (its line number: len(rows) + 1)."""
  lines = [json.dumps(r) for r in rows] + ([extra] if extra is not None else [])
  path.write_text("".join(line + "\n" for line in lines))
  return str(path)


def _fine_tune(workdir, train, *overrides, eval_=None):
  """`python -m train` in this process: the tiny classifier on `train` (and `eval_`)."""
  return runs.train(str(workdir), f"--config={CLASSIFY}", f"--config.data.train={train}",
                    f"--config.data.eval={eval_ or train}", *TINY_MODEL, *overrides,
                    config=None, check=False)


def _error(result):
  """The error line of a run that failed (the last line of its stderr)."""
  return result.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def one_step(tmp_path_factory):
  """(workdir, result) of a fine-tuning of one step: one epoch of two examples in a batch of
  two, its warm-up (config.optim.warmup_steps=100) cut to the run's one step."""
  directory = tmp_path_factory.mktemp("one_step")
  train = _write(directory / "train.jsonl", ROWS)
  result = _fine_tune(directory / "run", train, "--config.train.epochs=1",
                      "--config.train.batch_size=2", "--config.optim.warmup_steps=100")
  assert result.returncode == 0, result.stderr[-3000:]
  return str(directory / "run"), result


# 1. The first step trains.

def test_a_one_step_run_trains_its_step_at_a_learning_rate_above_0(one_step):
  workdir, result = one_step
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  trained = [r for r in records if r["split"] == "train"]
  assert [r["step"] for r in trained] == [1]
  assert trained[0]["lr"] == pytest.approx(1e-3)  # the from-scratch recipe's peak, all of it
  assert "1 step (1 epoch of 2 examples in batches of 2)" in result.stderr


@pytest.mark.parametrize("num_steps, warmup", [(1, 1), (2, 1), (10, 4), (800, 48), (5, 100)])
def test_every_adamw_run_starts_above_0_peaks_and_ends_above_0(num_steps, warmup):
  config = classify_config.get_config()
  config.optim.update(recipe="adamw", learning_rate=1e-3, warmup_steps=warmup,
                      weight_decay=0.01)
  _, schedule = optim.make_optimizer(config.optim, 16, num_steps)
  warmed = optim.warmup_steps(config.optim, num_steps)
  lrs = np.array([float(schedule(count)) for count in range(num_steps)])
  assert lrs[0] > 0 and lrs[-1] > 0, lrs
  np.testing.assert_allclose(lrs[0], 1e-3 / warmed, rtol=1e-6)
  np.testing.assert_allclose(lrs.max(), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(lrs[warmed - 1], 1e-3, rtol=1e-6)  # the warm-up's last step
  assert float(schedule(num_steps)) == 0.0  # past the run: nothing


# 2. A run longer than an int32 counts.

@pytest.mark.parametrize("field, value", [("num_steps", "3000000000"), ("epochs", "1e10")])
def test_a_run_too_long_to_count_is_refused_before_its_workdir_is_made(tmp_path, field, value):
  train = _write(tmp_path / "train.jsonl", ROWS)
  result = _fine_tune(tmp_path / "run", train, f"--config.train.{field}={value}",
                      "--config.train.batch_size=2")
  assert result.returncode == 2, result.stderr[-3000:]
  line = _error(result)
  assert line.startswith(f"error: config.train.{field}: ") and "2,147,483,647" in line, line
  assert "Traceback" not in result.stderr
  assert not os.path.exists(tmp_path / "run")


def test_epochs_that_come_to_more_steps_than_an_int32_counts_are_one_line(tmp_path):
  train = _write(tmp_path / "train.jsonl", ROWS * 4)  # 8 examples, 4 batches of 2 an epoch
  result = _fine_tune(tmp_path / "run", train, "--config.train.epochs=1e9",
                      "--config.train.batch_size=2")
  assert result.returncode == 2, result.stderr[-3000:]
  assert _error(result) == (
      "error: config.train.epochs: 1000000000.0, expected at most 536,870,911 epochs of the 8 "
      "examples in batches of 2 (4,000,000,000 steps; an int32 step counter holds "
      "2,147,483,647)")
  assert not os.path.exists(tmp_path / "run" / "checkpoints" / "1")


def test_the_step_bound_is_checked_with_the_fields():
  config = classify_config.get_config()
  config.train.num_steps = 2**31 - 1  # the most that fits
  tasks.checked(config)
  config.train.num_steps = 2**31
  with pytest.raises(RunError, match=r"^config.train.num_steps: 2147483648, expected an "
                                     r"integer >= 1 and at most 2,147,483,647"):
    tasks.checked(config)


# 3. A warm-up cut to fit the run.

def test_a_warm_up_cut_to_fit_the_run_is_said_as_cut_on_the_start_line():
  config = classify_config.get_config()
  config.optim.warmup_steps = 100
  line = optim.describe(config, optim.resolve(config, 4), 16, 4)
  assert line == (
      "optimizer: adamw, peak learning rate 0.001, warm-up 1 steps (25%; "
      "config.optim.warmup_steps 100 is not shorter than the run's 4 steps: warming up for its "
      "first tenth (1 steps) instead), linear decay, weight decay 0.01 (config.optim."
      "warmup_steps given but cut to fit the run, the rest the from-scratch recipe's: no "
      "config.init is set)"), line
  config.optim.learning_rate = 1e-4
  line = optim.describe(config, optim.resolve(config, 4), 16, 4)
  assert line.endswith("(config.optim.learning_rate as given, config.optim.warmup_steps given "
                       "but cut to fit the run, the rest the from-scratch recipe's: no "
                       "config.init is set)"), line


def test_the_start_line_of_a_run_with_its_warm_up_cut_says_so_once(one_step):
  _, result = one_step
  said = [line for line in result.stderr.splitlines() if "warmup_steps" in line]
  assert len(said) == 1 and "; optimizer: adamw" in said[0], said
  assert "warm-up 1 steps (100%; config.optim.warmup_steps 100 is not shorter" in said[0]
  assert "warmup_steps as given" not in said[0]


# 4. Weights that start non-finite.

def test_a_start_checkpoint_holding_nan_is_named_before_training(tmp_path):
  torch = pytest.importorskip("torch")

  from flax_encoder import EncoderConfig
  from tests import torch_models
  torch.manual_seed(0)
  cfg = EncoderConfig(vocab_size=260, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=32)
  model = torch_models.Classifier(cfg)
  with torch.no_grad():
    model.encoder.layers[0].feed_forward.w_2.weight[0, 0] = float("nan")
  path = tmp_path / "model.pt"
  torch.save({"model": model.state_dict()}, path)
  train = _write(tmp_path / "train.jsonl", ROWS * 4)
  result = _fine_tune(tmp_path / "run", train, f"--config.init.torch_checkpoint={path}",
                      "--config.init.n_heads=2", "--config.train.num_steps=2",
                      "--config.train.batch_size=2")
  assert result.returncode == 2, result.stderr[-3000:]
  line = _error(result)
  assert line == (f"error: config.init.torch_checkpoint: {path}: its parameter "
                  f"encoder/layers_0/feed_forward/w_2/kernel holds NaN, "
                  f"expected finite weights to start from"), line
  assert "non-finite" not in result.stderr
  assert not os.path.exists(tmp_path / "run" / "checkpoints" / "2")


def test_an_infinity_in_a_start_parameter_on_a_device_is_named_too():
  import jax.numpy as jnp

  from train import loop
  config = classify_config.get_config()
  config.init.hf = "bert-dir"
  params = {"encoder": {"a": np.ones(3, np.float32), "b": {"kernel": jnp.array([1.0, jnp.inf])}},
            "steps": np.array([1], np.int32)}
  with pytest.raises(RunError, match=r"^config.init.hf: bert-dir: its parameter encoder/b/"
                                     r"kernel holds infinity, expected finite weights"):
    loop._check_finite(params, config, "bert-dir")
  loop._check_finite({"encoder": {"a": np.ones(3, np.float32)}}, config, "bert-dir")


# 5. JSON nested too deep for the decoder.

def _nested(tmp_path, kind):
  """A .jsonl of ROWS with DEEP_LINES[kind] as its line 3."""
  return _write(tmp_path / "deep.jsonl", ROWS, DEEP_LINES[kind])


def _one_line_naming(message, path):
  assert "\n" not in message.strip() and "Traceback" not in message, message[-3000:]
  assert f"{path}:3: JSON nested too deeply to read" in message, message[-3000:]


@pytest.mark.parametrize("kind", sorted(DEEP_LINES))
def test_deep_json_in_prepare_is_one_line_naming_the_file_and_line(tmp_path, capsys, kind):
  from train.data import prepare
  path = _nested(tmp_path, kind)
  code = prepare.main(["--input", path, "--out", str(tmp_path / "out"), "--seq-len", "16",
                       "--workers", "1"])
  assert code == 2
  _one_line_naming(capsys.readouterr().err.strip().splitlines()[-1], path)


def test_deep_json_in_fine_tuning_data_is_one_line_naming_the_file_and_line(tmp_path):
  path = _nested(tmp_path, "nested field")
  result = _fine_tune(tmp_path / "run", path, "--config.train.num_steps=1",
                      "--config.train.batch_size=2")
  assert result.returncode == 2, result.stderr[-3000:]
  _one_line_naming(_error(result), path)


def test_deep_json_in_predict_input_is_one_line_naming_the_file_and_line(one_step, tmp_path,
                                                                          capsys):
  from train.outputs import predict
  workdir, _ = one_step
  path = _nested(tmp_path, "open brackets")
  code = predict.main(["--workdir", workdir, "--input", path, "--out",
                       str(tmp_path / "out.jsonl")])
  assert code == 2
  _one_line_naming(capsys.readouterr().err.strip().splitlines()[-1], path)
  assert not os.path.exists(tmp_path / "out.jsonl")


def test_deep_json_in_embed_input_is_one_line_naming_the_file_and_line(tmp_path, capsys):
  pytest.importorskip("transformers")
  from tests import hf_models
  from train.outputs import embed
  folder = hf_models.write(tmp_path / "hf", "bert", head="base")
  path = _nested(tmp_path, "nested field")
  code = embed.main(["--model", folder, "--input", path, "--out", str(tmp_path / "e.npy")])
  assert code == 2
  _one_line_naming(capsys.readouterr().err.strip().splitlines()[-1], path)
  assert not os.path.exists(tmp_path / "e.npy")
