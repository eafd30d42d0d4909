"""The task contract: each task's facts come from its definition (checks, what may change on
resume, plots, summary), and the last mile of fine-tuning (a trained vocabulary from scratch,
predictions scored against labels, an export that turns text into labels outside the
checkout)."""

import json
import os
import shutil

import numpy as np
import pytest

from configs import classify as classify_config
from flax_encoder import EncoderConfig
from tests import runs
from train import tasks
from train.errors import RunError
from train.run import settings
from train.task import CHANGES_RUN, FIXES_STATE, FREE

CLASSES = {"digits": "0123456789", "letters": "abcdefghij", "symbols": "+-*/=<>!?%"}


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
  """(train.jsonl, eval.jsonl): texts of digits, of letters or of symbols, labelled so (at one
  place for all pytest-xdist workers, as `fine_tuned`'s run records them)."""
  rng = np.random.default_rng(1)

  def write(directory, name, n):
    with open(os.path.join(directory, name), "w") as f:
      for i in range(n):
        label = list(CLASSES)[i % 3]
        text = " ".join("".join(rng.choice(list(CLASSES[label]), rng.integers(2, 6)))
                        for _ in range(rng.integers(2, 8)))
        f.write(json.dumps({"text": text, "label": label}) + "\n")

  def write_both(directory):
    os.makedirs(directory)
    write(directory, "train.jsonl", 240)
    write(directory, "eval.jsonl", 30)

  directory, _ = runs.once_per_session(tmp_path_factory, "tasks_labelled", write_both)
  return os.path.join(directory, "train.jsonl"), os.path.join(directory, "eval.jsonl")


def _fine_tuning(train, eval_, *overrides):
  return [f"--config={os.path.join(runs.ROOT, 'configs', 'classify.py')}",
          f"--config.data.train={train}", f"--config.data.eval={eval_}",
          "--config.train.num_steps=24", "--config.train.batch_size=8",
          "--config.train.seq_len=32", "--config.train.eval_every=12",
          "--config.train.checkpoint_every=12", "--config.optim.warmup_steps=4",
          "--config.model.d_model=16", "--config.model.n_heads=2", "--config.model.d_ff=32",
          "--config.model.n_layers=1", "--config.model.max_len=32", *overrides]


@pytest.fixture(scope="module")
def fine_tuned(labelled, tmp_path_factory):
  """A fine-tuning run from scratch with the default tokenizer (a trained vocabulary): made once
  for all pytest-xdist workers (tests only read it or copy it)."""
  def fine_tune(directory):
    result = runs.train(directory, *_fine_tuning(*labelled), config=None)
    return {"returncode": result.returncode, "stdout": result.stdout, "stderr": result.stderr}

  workdir, result = runs.once_per_session(tmp_path_factory, "tasks_fine_tuned", fine_tune)
  return workdir, runs.Result(**result)


def test_what_may_change_on_resume_follows_each_fields_role():
  masked_lm = tasks.definition("masked_lm")
  kinds = {field: settings.resume_kind(field, masked_lm) for field in (
      "model.dtype", "model.attention_impl", "model.remat", "model.dropout", "model.d_model",
      "model.param_dtype", "model.scan_layers", "train.num_steps", "train.seed",
      "task.tie_embeddings", "task.mask_rate", "data.max_eval_windows", "task.name")}
  assert kinds == {
      "model.dtype": FREE, "model.attention_impl": FREE, "model.remat": FREE,
      "model.dropout": CHANGES_RUN, "model.d_model": FIXES_STATE,
      "model.param_dtype": FIXES_STATE, "model.scan_layers": FIXES_STATE,
      "train.num_steps": FREE, "train.seed": CHANGES_RUN, "task.tie_embeddings": FIXES_STATE,
      "task.mask_rate": CHANGES_RUN, "data.max_eval_windows": FREE, "task.name": FIXES_STATE}
  # Every field of the encoder has its rule, and a pretrained encoder brings exactly those
  # that are not the run's own.
  assert {f"model.{f.name}" for f in __import__("dataclasses").fields(EncoderConfig)} - {
      "model.pad_id"} == set(settings.MODEL)
  config = classify_config.get_config()
  unset = {name for name, value in config.model.to_dict().items() if value is None}
  assert unset == {n for r in ("architecture", "parameters") for n in EncoderConfig.fields(r)
                   } - {"pad_id"}


def test_fine_tuning_checks_the_sizes_it_will_use_not_the_librarys_defaults():
  config = classify_config.get_config()
  config.model.d_model = 100  # from scratch with configs/default.py's 4 heads: fine
  tasks.checked(config)
  config = classify_config.get_config()
  config.data.tokenizer = "no-such-file.model"
  with pytest.raises(RunError, match=r"^config.data.tokenizer: 'no-such-file.model', expected"):
    tasks.checked(config)


