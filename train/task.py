"""The contract between a task and the program: what a task supplies, and nothing else.

A task is one module that defines `DEFINITION = Definition(...)`: its name, its config fields and
their checks, the setup that builds its model and data, the labels of its plots, the line that sums
up a finished run, what `python -m train.export` writes of it (and as a Hugging Face model) and what
`python -m train.predict` runs. The loop, checkpoints, metrics, plots, predict, export and the
settings checks read those facts from here and know no task by name.

Adding a task takes one module in train/tasks/ that defines DEFINITION, one config file in
configs/, and its module's name in the registry (train/tasks/__init__.py), which lists the
tasks there are: `train.tasks.masked_lm` (pretraining), and for fine-tuning
`train.tasks.classify`, `train.tasks.regress`, `train.tasks.tag`, `train.tasks.contrastive`,
`train.tasks.rerank`, `train.tasks.sparse` and `train.tasks.multi_vector`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax
import numpy as np

from flax_encoder import EncoderConfig
from train.errors import RunError


class Task(Protocol):
  """What a task supplies to the jitted steps (`train.run.step`). Every method but
  `eval_metrics` and `token_count` is pure and runs under jit."""

  def init(self, rng: jax.Array, seq_len: int) -> Any:
    """The model's parameters, boxed with their logical axes."""

  def batch(self, rows: Any, key: jax.Array) -> dict:
    """The host's rows of a batch -> the step's batch (a dict of arrays whose leading axis is
    the batch); random choices (masking) are drawn from `key`."""

  def loss_count(self, batch: dict) -> jax.Array:
    """What the training loss of `batch` is averaged over (masked positions, examples)."""

  def loss_sum(self, params, batch: dict, dropout_rng: jax.Array) -> jax.Array:
    """The training loss summed over `batch` (dropout on)."""

  def eval_sums(self, params, batch: dict) -> dict:
    """Sums over `batch` that evaluation adds up over batches (dropout off)."""

  def eval_metrics(self, sums: dict) -> dict:
    """The added-up eval_sums -> the metrics an evaluation reports ("loss" among them)."""

  def token_count(self, rows: Any) -> int:
    """Tokens in the host's rows of one batch, for the throughput the loop logs."""


@dataclasses.dataclass(frozen=True)
class Resume:
  """Whether the run resumes a checkpoint, and whether the user allowed it to change what the
  run computes (--allow_changes). Tasks whose data is prepared into the workdir consult it
  before preparing again."""

  resuming: bool = False
  allow_changes: bool = False

  def check_dataset(self, step: int, recorded: str | None, current: str, source: str) -> None:
    """RunError if the data (its identity) is not what the checkpoint at `step` recorded."""
    if recorded and recorded != current and not self.allow_changes:
      raise RunError(f"config.data: {source} is not the data the checkpoint (step {step}) was "
                     f"trained on: it was prepared again since (its dataset.json differs); "
                     f"point at the run's data, train in a new workdir, or pass "
                     f"--allow_changes to resume on it")

  @staticmethod
  def check_shapes(step: int, recorded: dict, current: dict, source: str) -> None:
    """RunError if the model the data makes (its vocabulary, a classifier's classes: in
    `current`, a task's Setup.record) is not the checkpoint's (`recorded`, its meta): no
    --allow_changes resumes parameters of other shapes."""
    pairs = [(f"model.{k}", v, (recorded.get("encoder") or {}).get(k, v))
             for k, v in current.get("encoder", {}).items()]
    if "labels" in current:
      pairs.append(("classes", current["labels"], recorded.get("labels", current["labels"])))
    for what, now, then in pairs:
      if now != then:
        raise RunError(f"config.data: {source} makes {what} {now!r}, the checkpoint's "
                       f"(step {step}) is {then!r}: a model of another shape "
                       f"cannot resume from it; point at the run's data, or train in a new "
                       f"workdir")


@dataclasses.dataclass
class Setup:
  """What a task's setup gives the loop.

  Attributes:
    task: the model, batches, losses and metrics.
    encoder: the encoder's config.
    train: the training rows the batches are drawn from: an array [n, ...] or a dict of them.
    eval: the held-out rows, of the same kind; `eval_fill` is the value (or dict of values)
      that pads their last batch without counting.
    record: JSON the checkpoint records beside the config: "encoder" (EncoderConfig.record()),
      "dataset" (what identifies the data, checked on resume), "source" (where it lies, for
      messages), and what the task's readers need (a classifier's "labels").
    start_params: parameters to start from by their top-level name (the encoder's, a
      classifier's), replacing the fresh ones; None: a fresh init.
    sources: where the training rows are those of several datasets (train.data.dataset.Sources).
    packer: for a task whose batches are packed on the host: shards -> a packer
      (train.tasks.packed_pairs.PairPacker) of batches split over that many devices; None:
      a batch is its rows as they are.
  """

  task: Task
  encoder: EncoderConfig
  train: Any
  eval: Any
  eval_fill: Any
  record: dict
  start_params: dict | None = None
  sources: Any = None
  packer: Any = None


