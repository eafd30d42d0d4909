r"""Fine-tuning: the encoder and a classification head trained on the user's labelled texts.

  python -m train --config=configs/classify.py --workdir runs/cls \
      --config.data.train=train.jsonl --config.data.eval=eval.jsonl \
      [--config.init.run=runs/demo | --config.init.torch_checkpoint=model.pt \
       --config.init.n_heads=8]

The task of the training loop's second kind (`ClassifyTask`, beside `masked_lm.MaskedLMTask`): the
model is the encoder, a pooling over the real tokens (their mean, or the first token), dropout and a
dense layer to one logit per class; the loss is cross-entropy; evaluation reports accuracy, macro-F1
and the majority-class baseline. With config.task.packed, several short examples share a row
(prepared so once, train.data.examples.pack), each encoded and pooled as if alone: losses and
metrics are per example as unpacked, and config.train.batch_size counts rows. The encoder
starts from a pretraining run's newest verified checkpoint (`config.init.run`: its sizes and
tokenizer), from a PyTorch checkpoint (`config.init.torch_checkpoint`, sizes read off the
weights, and the classifier's Linear from `config.init.torch_head` if given), from a Hugging
Face directory (`config.init.hf`) or from scratch (train.tasks.finetune, which
`train.tasks.regress` and `train.tasks.tag` share). The examples (train.data.examples) are
prepared once into WORKDIR/data.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from flax_encoder.classifier import macro_f1
from flax_encoder.classifier import SequenceClassifier as Classifier
from flax_encoder.text_classifier import TextClassifier
from train.data import examples
from train.errors import RunError
from train.run.optim import smoothed_loss_sum
from train.task import Definition, Plots, Resume, Setup
from train.tasks import finetune
from train.tasks.start import pooling, start_params
from train.tasks.supervised import (FineTuned, SupervisedTask, hf_model, line_texts, read_run,
                                    run_of, sequence_classifier)
from train.tasks.tokenizing import run_tokenizer, type_separator


@dataclasses.dataclass(frozen=True)
class ClassifyTask(SupervisedTask):
  """Classification as `train.run.step` runs it (see `train.run.step.Task`). A batch holds 'tokens'
  [batch, seq] and 'labels' [batch]; a label of -1 pads the last held-out batch. Packed, it
  also holds 'segment_ids' [batch, seq], and 'labels' [batch, max_segments] are its rows'
  examples' (-1 where a row has fewer): every sum is over the examples, as unpacked."""

  model: Classifier
  label_smoothing: float
  baseline_label: int  # the training data's commonest class

  def loss_count(self, batch: dict) -> jax.Array:
    return jnp.sum(batch["labels"] >= 0)

  def loss_sum(self, params, batch: dict, dropout_rng: jax.Array) -> jax.Array:
    logits, labels = self._examples(self.outputs(params, batch, dropout_rng), batch)
    return smoothed_loss_sum(logits, labels, labels >= 0, self.label_smoothing)

  def eval_sums(self, params, batch: dict) -> dict:
    logits, labels = self._examples(self.outputs(params, batch), batch)
    valid = labels >= 0
    predicted = jnp.argmax(logits, -1)
    true_1hot = jax.nn.one_hot(labels, self.model.num_labels) * valid[:, None]
    predicted_1hot = jax.nn.one_hot(predicted, self.model.num_labels) * valid[:, None]
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
    return {"ce": jnp.sum(ce * valid), "correct": jnp.sum((predicted == labels) & valid),
            "baseline_correct": jnp.sum((labels == self.baseline_label) & valid),
            "count": jnp.sum(valid), "true_positives": jnp.sum(true_1hot * predicted_1hot, 0),
            "true": jnp.sum(true_1hot, 0), "predicted": jnp.sum(predicted_1hot, 0)}

  @staticmethod
  def _examples(logits: jax.Array, batch: dict) -> tuple[jax.Array, jax.Array]:
    """Logits [examples, classes] and labels [examples]: of packed rows, every segment's
    (those no example fills labelled -1)."""
    return logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1)

  @staticmethod
  def eval_metrics(sums: dict) -> dict:
    """Summed eval_sums -> loss, accuracy, the majority-class baseline's accuracy, and
    macro-F1: the mean F1 over the classes that occur in the labels or the predictions."""
    count = max(float(sums["count"]), 1.0)
    return {"loss": float(sums["ce"]) / count, "accuracy": float(sums["correct"]) / count,
            "baseline_accuracy": float(sums["baseline_correct"]) / count,
            "macro_f1": macro_f1(sums["true_positives"], sums["true"], sums["predicted"])}


