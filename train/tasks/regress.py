r"""Fine-tuning for a number per text (regression: STS-B's similarity of a pair, say).

  python -m train --config=configs/regress.py --workdir runs/sts \
      --config.data.train=train.jsonl --config.data.eval=eval.jsonl [--config.init.hf=bert-dir]

The lines are train.tasks.classify's with a number for a label: {"text": …, "text_pair": …,
"label": 3.8}. The model is the classifier's (the encoder, pooled, dropout, a dense layer) with
one output; the loss is the squared error, averaged over the batch (transformers'
*ForSequenceClassification with problem_type="regression"). Evaluation reports the mean
squared error (the loss), Pearson's and Spearman's correlation of the predictions with the
labels, and the squared error of always predicting the training labels' mean. The encoder
starts where train.tasks.finetune says.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder.classifier import SequenceClassifier, second_text_types
from flax_encoder.inference import default_buckets, padded_batches
from flax_encoder.tokenizer import encode_pairs
from train.data import examples
from train.task import Definition, Plots, Resume, Setup
from train.tasks import finetune
from train.tasks.start import pooling, start_params
from train.tasks.supervised import (FineTuned, SupervisedTask, hf_model, line_texts, read_run,
                                    run_of, sequence_classifier)
from train.tasks.tokenizing import run_tokenizer, type_separator


@dataclasses.dataclass(frozen=True)
class RegressTask(SupervisedTask):
  """Regression as `train.run.step` runs it (see `train.run.step.Task`). A batch holds 'tokens'
  [batch, seq] and 'labels' float32 [batch]; a held-out batch also 'index' [batch], each
  example's place among the held-out ones, and a NaN label pads the last."""

  model: SequenceClassifier  # with one output
  train_mean: float  # the baseline's prediction
  eval_count: int  # held-out examples

  def loss_count(self, batch: dict) -> jax.Array:
    return jnp.sum(~jnp.isnan(batch["labels"]))

  def loss_sum(self, params, batch: dict, dropout_rng: jax.Array) -> jax.Array:
    predicted = self.outputs(params, batch, dropout_rng)[:, 0]
    valid = ~jnp.isnan(batch["labels"])
    # The NaN of a padding row kept out of both branches: where() would pass its gradient.
    labels = jnp.where(valid, batch["labels"], 0.0)
    return jnp.sum(jnp.where(valid, (predicted - labels) ** 2, 0.0))

  def eval_sums(self, params, batch: dict) -> dict:
    """Each held-out example's prediction and label at its place in [eval_count] vectors,
    which added up over the batches hold them all: Spearman's correlation ranks them all."""
    predicted = self.outputs(params, batch)[:, 0]
    valid = ~jnp.isnan(batch["labels"])
    place = jax.nn.one_hot(batch["index"], self.eval_count, dtype=jnp.float32) * valid[:, None]
    return {"predicted": jnp.sum(place * predicted[:, None], 0),
            "labels": jnp.sum(place * jnp.where(valid, batch["labels"], 0.0)[:, None], 0)}

  def eval_metrics(self, sums: dict) -> dict:
    """Summed eval_sums -> loss (the mean squared error), Pearson's and Spearman's
    correlation, and the mean squared error of always predicting the training mean."""
    predicted, labels = sums["predicted"], sums["labels"]
    return {"loss": float(np.mean((predicted - labels) ** 2)),
            "pearson": pearson(predicted, labels), "spearman": spearman(predicted, labels),
            "baseline_mse": float(np.mean((labels - self.train_mean) ** 2))}


def pearson(x, y) -> float:
  """Pearson's correlation of two sequences of numbers; NaN where either is constant."""
  x, y = (np.asarray(v, np.float64) for v in (x, y))
  dx, dy = x - x.mean(), y - y.mean()
  scale = np.sqrt(np.sum(dx * dx) * np.sum(dy * dy))
  return float(np.sum(dx * dy) / scale) if scale > 0 else float("nan")


def ranks(x) -> np.ndarray:
  """The rank of each number (1 for the smallest), tied numbers all with their mean rank."""
  _, inverse, counts = np.unique(np.asarray(x), return_inverse=True, return_counts=True)
  last = np.cumsum(counts)
  return ((last - counts + 1 + last) / 2)[inverse.ravel()]


def spearman(x, y) -> float:
  """Spearman's rank correlation: Pearson's of the ranks (mean ranks for ties, as
  scipy.stats.spearmanr)."""
  return pearson(ranks(x), ranks(y))