def test_an_unknown_task_is_one_line_naming_the_field():
  config = classify_config.get_config()
  config.task.name = "tagging"
  with pytest.raises(RunError, match=r"^config.task.name: 'tagging', expected one of "):
    tasks.checked(config)


def test_a_run_shorter_than_its_warm_up_says_what_it_does_instead(tmp_path):
  result = runs.train(str(tmp_path / "run"), "--config.optim.recipe=adamw",
                      "--config.optim.learning_rate=1e-3", "--config.train.num_steps=5",
                      "--config.train.eval_every=5")
  note = [line for line in result.stderr.splitlines() if "warmup_steps" in line]
  assert len(note) == 1 and "first tenth (1 steps)" in note[0] and "10" in note[0]


def test_plots_are_titled_and_labelled_for_the_task(tmp_path, monkeypatch):
  import matplotlib.pyplot as plt

  from train.run import plots
  axes = []
  subplots = plt.subplots

  def keep(*args, **kwargs):
    fig, ax = subplots(*args, **kwargs)
    axes.append(ax)
    return fig, ax

  monkeypatch.setattr(plots.plt, "subplots", keep)
  records = [{"split": "train", "step": 1, "loss": 1.0},
             {"split": "eval", "step": 1, "loss": 1.0, "accuracy": 0.5, "macro_f1": 0.4,
              "baseline_accuracy": 0.3}]
  plots.plot_run(records, lambda s: s * 0.0, 2, str(tmp_path),
                 tasks.definition("classify").plots, "adamw")
  loss, scores, rate = axes
  assert loss.get_title() == "Classification loss" and "example" in loss.get_ylabel()
  legend = [t.get_text() for t in scores.get_legend().get_texts()]
  assert legend == ["accuracy", "macro-F1", "baseline: majority class"]
  assert rate.get_title() == "Linear warm-up, then linear decay"
  assert sorted(os.listdir(tmp_path)) == ["accuracy.png", "learning_rate.png", "loss.png"]


def test_fine_tuning_from_scratch_trains_a_vocabulary_on_the_training_texts(fine_tuned):
  workdir, result = fine_tuned
  meta = json.load(open(os.path.join(workdir, "data", "dataset.json")))
  assert meta["tokenizer"]["kind"] == "sentencepiece"
  assert os.path.isfile(os.path.join(workdir, "data", "tokenizer.model"))
  assert meta["vocab_size"] > 4 and meta["vocab_size"] != 260  # not bytes
  last = result.stdout.strip().splitlines()[-1]
  assert "eval accuracy" in last and "macro-F1" in last and "majority class" in last


def test_bytes_on_request(labelled, tmp_path):
  workdir = str(tmp_path / "run")
  runs.train(workdir, *_fine_tuning(*labelled, "--config.data.tokenizer=bytes",
                                    "--config.train.num_steps=2"), config=None)
  meta = json.load(open(os.path.join(workdir, "data", "dataset.json")))
  assert meta["tokenizer"]["kind"] == "bytes" and meta["vocab_size"] == 260


def test_predict_scores_labelled_input_as_the_evaluation_does(fine_tuned, labelled, tmp_path):
  from train.outputs.predict import main, predict
  workdir, _ = fine_tuned
  final = [r for r in runs.read_metrics(os.path.join(workdir, "metrics.jsonl"))
           if r["split"] == "eval"][-1]
  done = predict(workdir, labelled[1], str(tmp_path / "p.jsonl"))
  assert done.count == done.labelled == 30
  assert done.scores["accuracy"] == pytest.approx(final["accuracy"], abs=1.5 / 30)
  assert done.scores["macro_f1"] == pytest.approx(final["macro_f1"], abs=0.06)
  # Without labels: predictions, no scores.
  unlabelled = tmp_path / "texts.jsonl"
  unlabelled.write_text("".join(json.dumps({"text": json.loads(line)["text"]}) + "\n"
                                for line in open(labelled[1])))
  assert predict(workdir, str(unlabelled), str(tmp_path / "q.jsonl")).scores is None
  assert main(["--workdir", workdir, "--input", labelled[1], "--out",
               str(tmp_path / "r.jsonl")]) == 0


