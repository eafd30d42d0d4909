"""What the supervised tasks (classify, regress, tag) share: the part of the step a model of
labelled examples has, a finished or running run read back for prediction and export, the
run as transformers' model of its task, and the texts of an input line.

Each of those tasks defines its `Predictor` (`train.task.Definition.predictor`): built from a
run read back (`FineTuned`), it reads the lines `python -m train.predict` is given, predicts a
chunk of them and scores the labelled ones as the run's evaluation does.
"""

from __future__ import annotations

import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder import families
from flax_encoder.tokenizer import Template
from train.data import dataset, examples
from train.errors import RunError
from train.run.load import load_config, load_params, recorded_encoder_config
from train.task import HFModel
from train.tasks import tokenizing


@dataclasses.dataclass(frozen=True)
class SupervisedTask:
  """The part of `train.task.Task` a model of labelled examples has: a batch holds 'tokens'
  [batch, seq] beside its labels (and 'segment_ids' [batch, seq] where its rows are packed:
  train.data.examples.pack), and nothing is drawn."""

  model: nn.Module

  def init(self, rng: jax.Array, seq_len: int):
    return self.model.init(rng, jnp.ones((1, seq_len), jnp.int32))["params"]

  def batch(self, rows: dict, key: jax.Array) -> dict:
    return rows  # nothing drawn: the examples are the batch

  def outputs(self, params, batch: dict, dropout_rng: jax.Array | None = None) -> jax.Array:
    """The model's outputs for the batch's tokens: with dropout where `dropout_rng` is
    given (training), without (evaluation)."""
    inputs = [batch["tokens"]] + ([batch["segment_ids"]] if "segment_ids" in batch else [])
    types = {"token_types": batch["token_types"]} if "token_types" in batch else {}
    if dropout_rng is None:
      return self.model.apply({"params": params}, *inputs, **types)
    return self.model.apply({"params": params}, *inputs, **types, deterministic=False,
                            rngs={"dropout": dropout_rng})

  @staticmethod
  def token_count(rows: dict) -> int:
    """Ids in a batch of examples, padding included; of packed rows, the examples' ids alone
    (padding left out): what tokens/s compares with a loop that pads less."""
    if "segment_ids" not in rows:
      return int(rows["tokens"].size)
    segments = rows["segment_ids"]
    if getattr(segments, "is_fully_addressable", True):
      # Read on the host: the batch is there already, the step running on it is not waited on.
      return int(np.count_nonzero(np.asarray(segments)))
    return int(jnp.count_nonzero(segments))  # rows of several processes: added up on device


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
  tokenizer: object  # train.data.tokens.Tokenizer, its ids numbered as the model's
  family: str | None = None  # the Hugging Face family it started from, as the run recorded

  @property
  def template(self) -> Template | None:
    """The special ids a Hugging Face tokenizer puts around the examples, or None."""
    template = self.meta.get("template")
    return Template.from_dict(template) if template else None


def read_run(workdir: str, predictor) -> FineTuned:
  """The fine-tuning run in `workdir`, its model rebuilt as its task's `predictor` (the
  Predictor class of train.task.Definition) says."""
  config = load_config(workdir)
  name = config.task.get("name", "masked_lm")
  # the format of its prepared data: examples.FORMAT's, unless its predictor says another
  meta = dataset.read_meta(os.path.join(workdir, "data"),
                           getattr(predictor, "data_format", examples.FORMAT))
  model_for = lambda record: predictor.model_for(recorded_encoder_config(record), record,
                                                 config, meta)

  def init_for(record):
    model = model_for(record)
    return lambda: model.init(jax.random.PRNGKey(0), jnp.ones((1, 1), jnp.int32))["params"]

  params, record = load_params(workdir, init_for)
  return FineTuned(name, model_for(record), params, record.get("labels"), meta,
                   tokenizing.run_tokenizer(workdir, meta), record.get("family"))


# The tasks whose predictors apply the run's model as it is read (classify's builds its own).
QUANTIZABLE = ("regress", "rerank", "tag")


