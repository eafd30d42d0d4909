"""The fine-tuning recipe follows where the encoder starts (from scratch, or pretrained: AdamW
at 5e-5, a warm-up over 6% of the steps) unless the config gives its values; a run's length
in epochs; evaluations and checkpoints once per epoch; resuming runs that recorded the values
before they became the recipe's."""

import json
import os

import pytest

from configs import classify as classify_config
from configs import default as default_config
from tests import runs
from train import tasks
from train.errors import RunError
from train.run import optim, settings


def _classify(**init):
  config = classify_config.get_config()
  config.init.update(init)
  return config


def _values(optimizer) -> tuple:
  return (optimizer.recipe, optimizer.learning_rate, optimizer.warmup_steps,
          optimizer.weight_decay)


def test_from_scratch_the_unset_optimizer_fields_are_the_from_scratch_recipe():
  config = _classify()
  assert _values(optim.resolve(config, 800)) == ("adamw", 1e-3, 100, 0.01)
  line = optim.describe(config, optim.resolve(config, 800), 128, 800)
  assert line == ("optimizer: adamw, peak learning rate 0.001, warm-up 100 steps (12%), "
                  "linear decay, weight decay 0.01 (the from-scratch recipe: no config.init "
                  "is set)")
  assert config.optim.learning_rate is None  # derived, not written back


@pytest.mark.parametrize("init", [{"run": "runs/demo"},
                                  {"torch_checkpoint": "model.pt", "n_heads": 2},
                                  {"hf": "bert-dir"}])
def test_from_a_pretrained_encoder_they_are_the_pretrained_recipe(init):
  config = _classify(**init)
  assert _values(optim.resolve(config, 800)) == ("adamw", 5e-5, 48, 0.01)
  assert optim.resolve(config, 50).warmup_steps == 3  # 6% of the steps, whatever their count
  line = optim.describe(config, optim.resolve(config, 800), 768, 800)
  name = next(iter(init))
  assert line == ("optimizer: adamw, peak learning rate 5e-05, warm-up 48 steps (6%), linear "
                  f"decay, weight decay 0.01 (the pretrained recipe: config.init.{name} is set)")


def test_a_value_the_config_gives_wins_over_the_recipe():
  config = _classify(hf="bert-dir")
  config.optim.update(learning_rate=2e-5, warmup_steps=10)
  assert _values(optim.resolve(config, 800)) == ("adamw", 2e-5, 10, 0.01)
  line = optim.describe(config, optim.resolve(config, 800), 768, 800)
  assert line.endswith("(config.optim.learning_rate, config.optim.warmup_steps as given, the "
                       "rest the pretrained recipe's: config.init.hf is set)"), line
  config.optim.recipe = "paper"
  assert optim.resolve(config, 800).recipe == "paper"
  # A config that sets every field (pretraining's, configs/default.py) takes no recipe.
  pretraining = default_config.get_config()
  pretraining.init.hf = "bert-dir"
  assert _values(optim.resolve(pretraining, 1200)) == ("paper", 1e-4, 200, 0.01)
  assert optim.describe(pretraining, optim.resolve(pretraining, 1200), 128, 1200) == (
      "optimizer: paper, Adam(0.9, 0.98, 1e-09), warm-up 200 steps to a peak learning rate "
      "of 0.0031, then 1/sqrt(step)")


def test_an_optimizer_left_unresolved_is_refused_by_make_optimizer():
  with pytest.raises(ValueError, match="config.optim.recipe is unset"):
    optim.make_optimizer(_classify().optim, 16, 100)


def _train(**fields):
  train = classify_config.get_config().train
  train.update(fields)
  return train


@pytest.mark.parametrize("fields, examples, expected", [
    ({}, 250, (800, 200, 200)),  # neither: 800 steps, every 200
    ({"num_steps": 40}, 250, (40, 200, 200)),
    ({"epochs": 3.0}, 250, (24, 8, 8)),  # 3 * 250 / 32 = 23.4 steps; an epoch 7.8
    ({"epochs": 0.5, "batch_size": 10}, 100, (5, 10, 10)),
    ({"epochs": 0.1, "batch_size": 3}, 30, (1, 10, 10)),  # 0.1 * 30 / 3 is 1.0000000000000002
    ({"epochs": 2.0, "eval_every": 3}, 64, (4, 3, 2)),  # a value given wins
])
def test_epochs_give_the_steps_and_evaluation_and_checkpoints_once_per_epoch(fields, examples,
                                                                             expected):
  length = settings.length(_train(**fields), examples)
  assert (length.num_steps, length.eval_every, length.checkpoint_every) == expected


def test_epochs_and_num_steps_both_given_is_one_line_naming_both():
  with pytest.raises(RunError) as raised:
    settings.length(_train(epochs=2.0, num_steps=100), 250)
  message = str(raised.value)
  assert message.startswith("config.train.epochs: 2.0 and config.train.num_steps: 100 are both "
                            "set, expected one of them") and "\n" not in message
  config = classify_config.get_config()  # refused before anything is built
  config.train.update(epochs=2.0, num_steps=100)
  with pytest.raises(RunError, match="config.train.epochs: 2.0 and config.train.num_steps"):
    tasks.checked(config)