class Predictor:
  """A fine-tuned classifier (`run`: a classify run's workdir, or the run read) as a
  `flax_encoder.text_classifier.TextClassifier`, with what predict reads and writes."""

  task = "classify"

  def __init__(self, run: FineTuned | str, batch_size: int = 64):
    run = run_of(run, Predictor)
    meta, model = run.meta, run.model
    self.fields, self.labels = meta["fields"], run.labels
    self.classifier = TextClassifier(model.config, run.params, run.labels, run.tokenizer,
                                     meta["seq_len"], meta["separator_id"], model.pooling,
                                     batch_size, run.template, model.type_separator)
    self.classes = {label: i for i, label in enumerate(self.labels)}

  @staticmethod
  def model_for(cfg, record: dict, config, meta: dict) -> Classifier:
    """The model of a run whose checkpoint records `record` (its config `config`, its
    examples' dataset.json `meta`)."""
    # The pooling the run used (train.tasks.start.pooling), recorded since config.init.hf could
    # say it.
    pooling = record.get("pooling") or config.task.get("pooling") or "mean"
    return Classifier(cfg, len(record["labels"]), pooling, type_separator(meta))

  def probabilities(self, texts: list[str], pairs: list[str | None]) -> np.ndarray:
    """[len(texts), classes]: each example's class probabilities, in order."""
    return self.classifier.probabilities(texts, pairs)

  def text_classifier(self) -> TextClassifier:
    return self.classifier

  def read(self, record: dict, where: str) -> tuple:
    """((text, pair), class index or -1 where the line has no label) of an input line."""
    label = record.get(self.fields["label"])
    if label is None:
      return line_texts(record, self.fields, where), -1
    if not examples.known(label, self.classes):
      raise RunError(f"{where}: label {label!r}, expected one of the run's classes "
                     f"{self.labels[:10]}")
    return line_texts(record, self.fields, where), self.classes[label]

  def predict(self, chunk: list) -> tuple[list[dict], list]:
    """The output lines of examples, and each one's predicted class."""
    probabilities = self.probabilities([t for t, _ in chunk], [p for _, p in chunk])
    lines = [{"label": self.labels[int(np.argmax(row))],
              "probabilities": {str(label): round(float(p), 6)
                                for label, p in zip(self.labels, row)}}
             for row in probabilities]
    return lines, np.argmax(probabilities, -1).tolist()

  def scores(self, true: list, predicted: list) -> dict | None:
    true, predicted = np.asarray(true, np.int64), np.asarray(predicted, np.int64)
    labelled = true >= 0
    if not labelled.any():
      return None
    return scores(true[labelled], predicted[labelled], len(self.labels))


def scores(true: np.ndarray, predicted: np.ndarray, num_labels: int) -> dict:
  """Accuracy and macro-F1 (the mean F1 over the classes that occur in either), as the
  evaluation computes them (`ClassifyTask`)."""
  true_1hot, predicted_1hot = np.eye(num_labels)[true], np.eye(num_labels)[predicted]
  return {"accuracy": float(np.mean(true == predicted)),
          "macro_f1": macro_f1((true_1hot * predicted_1hot).sum(0), true_1hot.sum(0),
                               predicted_1hot.sum(0))}


