r"""Fine-tuning: the encoder and a classification head trained on the user's labelled texts.

  python -m train --config=configs/classify.py --workdir runs/cls \
      --config.data.train=train.jsonl --config.data.eval=eval.jsonl \
      [--config.init.run=runs/demo | --config.init.torch_checkpoint=model.pt \
       --config.init.n_heads=8]

The task of the training loop's second kind (`ClassifyTask`, beside `masked_lm.MaskedLMTask`):
the model is the encoder, a pooling over the real tokens (their mean, or the first token),
dropout and a dense layer to one logit per class; the loss is cross-entropy; evaluation
reports accuracy, macro-F1 and the majority-class baseline. The encoder starts from a
pretraining run's newest verified checkpoint (`config.init.run`: its sizes and tokenizer), from
a PyTorch checkpoint (`config.init.torch_checkpoint`, sizes read off the weights, and the
classifier's Linear from `config.init.torch_head` if given), from a Hugging Face directory
(`config.init.hf`) or from scratch (train.finetune, which `train.regress` and `train.tag`
share). The examples (train.examples) are prepared once into WORKDIR/data.
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
from train import examples, finetune
from train.errors import RunError
from train.optim import smoothed_loss_sum
from train.finetune import pooling, type_separator
from train.task import Definition, Plots, Resume, Setup


@dataclasses.dataclass(frozen=True)
class ClassifyTask:
  """Classification as `train.step` runs it (see `train.step.Task`). A batch holds 'tokens'
  [batch, seq] and 'labels' [batch]; a label of -1 pads the last held-out batch."""

  model: Classifier
  label_smoothing: float
  baseline_label: int  # the training data's commonest class

  def init(self, rng: jax.Array, seq_len: int):
    return self.model.init(rng, jnp.ones((1, seq_len), jnp.int32))["params"]

  def batch(self, rows: dict, key: jax.Array) -> dict:
    return rows  # nothing drawn: the examples are the batch

  def loss_count(self, batch: dict) -> jax.Array:
    return jnp.sum(batch["labels"] >= 0)

  def loss_sum(self, params, batch: dict, dropout_rng: jax.Array) -> jax.Array:
    logits = self.model.apply({"params": params}, batch["tokens"], deterministic=False,
                              rngs={"dropout": dropout_rng})
    return smoothed_loss_sum(logits, batch["labels"], batch["labels"] >= 0,
                             self.label_smoothing)

  def eval_sums(self, params, batch: dict) -> dict:
    logits = self.model.apply({"params": params}, batch["tokens"])
    labels = batch["labels"]
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
  def token_count(rows: dict) -> int:
    """Ids in a batch of examples, padding included."""
    return int(rows["tokens"].size)

  @staticmethod
  def eval_metrics(sums: dict) -> dict:
    """Summed eval_sums -> loss, accuracy, the majority-class baseline's accuracy, and
    macro-F1: the mean F1 over the classes that occur in the labels or the predictions."""
    count = max(float(sums["count"]), 1.0)
    return {"loss": float(sums["ce"]) / count, "accuracy": float(sums["correct"]) / count,
            "baseline_accuracy": float(sums["baseline_correct"]) / count,
            "macro_f1": macro_f1(sums["true_positives"], sums["true"], sums["predicted"])}


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
  labels = meta["labels"]
  params = finetune.start_params(prepared.start, cfg, config, len(labels), pooling(config),
                                 labels)
  counts = np.bincount(np.asarray(loaded["train"]["labels"]), minlength=len(labels))
  model = Classifier(cfg, len(labels), pooling(config), type_separator(meta))
  task = ClassifyTask(model, config.optim.label_smoothing, int(np.argmax(counts)))
  finetune.say_prepared(prepared, f"{len(labels)} classes", config.train.seq_len)
  return Setup(task=task, encoder=cfg, train=loaded["train"], eval=loaded["eval"],
               eval_fill={"tokens": prepared.pad_id, "labels": -1},
               record={"encoder": cfg.record(), "dataset": loaded["identity"],
                       "source": os.path.join(workdir, "data"), "labels": labels,
                       "start": prepared.start.source, "pooling": model.pooling},
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
  from train.predict import Predictor
  Predictor(workdir).text_classifier().save(out)
  return out


DEFINITION = Definition(
    name="classify",
    fields={**finetune.FIELDS, **finetune.TEXT_FIELDS},
    setup=setup,
    plots=Plots(loss_title="Classification loss", loss_unit="nats / example",
                train_loss="train", metrics={"accuracy": "accuracy", "macro_f1": "macro-F1"},
                baseline=("baseline_accuracy", "baseline: majority class"),
                accuracy_title="Held-out accuracy and macro-F1"),
    summary=summary,
    export=export,
    check=finetune.check,
    tokenizer=lambda config, workdir: finetune.run_tokenizer(workdir),
)