def test_another_vocabulary_is_refused_on_resume_even_with_allow_changes(fine_tuned, labelled,
                                                                          tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(fine_tuned[0], workdir)
  result = runs.train(workdir, *_fine_tuning(*labelled, "--config.data.vocab_size=400",
                                             "--config.train.num_steps=30"),
                      "--allow_changes", config=None, check=False)
  assert result.returncode == 2 and "Traceback" not in result.stderr
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "makes model.vocab_size 404" in errors[0], result.stderr[-2000:]
  assert "another model or program" not in errors[0]


def test_attention_is_drawn_for_fine_tuned_runs_and_runs_on_any_kernel(fine_tuned, tmp_path):
  from train.outputs.draw_attention import main as attention_main
  xla = str(tmp_path / "xla")
  runs.train(xla, "--config.train.num_steps=2", "--config.model.attention_impl=xla")
  for workdir in (fine_tuned[0], xla):
    out = tmp_path / f"{os.path.basename(workdir)}.png"
    assert attention_main(["--workdir", workdir, "--text", "ab 12", "--out", str(out)]) == 0
    assert out.stat().st_size > 1000


def test_predict_and_export_refuse_what_they_cannot_use_in_one_line(fine_tuned, labelled,
                                                                  tmp_path, capsys,
                                                                  monkeypatch):
  import signal

  from flax_encoder.text_classifier import TextClassifier
  from train.outputs import export, predict
  workdir, _ = fine_tuned
  texts = tmp_path / "texts.jsonl"
  shutil.copy(labelled[1], texts)
  (tmp_path / "link.jsonl").symlink_to("texts.jsonl")
  before = texts.read_bytes()

  def one_line(code, command, *words):
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if f"{command}: error:" in line]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert all(word in lines[0] for word in words), lines[0]

  run = lambda *args: predict.main(["--workdir", workdir, "--input", str(texts), *args])
  one_line(run("--out", f"{tmp_path}/./texts.jsonl"), "predict", "the file --input")
  one_line(run("--out", str(tmp_path / "link.jsonl")), "predict", "the file --input")
  one_line(run("--out", str(tmp_path)), "predict", "a directory")
  one_line(run("--out", str(tmp_path / "no" / "p.jsonl")), "predict", "no directory")
  for size in ("0", "-4"):
    one_line(run("--out", str(tmp_path / "p.jsonl"), "--batch-size", size), "predict",
             f"--batch-size {size}")
  one_line(predict.main(["--workdir", workdir, "--input", str(tmp_path), "--out",
                         str(tmp_path / "p.jsonl")]), "predict", "--input", "a directory")
  one_line(predict.main(["--workdir", str(tmp_path / "none"), "--input", str(texts), "--out",
                         str(tmp_path / "p.jsonl")]), "predict", "--workdir", "no such")
  assert texts.read_bytes() == before
  # Stopped by SIGTERM halfway: no predictions, no half-written file left.
  monkeypatch.setattr(TextClassifier, "probabilities",
                      lambda *_: os.kill(os.getpid(), signal.SIGTERM))
  assert run("--out", str(tmp_path / "p.jsonl")) == 128 + signal.SIGTERM
  assert sorted(os.listdir(tmp_path)) == ["link.jsonl", "texts.jsonl"]

  out = str(tmp_path / "e.msgpack")
  one_line(export.main(["--workdir", str(tmp_path / "none"), "--out", out]), "export",
           "--workdir", "no such directory")
  one_line(export.main(["--workdir", str(tmp_path), "--out", out]), "export", "no checkpoints")
  one_line(export.main(["--workdir", workdir, "--out", str(tmp_path / "no" / "e.msgpack")]),
           "export", "no directory")
  one_line(export.main(["--workdir", workdir, "--out", f"{workdir}/checkpoints/e.msgpack"]),
           "export", "inside the run's own checkpoints")
  one_line(run("--out", f"{workdir}/metrics.jsonl"), "predict", "inside the run's own metrics")
  (tmp_path / "d.msgpack").mkdir()
  one_line(export.main(["--workdir", workdir, "--out", str(tmp_path / "d.msgpack")]), "export",
           "a directory")


def test_a_fine_tuned_export_turns_text_into_labels_outside_the_checkout(fine_tuned, labelled,
                                                                          tmp_path):
  from train.outputs.export import export
  from train.outputs.predict import predict
  workdir, _ = fine_tuned
  out = export(workdir, str(tmp_path / "classifier.msgpack"))
  predict(workdir, labelled[1], str(tmp_path / "p.jsonl"))
  expected = [json.loads(line) for line in open(tmp_path / "p.jsonl")]
  texts = [json.loads(line)["text"] for line in open(labelled[1])]
  # A program that imports only the library (no train, no checkout on its path).
  moved = tmp_path / "elsewhere"
  moved.mkdir()
  shutil.copy(out, moved / "classifier.msgpack")
  code = ("import json, sys\n"
          "from flax_encoder.text_classifier import TextClassifier\n"
          "classifier = TextClassifier.load('classifier.msgpack')\n"
          "texts = json.load(sys.stdin)\n"
          "print(json.dumps({'labels': classifier(texts),\n"
          "                  'p': classifier.probabilities(texts).tolist()}))\n"
          "assert 'train' not in sys.modules\n")
  import subprocess
  import sys
  env = {k: v for k, v in runs.environment().items() if k != "PYTHONPATH"}
  result = subprocess.run([sys.executable, "-c", code], cwd=moved, env=env, text=True,
                          input=json.dumps(texts), capture_output=True, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  got = json.loads(result.stdout)
  assert got["labels"] == [p["label"] for p in expected]
  np.testing.assert_allclose(
      got["p"], [list(p["probabilities"].values()) for p in expected], atol=2e-5)