# ---------------------------------------------------------------------------------------------
# What the loop needs.


def setup(config, workdir: str, resume: Resume) -> Setup:
  """Fine-tuning on config.data.train and config.data.eval, from config.init."""
  paths = {"train": config.data.train, "eval": config.data.eval}
  if examples.BUILTIN in paths.values():
    if set(paths.values()) != {examples.BUILTIN}:
      raise RunError(f"config.data.eval: {paths['eval']!r}: the built-in task holds out its own "
                     f"examples; set both config.data.train and config.data.eval to "
                     f"{examples.BUILTIN!r}, or neither")
    if jax.process_index() == 0:
      paths = examples.write_builtin(os.path.join(workdir, "builtin"))
    else:
      paths = {s: os.path.join(workdir, "builtin", f"{s}.jsonl") for s in paths}
  prepared = finetune.prepare_texts(config, workdir, resume, paths, "class")
  cfg, meta, loaded = prepared.encoder, prepared.meta, prepared.loaded
  labels, pooled_by = meta["labels"], pooling(config, prepared.start)
  params = start_params(prepared.start, cfg, config, len(labels), pooled_by, labels)
  train_labels = np.asarray(loaded["train"]["labels"]).ravel()
  counts = np.bincount(train_labels[train_labels >= 0], minlength=len(labels))
  packed = meta.get("packed")
  model = Classifier(cfg, len(labels), pooled_by, type_separator(meta),
                     packed and packed["max_segments"], check_traced_ids=False)
  task = ClassifyTask(model, config.optim.label_smoothing, int(np.argmax(counts)))
  note = ""
  if packed:
    rows = meta["rows"]["train"]
    note = (f"; packed {rows} rows ({meta['examples']['train'] / rows:.2f} examples a row, "
            f"config.train.batch_size counts rows)")
  finetune.say_prepared(prepared, f"{len(labels)} classes", config.train.seq_len, note)
  return Setup(task=task, encoder=cfg, train=loaded["train"], eval=loaded["eval"],
               eval_fill={"tokens": prepared.pad_id, "labels": -1,
                          **({"segment_ids": 0} if packed else {})},
               record={"encoder": cfg.record(), "dataset": loaded["identity"],
                       "source": os.path.join(workdir, "data"), "labels": labels,
                       "start": prepared.start.source, "pooling": model.pooling,
                       "family": prepared.start.family},
               start_params=params)


# ---------------------------------------------------------------------------------------------
# What the program knows of the task.


def summary(metrics: dict) -> str:
  return (f"eval accuracy {metrics['accuracy']:.3f}, macro-F1 {metrics['macro_f1']:.3f} "
          f"(majority class {metrics['baseline_accuracy']:.3f}), eval loss "
          f"{metrics['loss']:.3f}")


def export(workdir: str, out: str) -> str:
  """Writes the run's classifier (encoder, head, tokenizer and classes) to `out` (.msgpack), a
  file `flax_encoder.text_classifier.TextClassifier.load` turns into text -> labels."""
  Predictor(workdir).text_classifier().save(out)
  return out


DEFINITION = Definition(
    name=Predictor.task,
    fields={**finetune.FIELDS, **finetune.TEXT_FIELDS},
    setup=setup,
    plots=Plots(loss_title="Classification loss", loss_unit="nats / example",
                train_loss="train", metrics={"accuracy": "accuracy", "macro_f1": "macro-F1"},
                baseline=("baseline_accuracy", "baseline: majority class"),
                accuracy_title="Held-out accuracy and macro-F1"),
    summary=summary,
    export=export,
    predictor=Predictor,
    hf_model=lambda workdir, config: hf_model(read_run(workdir, Predictor), sequence_classifier),
    check=finetune.check,
    tokenizer=lambda config, workdir: run_tokenizer(workdir),
)