@pytest.mark.parametrize("field, value, expected", [
    ("optim.learning_rate", -1.0, "a number > 0"),
    ("optim.recipe", "sgd", "one of ('paper', 'adamw')"),
    ("train.epochs", 0.0, "a number > 0"),
    ("train.eval_every", 0, "an integer >= 1"),
])
def test_a_field_left_to_the_recipe_or_the_run_is_still_checked_when_given(field, value,
                                                                            expected):
  config = classify_config.get_config()
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(RunError) as raised:
    tasks.checked(config)
  assert str(raised.value) == f"config.{field}: {value!r}, expected {expected}"


def _as_today(config, **values) -> str:
  """`config` as a checkpoint of a run before the recipes recorded it: configs/classify.py's
  optimizer and length written out, and no train.epochs."""
  recorded = json.loads(config.to_json())
  recorded["optim"].update(recipe="adamw", learning_rate=1e-3, warmup_steps=100,
                           weight_decay=0.01)
  recorded["train"].update(num_steps=800, eval_every=200, checkpoint_every=200, **values)
  del recorded["train"]["epochs"]
  return json.dumps(recorded)


def test_a_run_recorded_with_todays_fields_resumes_with_them_left_to_the_recipe():
  definition = tasks.definition("classify")
  config = _classify()
  assert settings.check_resume(_as_today(config), config, 400, False, definition) == []
  assert settings.check_resume(config.to_json(), config, 400, False, definition) == []
  # One that started from a pretraining run ran at today's 1e-3: the pretrained recipe would
  # change it, which needs --allow_changes, or today's values given.
  started = _classify(run="runs/demo")
  with pytest.raises(RunError) as raised:
    settings.check_resume(_as_today(started), started, 400, False, definition)
  message = str(raised.value)
  assert message.startswith("config.optim.learning_rate: 5e-05 (the checkpoint has 0.001) (and "
                            "1 more: optim.warmup_steps): resuming would change the run")
  assert "\n" not in message
  started.optim.update(learning_rate=1e-3, warmup_steps=100)
  assert settings.check_resume(_as_today(started), started, 400, False, definition) == []


def test_a_fine_tuning_from_a_run_for_epochs_follows_the_recipe(reference_run, tmp_path):
  texts = {"digits": "0123456789", "letters": "abcdefghij"}
  lines = [json.dumps({"text": texts[label][i % 7:] * 2, "label": label})
           for i in range(100) for label in texts]
  (tmp_path / "train.jsonl").write_text("\n".join(lines))  # 200 examples
  (tmp_path / "eval.jsonl").write_text("\n".join(lines[:16]))
  workdir = str(tmp_path / "run")
  result = runs.train(workdir, f"--config={runs.ROOT}/configs/classify.py",
                      f"--config.data.train={tmp_path}/train.jsonl",
                      f"--config.data.eval={tmp_path}/eval.jsonl",
                      f"--config.init.run={reference_run}", "--config.train.epochs=2",
                      "--config.train.batch_size=8", "--config.train.seq_len=32",
                      "--config.train.log_every=1", config=None)
  assert ("50 steps (2 epochs of 200 examples in batches of 8), evaluation and checkpoint every "
          "25 steps and at the last; optimizer: adamw, peak learning rate 5e-05, warm-up 3 steps "
          "(6%), linear decay, weight decay 0.01 (the pretrained recipe: config.init.run is "
          "set)\n") in result.stderr
  records = runs.read_metrics(os.path.join(workdir, "metrics.jsonl"))
  rates = {r["step"]: r["lr"] for r in records if r["split"] == "train"}
  # Step s runs at 5e-5 * s / 3 up to the peak at the warm-up's last step (the first above 0,
  # so that a run of one step trains), then from the peak down to 0 at step 51.
  expected = {1: 5e-5 / 3, 2: 2 * 5e-5 / 3, 3: 5e-5, 4: 5e-5, 5: 5e-5 * 46 / 47,
              27: 5e-5 * 24 / 47, 50: 5e-5 / 47}
  assert {s: rates[s] for s in expected} == pytest.approx(expected, rel=1e-5, abs=1e-12)
  assert max(rates) == 50
  assert [r["step"] for r in records if r["split"] == "eval"] == [25, 50]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["25", "50"]


def test_a_run_recorded_before_the_packed_and_fresh_head_fields_resumes_without_a_change():
  for config, added in ((classify_config.get_config(), ("task", "packed")),
                        (default_config.get_config(), ("init", "fresh_head"))):
    recorded = json.loads(config.to_json())
    del recorded[added[0]][added[1]]  # as runs recorded it before the field was added
    assert settings.changes(json.dumps(recorded), config) == []
    config[added[0]][added[1]] = True
    assert [c.field for c in settings.changes(json.dumps(recorded), config)] == [".".join(added)]