def quantized_run(run: FineTuned, quantize: str | None) -> FineTuned:
  """`run` with its model's dense layers computed in `quantize` (int8: flax_encoder.quantized,
  weights per output channel, activations per token), its parameters in that form; `run`
  itself where None. RunError naming --quantize where it cannot be."""
  if quantize is None:
    return run
  if run.task not in QUANTIZABLE:
    raise RunError(f"--quantize {quantize}: a {run.task} run predicts in its float weights "
                   f"here, expected a run of {QUANTIZABLE}")
  from flax_encoder import quantized
  try:
    model = quantized.quantized(run.model, quantize)
    params = quantized.quantized_params(model, run.params, jnp.ones((1, 1), jnp.int32))
  except quantized.QuantizeError as e:
    raise RunError(f"--quantize {quantize}: {e}") from None
  return dataclasses.replace(run, model=model, params=params)


def run_of(run: FineTuned | str, predictor) -> FineTuned:
  """`run` (a workdir, or the run read), which must be a run of `predictor`'s task."""
  if isinstance(run, str):
    task = load_config(run).task.get("name", "masked_lm")
    if task != predictor.task:
      raise RunError(f"--workdir {run}: a {task} run, expected a {predictor.task} run")
    return read_run(run, predictor)
  if run.task != predictor.task:
    raise RunError(f"--workdir the run: a {run.task} run, expected a {predictor.task} run")
  return run


def hf_model(run: FineTuned, state) -> HFModel:
  """The fine-tuned `run` as transformers' model of its task: `state(run, family)` gives its
  state dict and config.json entries; the tokenizer is the run's where its ids are a Hugging
  Face tokenizer's own."""
  tokenizer = run.tokenizer
  own = tokenizer.spec.kind == "huggingface" and tokenizer.offset == 0
  return HFModel(run.model.config, run.family, lambda family: state(run, family),
                 tokenizer.spec.path if own else None)


def encoder_state(run: FineTuned, family) -> tuple[dict, dict]:
  """The state dict of the run's encoder inside the family's *For… models (and its
  prediction head, where the family's classifiers apply one), and the config.json entries
  that name the run's classes."""
  variables = {"params": run.params["encoder"]}
  if family.prediction_head:  # its classifiers', by the masked-LM head's names
    variables["heads"] = {"prediction_head": run.params["head"]}
  labels = [str(label) for label in run.labels or ["LABEL_0"]]
  return (families.to_hf_state_dict(variables, run.model.config, family.name,
                                    prefix=family.prefix),
          {"id2label": dict(enumerate(labels)),
           "label2id": {label: i for i, label in enumerate(labels)}})


def sequence_classifier(run: FineTuned, family, problem_type: str | None = None):
  """(state dict, config.json entries) of a run that pools a sequence as the family's
  *ForSequenceClassification; HFError where its pooling is not the family's."""
  family.classifier.check(run.model.pooling, family.stem)
  state, entries = encoder_state(run, family)
  for key, path in family.classifier.denses:
    dense = run.params
    for name in path:
      dense = dense[name]
    add_dense(state, key, dense)
  entries.update(architectures=[f"{family.stem}ForSequenceClassification"],
                 **family.classifier.config(run.model.pooling))
  if problem_type:
    entries["problem_type"] = problem_type
  return state, entries


def add_dense(state: dict, key: str, dense: dict) -> None:
  """A flax Dense's parameters into a state dict as torch.nn.Linear `key`'s."""
  state[key + ".weight"] = np.asarray(dense["kernel"]).T
  state[key + ".bias"] = np.asarray(dense["bias"])


def line_texts(record: dict, fields: dict, where: str) -> tuple[str, str | None]:
  """(text, pair or None) of an input line, under the run's text and pair fields."""
  text, pair = record.get(fields["text"]), record.get(fields["pair"])
  if not isinstance(text, str) or (pair is not None and not isinstance(pair, str)):
    raise RunError(f"{where}: expected a string {fields['text']!r} field (and optionally "
                   f"{fields['pair']!r})")
  return text, pair