class Regressor:
  """A fine-tuned regression (`run`: a regress run's workdir, or the run read): texts (and
  pairs) in, numbers out."""

  task = "regress"
  # Whether a pair's token types come from where its second text begins, as the tokenizer
  # gives them (a rerank run trains so); else from the first separator (a regress run's).
  types_from_pairs = False

  def __init__(self, run: FineTuned | str, batch_size: int = 64):
    run = run_of(run, type(self))
    self.run, self.batch_size, self.fields = run, batch_size, run.meta["fields"]
    self.params = jax.device_put(run.params)
    self.buckets = default_buckets(run.model.config, run.meta["seq_len"])
    self.typed = self.types_from_pairs and run.model.type_separator is not None
    self._numbers = jax.jit(lambda params, ids, types: run.model.apply(
        {"params": params}, ids, token_types=types)[:, 0])

  @staticmethod
  def model_for(cfg, record: dict, config, meta: dict) -> SequenceClassifier:
    """The model of a run whose checkpoint records `record` (see classify.Predictor)."""
    pooling = record.get("pooling") or config.task.get("pooling") or "mean"
    return SequenceClassifier(cfg, 1, pooling, type_separator(meta))

  def numbers(self, texts: list[str], pairs: list[str | None]) -> np.ndarray:
    """float32 [len(texts)]: each example's predicted number, in order."""
    meta = self.run.meta
    laid = encode_pairs(self.run.tokenizer, texts, pairs, meta["seq_len"],
                        meta["separator_id"], self.run.template)
    rows = [ids for ids, _ in laid]
    out = np.zeros(len(rows), np.float32)
    for batch, ids in padded_batches(rows, self.buckets, self.batch_size, meta["pad_id"]):
      types = None
      if self.typed:  # the rows that fill the batch up: no second text
        seconds = np.full(len(ids), ids.shape[1])
        seconds[:len(batch)] = [laid[i][1] for i in batch]
        types = second_text_types(seconds, ids.shape[1])
      out[batch] = np.asarray(self._numbers(self.params, ids, types))[:len(batch)]
    return out

  def read(self, record: dict, where: str) -> tuple:
    """((text, pair), the line's number or NaN where it has none)."""
    label, field = record.get(self.fields["label"]), self.fields["label"]
    return line_texts(record, self.fields, where), (
        np.nan if label is None else examples.target(label, where, field))

  def predict(self, chunk: list) -> tuple[list[dict], list]:
    numbers = self.numbers([t for t, _ in chunk], [p for _, p in chunk])
    return [{"score": float(n)} for n in numbers], numbers.tolist()

  def scores(self, true: list, predicted: list) -> dict | None:
    true, predicted = np.asarray(true, np.float64), np.asarray(predicted, np.float64)
    labelled = ~np.isnan(true)
    if not labelled.any():
      return None
    true, predicted = true[labelled], predicted[labelled]
    return {"mse": float(np.mean((predicted - true) ** 2)),
            "pearson": pearson(predicted, true), "spearman": spearman(predicted, true)}


# ---------------------------------------------------------------------------------------------
# What the loop needs, and what the program knows of the task.


def setup(config, workdir: str, resume: Resume) -> Setup:
  """Regression on config.data.train and config.data.eval, from config.init."""
  paths = {"train": config.data.train, "eval": config.data.eval}
  prepared = finetune.prepare_texts(config, workdir, resume, paths, "number")
  cfg, meta, loaded = prepared.encoder, prepared.meta, prepared.loaded
  train_mean = float(np.mean(loaded["train"]["labels"], dtype=np.float64))
  model = SequenceClassifier(cfg, 1, pooling(config, prepared.start), type_separator(meta),
                             check_traced_ids=False)
  count = meta["examples"]["eval"]
  task = RegressTask(model, train_mean, count)
  finetune.say_prepared(prepared, f"a number per example (the training mean {train_mean:.4g})",
                        config.train.seq_len)
  return Setup(task=task, encoder=cfg, train=loaded["train"],
               eval={**loaded["eval"], "index": np.arange(count, dtype=np.int32)},
               eval_fill={"tokens": prepared.pad_id, "labels": np.nan, "index": 0},
               record={"encoder": cfg.record(), "dataset": loaded["identity"],
                       "source": os.path.join(workdir, "data"),
                       "start": prepared.start.source, "pooling": model.pooling,
                       "family": prepared.start.family},
               start_params=start_params(prepared.start, cfg, config, 1,
                                                  model.pooling))


def summary(metrics: dict) -> str:
  return (f"eval mean squared error {metrics['loss']:.4g} (always the training mean "
          f"{metrics['baseline_mse']:.4g}), Pearson {metrics['pearson']:.3f}, Spearman "
          f"{metrics['spearman']:.3f}")


DEFINITION = Definition(
    name=Regressor.task,
    fields={**finetune.FIELDS, **finetune.TEXT_FIELDS},
    setup=setup,
    plots=Plots(loss_title="Regression loss", loss_unit="squared error / example",
                train_loss="train", eval_loss="eval mean squared error",
                loss_baseline=("baseline_mse", "baseline: the training mean"),
                metrics={"pearson": "Pearson", "spearman": "Spearman"}, baseline=None,
                score_range=(-1, 1), accuracy_title="Held-out correlation with the labels"),
    summary=summary,
    predictor=Regressor,
    hf_model=lambda workdir, config: hf_model(
        read_run(workdir, Regressor),
        lambda run, family: sequence_classifier(run, family, "regression")),
    check=finetune.check,
    tokenizer=lambda config, workdir: run_tokenizer(workdir),
)
