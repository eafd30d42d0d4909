r"""A fine-tuned run's predictions for new examples.

  python -m train.predict --workdir runs/cls --input new.jsonl --out predictions.jsonl

Each line of --input is a JSON object as the run's training lines, its label optional: the
text under the run's text field ("text"; a "text_pair" too if the run was trained on pairs),
or for a tagging run the words under its tokens field ("tokens"). Each line of --out is, in
input order:

  classify  {"label": the most probable class, "probabilities": {class: p, ...}}
  regress   {"score": the predicted number}
  tag       {"tags": [a tag per word]}: null for a word the model did not see (cut off by
            the run's seq_len, or tokenized to nothing)

Where lines carry labels (the run's label or tags field), the command also reports over them
what the run's evaluation reports: accuracy and macro-F1; the mean squared error, Pearson's and
Spearman's correlation; the accuracy over the words, macro-F1 and, for BIO tags, entity F1.
Lines are read, predicted and written a chunk at a time (1024, fewer where they are long), and
a text is cut to what the run's seq_len ids can show before it is tokenized, so any number of
lines of any length takes bounded memory; in a chunk, examples are padded to the smallest of a
few lengths that holds them (16, 32, …, the run's seq_len), so the model compiles once per
length. The parameters are the newest verified checkpoint's; the tokenizer, layout and classes
are the run's. For a classifier it computes what the file `python -m train.export --out
classifier.msgpack` writes computes outside the checkout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder.classifier import SequenceClassifier, macro_f1
from flax_encoder.inference import default_buckets, padded_batches
from flax_encoder.text_classifier import TextClassifier
from flax_encoder.token_classifier import TokenClassifier
from flax_encoder.tokenizer import Template, encode_examples, encode_words, is_cut
from train import examples, finetune, regress, sources, tag
from train.errors import RunError
from train.files import written_whole
from train.workdir import out_problem
from train.load import load_config, load_params, recorded_encoder_config

_CHUNK = 1024  # lines in memory at once
_MISSING = object()


@dataclasses.dataclass(frozen=True)
class Predicted:
  """What a prediction run did: `count` lines predicted, `cut` of them cut to what the run's
  seq_len ids show before they were tokenized; of the `labelled` ones, `scores` (what the
  run's evaluation reports), or None where no line had a label."""

  count: int
  labelled: int = 0
  scores: dict | None = None
  cut: int = 0


@dataclasses.dataclass(frozen=True)
class FineTuned:
  """A fine-tuning run read back from its workdir: its task's name, its model and parameters
  (the newest verified checkpoint's), its classes or tags (None for regression), its examples'
  dataset.json and its tokenizer."""

  task: str
  model: nn.Module
  params: dict
  labels: list | None
  meta: dict
  tokenizer: object  # flax_encoder.tokenizer.Tokenizer, its ids numbered as the model's

  @property
  def template(self) -> Template | None:
    """The special ids a Hugging Face tokenizer puts around the examples, or None."""
    template = self.meta.get("template")
    return Template.from_dict(template) if template else None


def read_run(workdir: str) -> FineTuned:
  """The fine-tuning run in `workdir`; RunError for a run of another kind."""
  config = load_config(workdir)
  task = config.task.get("name", "masked_lm")
  if task not in _PREDICTORS:
    raise RunError(f"--workdir {workdir}: a {task} run, expected a fine-tuning run (one of "
                   f"{tuple(_PREDICTORS)})")
  meta = examples.load_examples(os.path.join(workdir, "data"))["meta"]

  def model_for(record):
    cfg = recorded_encoder_config(record)
    if task == "tag":  # ModernBERT's prediction head where the run recorded one
      return TokenClassifier(cfg, len(record["labels"]), head=record.get("head", False))
    # The pooling the run used (finetune.pooling), recorded since config.init.hf could say it.
    pooling = record.get("pooling") or config.task.get("pooling") or "mean"
    outputs = 1 if task == "regress" else len(record["labels"])
    return SequenceClassifier(cfg, outputs, pooling, finetune.type_separator(meta))

  def init_for(record):
    model = model_for(record)
    return lambda: model.init(jax.random.PRNGKey(0), jnp.ones((1, 1), jnp.int32))["params"]

  params, record = load_params(workdir, init_for)
  return FineTuned(task, model_for(record), params, record.get("labels"), meta,
                   finetune.run_tokenizer(workdir, meta))


def _run(run: FineTuned | str, task: str) -> FineTuned:
  """`run` (a workdir, or the run read), which must be a `task` run."""
  given = run if isinstance(run, str) else "the run"
  run = read_run(run) if isinstance(run, str) else run
  if run.task != task:
    raise RunError(f"--workdir {given}: a {run.task} run, expected a {task} run")
  return run


class Predictor:
  """A fine-tuned classifier (`run`: a classify run's workdir, or the run read) as a
  `flax_encoder.text_classifier.TextClassifier`, with what predict reads and writes."""

  def __init__(self, run: FineTuned | str, batch_size: int = 64):
    run = _run(run, "classify")
    meta, model = run.meta, run.model
    self.fields, self.labels = meta["fields"], run.labels
    self.classifier = TextClassifier(model.config, run.params, run.labels, run.tokenizer,
                                     meta["seq_len"], meta["separator_id"], model.pooling,
                                     batch_size, run.template, model.type_separator)
    self.classes = {label: i for i, label in enumerate(self.labels)}

  def probabilities(self, texts: list[str], pairs: list[str | None]) -> np.ndarray:
    """[len(texts), classes]: each example's class probabilities, in order."""
    return self.classifier.probabilities(texts, pairs)

  def text_classifier(self) -> TextClassifier:
    return self.classifier

  def read(self, record: dict, where: str) -> tuple:
    """((text, pair), class index or -1 where the line has no label) of an input line."""
    label = record.get(self.fields["label"])
    if label is None:
      return _text(record, self.fields, where), -1
    if not examples.known(label, self.classes):
      raise RunError(f"{where}: label {label!r}, expected one of the run's classes "
                     f"{self.labels[:10]}")
    return _text(record, self.fields, where), self.classes[label]

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
  evaluation of a fine-tuning run computes them (train.classify.ClassifyTask)."""
  true_1hot, predicted_1hot = np.eye(num_labels)[true], np.eye(num_labels)[predicted]
  return {"accuracy": float(np.mean(true == predicted)),
          "macro_f1": macro_f1((true_1hot * predicted_1hot).sum(0), true_1hot.sum(0),
                               predicted_1hot.sum(0))}


class Regressor:
  """A fine-tuned regression (`run`: a regress run's workdir, or the run read): texts (and
  pairs) in, numbers out."""

  def __init__(self, run: FineTuned | str, batch_size: int = 64):
    run = _run(run, "regress")
    self.run, self.batch_size, self.fields = run, batch_size, run.meta["fields"]
    self.params = jax.device_put(run.params)
    self.buckets = default_buckets(run.model.config, run.meta["seq_len"])
    self._numbers = jax.jit(lambda params, ids: run.model.apply({"params": params}, ids)[:, 0])

  def numbers(self, texts: list[str], pairs: list[str | None]) -> np.ndarray:
    """float32 [len(texts)]: each example's predicted number, in order."""
    meta = self.run.meta
    rows = encode_examples(self.run.tokenizer, texts, pairs, meta["seq_len"],
                           meta["separator_id"], self.run.template)
    out = np.zeros(len(rows), np.float32)
    for batch, ids in padded_batches(rows, self.buckets, self.batch_size, meta["pad_id"]):
      out[batch] = np.asarray(self._numbers(self.params, ids))[:len(batch)]
    return out

  def read(self, record: dict, where: str) -> tuple:
    """((text, pair), the line's number or NaN where it has none)."""
    label, field = record.get(self.fields["label"]), self.fields["label"]
    return _text(record, self.fields, where), (
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
            "pearson": regress.pearson(predicted, true),
            "spearman": regress.spearman(predicted, true)}


class Tagger:
  """A fine-tuned tagger (`run`: a tag run's workdir, or the run read): words in, a tag per
  word out, laid out as the run's examples were (`encode_words`)."""

  def __init__(self, run: FineTuned | str, batch_size: int = 64):
    run = _run(run, "tag")
    self.run, self.batch_size, self.fields = run, batch_size, run.meta["fields"]
    self.labels, self.scheme = run.labels, tag.BIO.of(run.labels)
    self.tags_of = {t: i for i, t in enumerate(self.labels)}
    self.params = jax.device_put(run.params)
    self.buckets = default_buckets(run.model.config, run.meta["seq_len"])
    self._tags = jax.jit(
        lambda params, ids: jnp.argmax(run.model.apply({"params": params}, ids), -1))

  def tag_indices(self, texts: list[list[str]]) -> list[np.ndarray]:
    """Each text's predicted tag per word (an index into `labels`; -1 for a word the model
    does not see: cut off by seq_len, or tokenized to nothing), in order."""
    meta = self.run.meta
    laid = encode_words(self.run.tokenizer, texts, meta["seq_len"], self.run.template)
    out = [None] * len(laid)
    for batch, ids in padded_batches([row for row, _ in laid], self.buckets, self.batch_size,
                                     meta["pad_id"]):
      predicted = np.asarray(self._tags(self.params, ids))
      for j, i in enumerate(batch):
        first = laid[i][1]
        out[i] = np.where(first >= 0, predicted[j][np.maximum(first, 0)], -1)
    return out

  def read(self, record: dict, where: str) -> tuple:
    """(words, tag indices or None where the line has no tags)."""
    words, tags = record.get(self.fields["tokens"]), record.get(self.fields["tags"])
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
      raise RunError(f"{where}: expected a list of strings {self.fields['tokens']!r} (the "
                     f"words)")
    if tags is None:
      return words, None
    if not isinstance(tags, list) or len(tags) != len(words):
      raise RunError(f"{where}: {self.fields['tags']!r}: expected a list of one tag per word "
                     f"({len(words)}), or none")
    unknown = next((t for t in tags if not examples.known(t, self.tags_of)), _MISSING)
    if unknown is not _MISSING:
      raise RunError(f"{where}: tag {unknown!r}, expected one of the run's tags "
                     f"{self.labels[:10]}")
    return words, [self.tags_of[t] for t in tags]

  def predict(self, chunk: list) -> tuple[list[dict], list]:
    indices = self.tag_indices(chunk)
    return [{"tags": [None if i < 0 else self.labels[i] for i in row.tolist()]}
            for row in indices], indices

  def scores(self, true: list, predicted: list) -> dict | None:
    """Over the words the model saw of the tagged lines: tag.tag_metrics."""
    pairs = [(t, p) for t, p in zip(true, predicted) if t is not None]
    if not pairs:
      return None
    width = max([len(t) for t, _ in pairs] + [1])
    rows = np.full((2, len(pairs), width), -1, np.int64)
    for i, (t, p) in enumerate(pairs):
      rows[0, i, :len(t)], rows[1, i, :len(p)] = t, p
    tagged = (rows[0] >= 0) & (rows[1] >= 0)
    sums = tag.tag_sums(np.maximum(rows[0], 0), np.maximum(rows[1], 0), tagged,
                        len(self.labels), self.scheme)
    return tag.tag_metrics(jax.device_get(sums))


_PREDICTORS = {"classify": Predictor, "regress": Regressor, "tag": Tagger}


def _text(record: dict, fields: dict, where: str) -> tuple[str, str | None]:
  text, pair = record.get(fields["text"]), record.get(fields["pair"])
  if not isinstance(text, str) or (pair is not None and not isinstance(pair, str)):
    raise RunError(f"{where}: expected a string {fields['text']!r} field (and optionally "
                   f"{fields['pair']!r})")
  return text, pair


def predict(workdir: str, input_path: str, out_path: str, batch_size: int = 64,
            show: bool = False) -> Predicted:
  """Writes the predictions for `input_path` to `out_path`, with a progress bar if `show`.
  `out_path` appears once every line is predicted, never half-written."""
  check_arguments(input_path, out_path, batch_size)
  if not os.path.isdir(workdir):
    raise RunError(f"--workdir {workdir}: no such directory")
  problem = out_problem(out_path, workdir)
  if problem:
    raise RunError(problem)
  try:
    run = read_run(workdir)
  except FileNotFoundError as e:  # train.load: no checkpoint to read
    raise RunError(str(e)) from None
  predictor = _PREDICTORS[run.task](run, batch_size)
  source = sources.Source(input_path)

  def lines():
    try:
      for number, record in source.records():
        yield predictor.read(record, f"{input_path}:{number}")
    except sources.PrepareError as e:
      raise RunError(str(e)) from None
    except OSError as e:
      raise RunError(f"--input {input_path}: cannot read it ({e.strerror or e})") from None

  from tqdm import tqdm
  true, predicted, cut = [], [], 0
  seq_len = run.meta["seq_len"]
  # Chunks of bounded characters: a line of any length is held with few others.
  chunks = examples.chunked(lines(), _CHUNK, lambda line: line[0])
  try:  # an error, Ctrl-C or SIGTERM (main) leaves no half-written file behind
    with written_whole(out_path) as tmp, open(tmp, "w") as out, tqdm(
        desc="predict", unit="line", dynamic_ncols=True, disable=not show) as bar:
      for chunk in chunks:
        written, predictions = predictor.predict([example for example, _ in chunk])
        out.writelines(json.dumps(line) + "\n" for line in written)
        true += [label for _, label in chunk]
        predicted += list(predictions)
        cut += sum(_is_cut(example, seq_len) for example, _ in chunk)
        bar.update(len(chunk))
  except OSError as e:
    raise RunError(f"--out {out_path}: cannot write it ({e.strerror or e})") from None
  labelled = sum(not _unlabelled(t) for t in true)
  return Predicted(len(true), labelled, predictor.scores(true, predicted) if labelled else None,
                   cut)


def _is_cut(example, seq_len: int) -> bool:
  """Whether a line's text or pair, or its words, were cut before they were tokenized."""
  if isinstance(example, tuple):
    return any(is_cut(text, seq_len) for text in example)
  return is_cut(example, seq_len)


def _unlabelled(label) -> bool:
  return label is None or (isinstance(label, (int, np.integer)) and label < 0) or (
      isinstance(label, float) and np.isnan(label))


def check_arguments(input_path: str, out_path: str, batch_size: int) -> None:
  """RunError naming the argument where the paths or the batch size cannot be used: before
  anything is loaded, and above all before the input could be overwritten."""
  if not isinstance(batch_size, int) or batch_size < 1:
    raise RunError(f"--batch-size {batch_size}: expected a whole number of lines, 1 or more")
  if os.path.isdir(input_path):
    raise RunError(f"--input {input_path}: a directory, expected a JSON-lines file")
  if not os.path.isfile(input_path):
    raise RunError(f"--input {input_path}: no such file")
  if os.path.exists(out_path) and os.path.samefile(input_path, out_path):
    raise RunError(f"--out {out_path}: the file --input {input_path} names, expected another "
                   f"(the predictions would replace the texts)")


_NAMES = {"macro_f1": "macro-F1", "mse": "mean squared error", "pearson": "Pearson",
          "spearman": "Spearman", "entity_f1": "entity F1"}


def _interrupt(signum, frame):
  raise KeyboardInterrupt(signum)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m train.predict", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="a fine-tuning run")
  parser.add_argument("--input", required=True, help="JSON lines with the texts")
  parser.add_argument("--out", required=True, help="JSON lines of predictions, in order")
  parser.add_argument("--batch-size", type=int, default=64)
  args = parser.parse_args(argv)
  # SIGTERM as Ctrl-C: predict's cleanup runs (the default action would skip it).
  previous = signal.signal(signal.SIGTERM, _interrupt)
  try:
    done = predict(args.workdir, args.input, args.out, args.batch_size, show=True)
  except RunError as e:
    print(f"predict: error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt as e:
    print(f"predict: stopped; {args.out} not written", file=sys.stderr)
    return 128 + (e.args[0] if e.args else signal.SIGINT)
  finally:
    signal.signal(signal.SIGTERM, previous)
  scored = ""
  if done.scores is not None:
    scored = (f"; over the {done.labelled} labelled lines: "
              + ", ".join(f"{_NAMES.get(k, k)} {v:.3f}" for k, v in done.scores.items()))
  cut = (f"; {done.cut} line{'s' * (done.cut > 1)} cut before tokenizing, to what the run's "
         f"seq_len ids can show" if done.cut else "")
  print(f"{args.out}: {done.count} predictions{cut}{scored}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
