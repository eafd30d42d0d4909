r"""A fine-tuned run's predictions for new texts.

  python -m train.predict --workdir runs/cls --input new.jsonl --out predictions.jsonl

Each line of --input is a JSON object with the text under the run's text field ("text"; a
"text_pair" too if the run was trained on pairs). Each line of --out is {"label": the most
probable class, "probabilities": {class: p, ...}}, in input order. Where lines carry a label
(the run's label field), the command also reports accuracy and macro-F1 over them. Lines are
read, predicted and written a chunk at a time, so any number of them takes bounded memory;
in a chunk, examples are padded to the smallest of a few lengths that holds them (16, 32, …,
the run's seq_len), so the model compiles once per length. The parameters are the newest
verified checkpoint's; the tokenizer and classes are the run's. It computes what the file
`python -m train.export --out classifier.msgpack` writes computes outside the checkout.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import signal
import sys

import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder.classifier import SequenceClassifier, macro_f1
from flax_encoder.text_classifier import TextClassifier
from flax_encoder.tokenizer import Template
from train import examples, finetune, sources
from train.errors import RunError
from train.files import written_whole
from train.workdir import out_problem
from train.load import load_config, load_params, recorded_encoder_config

_CHUNK = 1024  # lines in memory at once


@dataclasses.dataclass(frozen=True)
class Predicted:
  """What a prediction run did: `count` lines predicted; of the `labelled` ones, `scores`
  (accuracy and macro-F1), or None where no line had a label."""

  count: int
  labelled: int = 0
  scores: dict | None = None


def scores(true: np.ndarray, predicted: np.ndarray, num_labels: int) -> dict:
  """Accuracy and macro-F1 (the mean F1 over the classes that occur in either), as the
  evaluation of a fine-tuning run computes them (train.classify.ClassifyTask)."""
  true_1hot, predicted_1hot = np.eye(num_labels)[true], np.eye(num_labels)[predicted]
  return {"accuracy": float(np.mean(true == predicted)),
          "macro_f1": macro_f1((true_1hot * predicted_1hot).sum(0), true_1hot.sum(0),
                               predicted_1hot.sum(0))}


class Predictor:
  """A fine-tuned run's classifier, tokenizer and classes, read from its workdir (the newest
  verified checkpoint's parameters) as a `flax_encoder.text_classifier.TextClassifier`."""

  def __init__(self, workdir: str, batch_size: int = 64):
    config = load_config(workdir)
    if config.task.get("name") != "classify":
      raise RunError(f"--workdir {workdir}: a {config.task.get('name', 'masked_lm')} run, "
                     f"expected a fine-tuning (classify) run")
    meta = examples.load_examples(os.path.join(workdir, "data"))["meta"]
    tokenizer = finetune.run_tokenizer(workdir, meta)
    self.fields = meta["fields"]

    # The pooling the run used (finetune.pooling), recorded since config.init.hf could say it.
    pooling_of = lambda record: record.get("pooling") or config.task.pooling or "mean"

    def init_for(record):
      model = SequenceClassifier(recorded_encoder_config(record), len(record["labels"]),
                                 pooling_of(record), finetune.type_separator(meta))
      return lambda: model.init(jax.random.PRNGKey(0), jnp.ones((1, 1), jnp.int32))["params"]

    params, record = load_params(workdir, init_for)
    template = meta.get("template")
    self.classifier = TextClassifier(recorded_encoder_config(record), params, record["labels"],
                                     tokenizer, meta["seq_len"], meta["separator_id"],
                                     pooling_of(record), batch_size,
                                     Template.from_dict(template) if template else None,
                                     finetune.type_separator(meta))
    self.labels = self.classifier.labels

  def probabilities(self, texts: list[str], pairs: list[str | None]) -> np.ndarray:
    """[len(texts), classes]: each example's class probabilities, in order."""
    return self.classifier.probabilities(texts, pairs)

  def text_classifier(self) -> TextClassifier:
    return self.classifier


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
    predictor = Predictor(workdir, batch_size)
  except FileNotFoundError as e:  # train.load: no checkpoint to read
    raise RunError(str(e)) from None
  source = sources.Source(input_path)
  text_field, pair_field = predictor.fields["text"], predictor.fields["pair"]
  label_field = predictor.fields["label"]
  classes = {label: i for i, label in enumerate(predictor.labels)}

  def lines():
    try:
      for number, record in source.records():
        text, pair = record.get(text_field), record.get(pair_field)
        if not isinstance(text, str) or (pair is not None and not isinstance(pair, str)):
          raise RunError(f"{input_path}:{number}: expected a string {text_field!r} field (and "
                         f"optionally {pair_field!r})")
        label = record.get(label_field)
        if label is not None and label not in classes:
          raise RunError(f"{input_path}:{number}: label {label!r}, expected one of the run's "
                         f"classes {predictor.labels[:10]}")
        yield text, pair, classes.get(label, -1)
    except sources.PrepareError as e:
      raise RunError(str(e)) from None
    except OSError as e:
      raise RunError(f"--input {input_path}: cannot read it ({e.strerror or e})") from None

  from tqdm import tqdm
  true, predicted = [], []
  stream = lines()
  try:  # an error, Ctrl-C or SIGTERM (main) leaves no half-written file behind
    with written_whole(out_path) as tmp, open(tmp, "w") as out, tqdm(
        desc="predict", unit="line", dynamic_ncols=True, disable=not show) as bar:
      while chunk := list(itertools.islice(stream, _CHUNK)):
        probabilities = predictor.probabilities([t for t, _, _ in chunk],
                                                [p for _, p, _ in chunk])
        for row in probabilities:
          out.write(json.dumps({"label": predictor.labels[int(np.argmax(row))],
                                "probabilities": {str(label): round(float(p), 6)
                                                  for label, p in zip(predictor.labels, row)}})
                    + "\n")
        true += [c for _, _, c in chunk]
        predicted += np.argmax(probabilities, -1).tolist()
        bar.update(len(chunk))
  except OSError as e:
    raise RunError(f"--out {out_path}: cannot write it ({e.strerror or e})") from None
  true, predicted = np.asarray(true, np.int64), np.asarray(predicted, np.int64)
  labelled = true >= 0
  if not labelled.any():
    return Predicted(len(true))
  return Predicted(len(true), int(labelled.sum()),
                   scores(true[labelled], predicted[labelled], len(predictor.labels)))


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
    scored = (f"; over the {done.labelled} labelled lines: accuracy "
              f"{done.scores['accuracy']:.3f}, macro-F1 {done.scores['macro_f1']:.3f}")
  print(f"{args.out}: {done.count} predictions{scored}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
