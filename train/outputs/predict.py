r"""A fine-tuned run's predictions for new examples.

  python -m train.predict --workdir runs/cls --input new.jsonl --out predictions.jsonl

The run is one of a task that predicts: classify, regress, tag or rerank. Each line of
--input is a JSON object as the run's training lines, its label optional: the text under the
run's text field ("text"; a "text_pair" too if the run was trained on pairs), for a tagging
run the words under its tokens field ("tokens"), for a reranker a query and a document under
its query and document fields ("query", "document"). Each line of --out is, in input order:

  classify  {"label": the most probable class, "probabilities": {class: p, ...}}
  regress   {"score": the predicted number}
  tag       {"tags": [a tag per word]}: null for a word the model did not see (cut off by
            the run's seq_len, or tokenized to nothing)
  rerank    {"score": the document's relevance to the query, as sentence-transformers'
            CrossEncoder.predict gives it (the sigmoid of the logit), "logit": the logit}

Where lines carry labels (the run's label or tags field), the command also reports over them
what the run's evaluation reports: accuracy and macro-F1; the mean squared error, Pearson's and
Spearman's correlation; the accuracy over the words, macro-F1 and, for BIO tags, entity F1.
For a reranker, whose label is 1 for a relevant document and 0 for another, it reports the
binary cross-entropy of the scores and their accuracy at 0.5.
Lines are read, predicted and written a chunk at a time (1024, fewer where they are long), and
of a text only the ids the run's seq_len can hold are tokenized, so any number of lines of
any length takes bounded memory; in a chunk, examples are padded to the smallest of a
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

import numpy as np

from flax_encoder.tokenizer import TokenizerFailure
from train import tasks
from train.cli import HelpFormatter
from train.data import examples, sources
from train.errors import RunError
from train.files import written_whole
from train.run.load import load_config
from train.run.workdir import out_problem
from train.tasks import supervised

_CHUNK = 1024  # lines in memory at once


def read_run(workdir: str) -> supervised.FineTuned:
  """The fine-tuning run in `workdir`; RunError for a run of a task that predicts nothing."""
  name = load_config(workdir).task.get("name", "masked_lm")
  predictor = tasks.definition(name).predictor
  if predictor is None:
    raise RunError(f"--workdir {workdir}: a {name} run, expected a fine-tuning run (one of "
                   f"{tuple(n for n, d in tasks.DEFINITIONS.items() if d.predictor)})")
  return supervised.read_run(workdir, predictor)


@dataclasses.dataclass(frozen=True)
class Predicted:
  """What a prediction run did: `count` lines predicted; of the `labelled` ones, `scores`
  (what the run's evaluation reports), or None where no line had a label."""

  count: int
  labelled: int = 0
  scores: dict | None = None


def predict(workdir: str, input_path: str, out_path: str, batch_size: int = 64,
            show: bool = False, quantize: str | None = None) -> Predicted:
  """Writes the predictions for `input_path` to `out_path`, with a progress bar if `show`;
  with the model's dense layers in int8 where `quantize` is "int8". `out_path` appears once
  every line is predicted, never half-written."""
  check_arguments(input_path, out_path, batch_size)
  if not os.path.isdir(workdir):
    raise RunError(f"--workdir {workdir}: no such directory")
  problem = out_problem(out_path, workdir)
  if problem:
    raise RunError(problem)
  try:
    run = read_run(workdir)
  except FileNotFoundError as e:  # train.run.load: no checkpoint to read
    raise RunError(str(e)) from None
  run = supervised.quantized_run(run, quantize)
  predictor = tasks.definition(run.task).predictor(run, batch_size)
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
  true, predicted = [], []
  # Chunks of bounded characters: a line of any length is held with few others.
  chunks = examples.chunked(lines(), _CHUNK, lambda line: line[0])
  try:  # an error, Ctrl-C or SIGTERM (main) leaves no half-written file behind
    with written_whole(out_path) as tmp, open(tmp, "w") as out, tqdm(
        desc="predict", unit="line", total=_total(source) if show else None,
        dynamic_ncols=True, disable=not show) as bar:
      for chunk in chunks:
        written, predictions = predictor.predict([example for example, _ in chunk])
        out.writelines(json.dumps(line) + "\n" for line in written)
        true += [label for _, label in chunk]
        predicted += list(predictions)
        bar.update(len(chunk))
  except OSError as e:
    raise RunError(f"--out {out_path}: cannot write it ({e.strerror or e})") from None
  except TokenizerFailure as e:
    raise RunError(f"--input {input_path}: the run's tokenizer: {e}") from None
  labelled = sum(not _unlabelled(t) for t in true)
  return Predicted(len(true), labelled, predictor.scores(true, predicted) if labelled else None)


def _total(source: sources.Source) -> int | None:
  """The lines of the input, for the bar's total and time left; None where they cannot be
  counted (a file that does not read: the prediction says why)."""
  try:
    return source.count()
  except Exception:  # noqa: BLE001 - a file that does not read: the reading after says why
    return None




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
                                   formatter_class=HelpFormatter)
  parser.add_argument("--workdir", required=True, help="a fine-tuning run")
  parser.add_argument("--input", required=True, help="JSON lines with the texts")
  parser.add_argument("--out", required=True, help="JSON lines of predictions, in order")
  parser.add_argument("--batch-size", type=int, default=64, help="examples a call predicts")
  parser.add_argument("--quantize", choices=("int8",),
                      help="compute the dense layers in int8 (flax_encoder.quantized: weights "
                           "per output channel, activations per token; needs the int8 extra)")
  args = parser.parse_args(argv)
  # SIGTERM as Ctrl-C: predict's cleanup runs (the default action would skip it).
  previous = signal.signal(signal.SIGTERM, _interrupt)
  try:
    done = predict(args.workdir, args.input, args.out, args.batch_size, show=True,
                   quantize=args.quantize)
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
  print(f"{args.out}: {done.count} predictions{scored}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
