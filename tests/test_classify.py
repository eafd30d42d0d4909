"""Fine-tuning: the pooled head, starting from a pretraining run or a PyTorch checkpoint,
exact resume, predictions that agree with the evaluation, and one line for each bad input."""

import json
import os
import shutil
import signal

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import classify as classify_config
from flax_encoder import Encoder, EncoderConfig
from tests import runs
from train.errors import RunError
from train.task import Resume
from train.tasks import classify

CLASSES = {"digits": "0123456789", "letters": "abcdefghij", "symbols": "+-*/=<>!?%"}


def _write(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
  """(train.jsonl, eval.jsonl): texts of digits, of letters or of symbols, labelled so."""
  directory = tmp_path_factory.mktemp("labelled")
  rng = np.random.default_rng(0)

  def rows(n):
    out = []
    for i in range(n):
      label = list(CLASSES)[i % 3]
      chars = rng.choice(list(CLASSES[label]), rng.integers(3, 40))
      out.append({"text": "".join(chars), "label": label})
    return out

  return _write(directory / "train.jsonl", rows(240)), _write(directory / "eval.jsonl", rows(30))


def _config(train, eval_, *overrides):
  """The tiny fine-tuning config as command-line overrides."""
  return [f"--config={os.path.join(runs.ROOT, 'configs', 'classify.py')}",
          f"--config.data.train={train}", f"--config.data.eval={eval_}",
          "--config.train.num_steps=24", "--config.train.batch_size=8",
          "--config.train.seq_len=32", "--config.train.log_every=1",
          "--config.train.eval_every=12", "--config.train.checkpoint_every=8",
          "--config.train.keep_checkpoints=5", "--config.optim.warmup_steps=10", *overrides]


SCRATCH = ["--config.model.d_model=16", "--config.model.n_heads=2", "--config.model.d_ff=32",
           "--config.model.n_layers=1", "--config.model.max_len=32"]


def _train(workdir, *args, **kwargs):
  return runs.train(workdir, *args, config=None, **kwargs)


def test_the_mean_pooled_head_on_a_padded_batch_equals_each_row_alone():
  cfg = EncoderConfig(vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=16)
  model = classify.Classifier(cfg, num_labels=3)
  rng = np.random.default_rng(0)
  lengths = [5, 16, 1, 9]
  rows = [rng.integers(1, 40, n) for n in lengths]
  padded = np.zeros((4, 16), np.int32)
  for i, row in enumerate(rows):
    padded[i, :len(row)] = row
  params = nn.unbox(model.init(jax.random.key(0), jnp.asarray(padded)))
  together = model.apply(params, padded)
  for i, row in enumerate(rows):
    np.testing.assert_allclose(together[i], model.apply(params, row[None])[0], atol=2e-6)
  first = classify.Classifier(cfg, num_labels=3, pooling="first")
  np.testing.assert_allclose(first.apply(params, padded)[0],
                             first.apply(params, rows[0][None])[0], atol=2e-6)


def test_fine_tuning_from_a_run_starts_from_its_encoder_bitwise(reference_run, labelled,
                                                               tmp_path):
  from train.run.load import load_encoder
  from train.loop import _with_params
  from train.run.optim import make_optimizer, resolve
  from train.run.step import init_state
  config = classify_config.get_config()
  config.data.train, config.data.eval = labelled
  config.train.update(seq_len=32, batch_size=8)
  config.init.run = reference_run
  setup = classify.setup(config, str(tmp_path), Resume())
  tx, _ = make_optimizer(resolve(config, 10), setup.encoder.d_model, 10)
  state = init_state(setup.task, tx, 0, 32)
  state = _with_params(state, setup.start_params)
  _, expected = load_encoder(reference_run)
  chex.assert_trees_all_equal(jax.device_get(state.params["encoder"]),
                              jax.device_get(expected["params"]))
  assert setup.encoder.d_model == 16 and set(state.params) == {"encoder", "classifier"}
  # And the run's tokenizer is the fine-tuning's: bytes, ids + 4.
  assert setup.task.model.config.vocab_size == 260


@pytest.mark.slow
def test_a_fine_tuning_run_killed_and_restarted_has_the_same_losses_and_predicts_its_eval(
    labelled, tmp_path):
  train, eval_ = labelled
  straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
  result = _train(straight, *_config(train, eval_, *SCRATCH))
  assert "fine-tuning from scratch: 3 classes, 240 training and 30 held-out" in result.stderr
  records = runs.read_metrics(os.path.join(straight, "metrics.jsonl"))
  final = [r for r in records if r["split"] == "eval"][-1]
  assert {"accuracy", "macro_f1", "baseline_accuracy", "loss"} <= set(final)
  assert final["baseline_accuracy"] == pytest.approx(1 / 3)

  proc = _train(killed, *_config(train, eval_, *SCRATCH), popen=True)
  runs.wait_for_step(killed, 12)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  _train(killed, *_config(train, eval_, *SCRATCH))
  assert runs.losses(killed) == runs.losses(straight)

  from train.outputs.predict import predict
  out = tmp_path / "predictions.jsonl"
  assert predict(straight, eval_, str(out)).count == 30
  predictions = [json.loads(line) for line in out.read_text().splitlines()]
  truth = [json.loads(line)["label"] for line in open(eval_)]
  accuracy = np.mean([p["label"] == t for p, t in zip(predictions, truth)])
  assert accuracy == pytest.approx(final["accuracy"])
  assert all(abs(sum(p["probabilities"].values()) - 1) < 1e-4 for p in predictions)


def test_fine_tuning_from_a_pytorch_checkpoint_takes_its_encoder_and_head(labelled, tmp_path):
  torch = pytest.importorskip("torch")

  from flax_encoder.pytorch import from_torch_state_dict
  from tests import torch_models
  torch.manual_seed(0)
  cfg = EncoderConfig(vocab_size=260, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=32)
  model = torch_models.Classifier(cfg)  # the tutorial port under `encoder.`, a head beside it
  model.head = torch.nn.Linear(16, 3)
  path = tmp_path / "model.pt"
  torch.save({"model": model.state_dict()}, path)
  config = classify_config.get_config()
  config.data.train, config.data.eval = labelled
  config.train.update(seq_len=32, batch_size=8)
  config.init.update(torch_checkpoint=str(path), n_heads=2, torch_head="head")
  # The head scores classes 0, 1, 2 in its rows' order: the labels must be those integers.
  with pytest.raises(RunError, match="scores classes 0 … 2 in its rows' order"):
    classify.setup(config, str(tmp_path / "named"), Resume())
  train, eval_ = (_write(tmp_path / f"{s}.jsonl", [
      {**json.loads(line), "label": list(CLASSES).index(json.loads(line)["label"])}
      for line in open(f)]) for s, f in zip(("train", "eval"), labelled))
  config.data.train, config.data.eval = train, eval_
  setup = classify.setup(config, str(tmp_path / "ints"), Resume())
  expected = from_torch_state_dict(model.encoder.state_dict(), cfg)["params"]
  chex.assert_trees_all_equal(setup.start_params["encoder"], expected)
  np.testing.assert_array_equal(setup.start_params["classifier"]["kernel"],
                                model.head.weight.detach().numpy().T)
  config.model.d_model = 32  # disagrees with the checkpoint's 16
  with pytest.raises(RunError, match=r"config.model.d_model: 32, but .*model.pt has 16"):
    classify.setup(config, str(tmp_path / "other"), Resume())


@pytest.mark.parametrize("case, words", [
    ("no label", "train.jsonl:2: no 'label' field"),
    ("no text", "train.jsonl:3: no string 'text' field"),
    ("not json", "train.jsonl:2: not valid JSON"),
    ("empty", "train.jsonl: no examples"),
    ("one class", "train.jsonl: every example has the label 'a', expected at least two"),
    ("unseen eval label", "eval.jsonl:1: label 'c' is not one of the training file's classes"),
    ("float label", "train.jsonl:1: label 0.5 is a number with a fraction"),
    ("not a run", "config.init.run: '{tmp}', expected a training run's workdir"),
    ("other tokenizer", "config.data.tokenizer: '{tmp}/sp.model', but {run} was trained with"),
])
def test_bad_input_is_one_line_naming_file_and_line(case, words, tmp_path, reference_run):
  good = [{"text": "x", "label": "a"}, {"text": "y", "label": "b"}, {"text": "z", "label": "a"}]
  train = {"no label": [good[0], {"text": "y"}], "no text": [*good[:2], {"label": "a"}],
           "empty": [], "one class": [good[0], good[2]],
           "float label": [{"text": "x", "label": 0.5}]}.get(case, good)
  _write(tmp_path / "train.jsonl", train)
  if case == "not json":
    (tmp_path / "train.jsonl").write_text('{"text": "x", "label": "a"}\n{"text": \n')
  _write(tmp_path / "eval.jsonl", [{"text": "q", "label": "c"}] if "unseen" in case else good)
  overrides = list(SCRATCH)
  if case == "not a run":
    overrides = [f"--config.init.run={tmp_path}"]
  if case == "other tokenizer":
    import sentencepiece as spm
    from train.data.sources import builtin_topics
    spm.SentencePieceTrainer.train(sentence_iterator=iter(builtin_topics()[:50]),
                                   model_prefix=str(tmp_path / "sp"), vocab_size=200,
                                   minloglevel=2)
    overrides = [f"--config.init.run={reference_run}",
                 f"--config.data.tokenizer={tmp_path}/sp.model"]
  result = _train(str(tmp_path / "run"), *_config(tmp_path / "train.jsonl",
                                                  tmp_path / "eval.jsonl", *overrides),
                  check=False)
  assert result.returncode == 2, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
  assert words.format(tmp=tmp_path, run=reference_run) in errors[0], errors[0]
  shutil.rmtree(tmp_path / "run", ignore_errors=True)