@dataclasses.dataclass(frozen=True)
class HFModel:
  """A run as transformers' model of its task (`python -m train.export --layout hf`).

  Attributes:
    encoder: the encoder's config.
    family: the Hugging Face family the run recorded (it started from such a directory);
      None: the one its architecture derives (`flax_encoder.families.of_architecture`).
    state: family -> (the state dict of the family's *For… model of the task, its config.json
      entries: architectures, id2label, …); a families.HFError where the run is no such model.
    tokenizer: the tokenizer.json whose own ids the run's are, copied beside the weights;
      None where the ids are this project's (offset) numbering.
  """

  encoder: EncoderConfig
  family: str | None
  state: Callable[[Any], tuple[dict, dict]]
  tokenizer: str | None


@dataclasses.dataclass(frozen=True)
class Plots:
  """How a task's plots are titled and labelled. `metrics` are the eval metrics drawn on the
  accuracy plot (name -> legend), `baseline` the metric drawn dashed there as the baseline
  (None: none), `score_range` its y-axis; `eval_loss` labels the held-out loss on the loss
  plot, and `loss_baseline` a metric drawn dashed beside it (None: none)."""

  loss_title: str
  loss_unit: str
  train_loss: str
  metrics: dict
  baseline: tuple[str, str] | None
  accuracy_title: str = "Held-out accuracy"
  eval_loss: str = "eval cross-entropy"
  loss_baseline: tuple[str, str] | None = None
  score_range: tuple[float, float] = (0, 1)


# ---------------------------------------------------------------------------------------------
# Config fields: each one's check, and what changing it does to a run that resumes.

Check = Callable[[object], "str | None"]  # value -> what was expected, or None if it is fine

FREE = "free"  # a resumed run may change it without a word (how long, how often, the layout)
CHANGES_RUN = "changes the run"  # changes what the run computes: resuming needs --allow_changes
FIXES_STATE = "fixes the state"  # fixes what the checkpoint holds: a change cannot resume


@dataclasses.dataclass(frozen=True)
class Field:
  check: Check
  resume: str = CHANGES_RUN


def integer(minimum: int) -> Check:
  def check(value):
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= minimum
    return None if ok else f"an integer >= {minimum}"
  return check


def number(low: float, high: float | None = None, low_open=True, high_open=False) -> Check:
  if high is None:
    wanted = f"a number {'>' if low_open else '>='} {low:g}"
  else:
    wanted = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

  def check(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      return wanted
    above = value > low if low_open else value >= low
    below = high is None or (value < high if high_open else value <= high)
    return None if above and below else wanted
  return check


def choice(allowed: tuple) -> Check:
  return lambda value: None if value in allowed else f"one of {allowed}"


def optional(check: Check) -> Check:
  return lambda value: None if value is None else check(value)


def boolean(value):
  return None if isinstance(value, bool) else "True or False"


def string(value):
  return None if isinstance(value, str) and value else "a non-empty string"


def paths(value):
  ok = isinstance(value, (tuple, list)) and all(isinstance(p, str) and p for p in value)
  return None if ok else "a tuple of file paths"


@dataclasses.dataclass(frozen=True)
class Definition:
  """Everything the program knows of a task.

  Attributes:
    name: config.task.name.
    fields: the config fields the task reads beyond the common ones ({"task.x": Field}); the
      model's fields and the common ones are train.run.settings'.
    setup: (config, workdir, Resume) -> Setup.
    plots: the labels of its plots.
    summary: the last evaluation's metrics -> the line a finished run prints.
    export: (workdir, out, options) -> the path written, for `python -m train.export`; None
      exports the encoder alone.
    predictor: what `python -m train.predict` runs, for a task that predicts (the supervised
      ones: `train.tasks.supervised`): built as predictor(run, batch_size) from the run read back,
      it reads an input line (`read(record, where)` -> (example, label or a stand-in for
      none)), predicts a chunk of examples (`predict(examples)` -> (output lines,
      predictions)) and scores the labelled ones (`scores(labels, predictions)`); its
      `model_for(cfg, record, config, meta)` rebuilds the run's model from a checkpoint's
      record. None: the task predicts nothing (pretraining).
    hf_model: (workdir, config) -> HFModel: the run as transformers' model of the task, for
      `python -m train.export --layout hf`; None: the task has none.
    sentence_encoder: workdir -> the run as a `flax_encoder.embeddings.SentenceEncoder` (texts
      to vectors), for `python -m train.embed --model WORKDIR` and `python -m train.export
      --layout sentence-transformers` (its hf_model is the Transformer module); None: the
      task embeds no sentences.
    check: cross-field checks of the config (RunError), after each field's own.
    tokenizer: (config, workdir) -> the run's tokenizer (train.data.tokens.Tokenizer), its ids
      numbered as the model's; None: the prepared data's (train.data.dataset.run_tokenizer).
    defaults: config -> None: sets the fields the config leaves to the task (unset, None) to
      what the run's start suggests, and says so, before any field is checked; None: none.
  """

  name: str
  fields: dict[str, Field]
  setup: Callable[..., Setup]
  plots: Plots
  summary: Callable[[dict], str]
  export: Callable[..., str] | None = None
  predictor: Any = None
  hf_model: Callable[..., HFModel] | None = None
  sentence_encoder: Callable[[str], Any] | None = None
  check: Callable[[Any], None] | None = None
  tokenizer: Callable[..., Any] | None = None
  defaults: Callable[[Any], None] | None = None
