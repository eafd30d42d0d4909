r"""Fine-tuning for a tag per word (named entities, parts of speech: token classification).

  python -m train --config=configs/tag.py --workdir runs/ner \
      --config.data.train=train.jsonl --config.data.eval=eval.jsonl [--config.init.hf=bert-dir]

Each line holds a text's words and their tags, lists of one length: {"tokens": ["John",
"lives", "in", "Paris"], "tags": ["B-PER", "O", "O", "B-LOC"]}. Each word is tokenized on
its own (`flax_encoder.tokenizer.encode_words`), the Hugging Face template's special ids
around them; the word's tag is learnt at its first id and the other ids are left out of the
loss, as transformers' token-classification fine-tuning does. The model is the encoder,
dropout and a dense layer per token (`flax_encoder.token_classifier.TokenClassifier`; from a
ModernBERT directory its prediction head first, as transformers' token classifier has it);
cross-entropy over the tagged ids. Evaluation reports the accuracy over the tagged words, the
macro-F1 over the tags, the accuracy of always answering the commonest training tag and,
where the tags are BIO (O, B-X, I-X), the F1 over entities (`entity_counts`).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from flax_encoder import families
from flax_encoder.classifier import macro_f1
from flax_encoder.inference import default_buckets, padded_batches
from flax_encoder.token_classifier import TokenClassifier
from flax_encoder.tokenizer import encode_words
from train.data import examples
from train.errors import RunError
from train.run.optim import smoothed_loss_sum
from train.task import Definition, Field, Plots, Resume, Setup, string
from train.tasks import finetune
from train.tasks.start import start_params
from train.tasks.supervised import (FineTuned, SupervisedTask, add_dense, encoder_state, hf_model,
                                    read_run, run_of)
from train.tasks.tokenizing import run_tokenizer


@dataclasses.dataclass(frozen=True)
class BIO:
  """Which tags begin an entity (B-X) and which entity type each tag is of (-1 for O): the
  tags of a BIO scheme, in their order. Tuples: the task holding it stays hashable."""

  begins: tuple[bool, ...]
  types: tuple[int, ...]

  @classmethod
  def of(cls, tags: list) -> BIO | None:
    """The scheme of `tags` where each one is "O", "B-X" or "I-X" and one at least is a "B-";
    None for tags of any other kind (no entities to count)."""
    parts = [t.split("-", 1) if isinstance(t, str) else [t] for t in tags]
    if not all(p == ["O"] or (len(p) == 2 and p[0] in ("B", "I") and p[1]) for p in parts):
      return None
    if not any(p[0] == "B" for p in parts):
      return None
    names = sorted({p[1] for p in parts if len(p) == 2})
    return cls(tuple(p[0] == "B" for p in parts),
               tuple(names.index(p[1]) if len(p) == 2 else -1 for p in parts))


def entity_counts(scheme: BIO, true, predicted, tagged) -> tuple:
  """(entities in `true`, entities in `predicted`, predicted entities that are true ones) over
  each row's `tagged` positions taken in order (the ids between them skipped): int tag
  indices [rows, positions], bool `tagged` alike. An entity is a B-X and the I-X that follow it
  (strictly: an I-X that follows no B-X or I-X of its type begins nothing, as seqeval's strict
  IOB2 mode); a predicted one is right where a true one has its type, start and end."""
  # The tagged positions first, in their order: the words one after the other.
  order = jnp.argsort(~jnp.asarray(tagged), axis=-1, stable=True)
  words = jnp.take_along_axis(jnp.asarray(tagged), order, -1)
  outside = len(scheme.begins)  # past the words: begins nothing, of no type
  begins = jnp.asarray(scheme.begins + (False,))
  types = jnp.asarray(scheme.types + (-1,))
  position = jnp.arange(words.shape[-1])

  def spans(tags):
    """Where each entity begins, where each word's entity began, its type, where it ends."""
    tags = jnp.where(words, jnp.take_along_axis(jnp.asarray(tags), order, -1), outside)
    begin, kind = begins[tags], types[tags]
    before = jnp.pad(kind[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    goes_on = ~begin & (kind >= 0) & (kind == before)  # an I-X after a tag of type X
    start = jax.lax.cummax(jnp.where(goes_on, 0, position), axis=1)
    inside = jnp.take_along_axis(begin, start, -1)
    ends = inside & ~jnp.pad(goes_on[:, 1:], ((0, 0), (0, 1)))
    return begin, start, kind, ends

  true_begin, true_start, true_kind, true_end = spans(true)
  begin, start, kind, end = spans(predicted)
  right = true_end & end & (true_start == start) & (true_kind == kind)
  return jnp.sum(true_begin), jnp.sum(begin), jnp.sum(right)


@dataclasses.dataclass(frozen=True)
class TagTask(SupervisedTask):
  """Tagging as `train.run.step` runs it (see `train.run.step.Task`). A batch holds 'tokens'
  [batch, seq] and 'labels' [batch, seq]: a word's tag at its first id, -1 at every other
  position (special ids, a word's other ids, padding, the rows that pad the last held-out
  batch)."""

  model: TokenClassifier
  label_smoothing: float
  baseline_tag: int  # the training data's commonest tag
  scheme: BIO | None  # where the tags are BIO: entities are counted

  def loss_count(self, batch: dict) -> jax.Array:
    return jnp.sum(batch["labels"] >= 0)

  def loss_sum(self, params, batch: dict, dropout_rng: jax.Array) -> jax.Array:
    return smoothed_loss_sum(self.outputs(params, batch, dropout_rng), batch["labels"],
                             batch["labels"] >= 0, self.label_smoothing)

  def eval_sums(self, params, batch: dict) -> dict:
    logits = self.outputs(params, batch)
    labels = batch["labels"]
    tagged = labels >= 0
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
    return {**tag_sums(labels, jnp.argmax(logits, -1), tagged, self.model.num_labels,
                       self.scheme),
            "ce": jnp.sum(ce * tagged),
            "baseline_correct": jnp.sum((labels == self.baseline_tag) & tagged)}

  @staticmethod
  def eval_metrics(sums: dict) -> dict:
    """Summed eval_sums -> `tag_metrics`, the loss (per tagged word) and the accuracy of
    always answering the commonest training tag."""
    count = max(float(sums["count"]), 1.0)
    return {"loss": float(sums["ce"]) / count, **tag_metrics(sums),
            "baseline_accuracy": float(sums["baseline_correct"]) / count}


def tag_sums(true, predicted, tagged, num_tags: int, scheme: BIO | None) -> dict:
  """What the scores of tags count, over the `tagged` positions of rows of `true` and
  `predicted` tag indices ([rows, positions] each; numpy or jax arrays): the right ones, all,
  each tag's right ones, labels and predictions, and where `scheme` is given the entities."""
  true_1hot = jax.nn.one_hot(true, num_tags) * tagged[..., None]
  predicted_1hot = jax.nn.one_hot(predicted, num_tags) * tagged[..., None]
  sums = {"correct": jnp.sum((predicted == true) & tagged), "count": jnp.sum(tagged),
          "true_positives": jnp.sum(true_1hot * predicted_1hot, (0, 1)),
          "true": jnp.sum(true_1hot, (0, 1)), "predicted": jnp.sum(predicted_1hot, (0, 1))}
  if scheme is not None:
    counted = entity_counts(scheme, true, predicted, tagged)
    sums.update(zip(("true_entities", "predicted_entities", "right_entities"), counted))
  return sums


def tag_metrics(sums: dict) -> dict:
  """`tag_sums` (added up) -> the accuracy over the tagged words, macro-F1 over the tags that
  occur in the labels or the predictions, and where entities were counted the F1 over them
  (micro-averaged, as seqeval's)."""
  count = max(float(sums["count"]), 1.0)
  metrics = {"accuracy": float(sums["correct"]) / count,
             "macro_f1": macro_f1(sums["true_positives"], sums["true"], sums["predicted"])}
  if "true_entities" in sums:
    metrics["entity_f1"] = entity_f1(sums["true_entities"], sums["predicted_entities"],
                                     sums["right_entities"])
  return metrics


def entity_f1(true, predicted, right) -> float:
  """F1 over entities from their counts (`entity_counts`); 0 where there are none."""
  total = float(true) + float(predicted)
  return 2 * float(right) / total if total else 0.0


class Tagger:
  """A fine-tuned tagger (`run`: a tag run's workdir, or the run read): words in, a tag per
  word out, laid out as the run's examples were (`encode_words`)."""

  task = "tag"

  def __init__(self, run: FineTuned | str, batch_size: int = 64):
    run = run_of(run, Tagger)
    self.run, self.batch_size, self.fields = run, batch_size, run.meta["fields"]
    self.labels, self.scheme = run.labels, BIO.of(run.labels)
    self.tags_of = {t: i for i, t in enumerate(self.labels)}
    self.params = jax.device_put(run.params)
    self.buckets = default_buckets(run.model.config, run.meta["seq_len"])
    self._tags = jax.jit(
        lambda params, ids: jnp.argmax(run.model.apply({"params": params}, ids), -1))

  @staticmethod
  def model_for(cfg, record: dict, config, meta: dict) -> TokenClassifier:
    """The model of a run whose checkpoint records `record`: with the prediction head where
    the run recorded one (from a ModernBERT directory)."""
    return TokenClassifier(cfg, len(record["labels"]), head=record.get("head", False))

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
    unknown = [t for t in tags if not examples.known(t, self.tags_of)]
    if unknown:
      raise RunError(f"{where}: tag {unknown[0]!r}, expected one of the run's tags "
                     f"{self.labels[:10]}")
    return words, [self.tags_of[t] for t in tags]

  def predict(self, chunk: list) -> tuple[list[dict], list]:
    indices = self.tag_indices(chunk)
    return [{"tags": [None if i < 0 else self.labels[i] for i in row.tolist()]}
            for row in indices], indices

  def scores(self, true: list, predicted: list) -> dict | None:
    """Over the words the model saw of the tagged lines: `tag_metrics`."""
    pairs = [(t, p) for t, p in zip(true, predicted) if t is not None]
    if not pairs:
      return None
    width = max([len(t) for t, _ in pairs] + [1])
    rows = np.full((2, len(pairs), width), -1, np.int64)
    for i, (t, p) in enumerate(pairs):
      rows[0, i, :len(t)], rows[1, i, :len(p)] = t, p
    tagged = (rows[0] >= 0) & (rows[1] >= 0)
    sums = tag_sums(np.maximum(rows[0], 0), np.maximum(rows[1], 0), tagged, len(self.labels),
                    self.scheme)
    return tag_metrics(jax.device_get(sums))


def token_classifier(run: FineTuned, family) -> tuple[dict, dict]:
  """(state dict, config.json entries) of a tagging run as the family's
  *ForTokenClassification; HFError where the family's applies a prediction head the run has
  not (a run from scratch)."""
  if family.tags_through_head and not run.model.head:
    raise families.HFError(
        f"the run tags without {family.title}'s prediction head (only a run from a "
        f"{family.title} directory has one); transformers' "
        f"{family.stem}ForTokenClassification applies it")
  state, entries = encoder_state(run, family)
  add_dense(state, "classifier", run.params["classifier"])  # no pooler: BERT's has none
  entries["architectures"] = [f"{family.stem}ForTokenClassification"]
  return state, entries


# ---------------------------------------------------------------------------------------------
# What the loop needs, and what the program knows of the task.


def setup(config, workdir: str, resume: Resume) -> Setup:
  """Tagging on config.data.train and config.data.eval, from config.init."""
  paths = {"train": config.data.train, "eval": config.data.eval}
  fields = {"tokens": config.data.tokens_field, "tags": config.data.tags_field}

  def build(directory, tokenizer, tokenizer_file, pad_id, template):
    return examples.prepare_tagged(paths, directory, tokenizer, tokenizer_file,
                                   config.train.seq_len, fields, pad_id, template)

  prepared = finetune.prepare(config, workdir, resume, paths, lambda record: [_text(
      record.get(fields["tokens"]))], build, {"fields": fields, "label_kind": "tag"})
  cfg, meta, loaded = prepared.encoder, prepared.meta, prepared.loaded
  tags, scheme = meta["labels"], BIO.of(meta["labels"])
  # From a ModernBERT checkpoint, its prediction head before the classifier (transformers').
  start = prepared.start
  model = TokenClassifier(cfg, len(tags), head=bool(
      start.family and families.get(start.family).tags_through_head), check_traced_ids=False)
  task = TagTask(model, config.optim.label_smoothing,
                 int(np.argmax(_tag_counts(loaded["train"]["labels"], len(tags)))), scheme)
  untagged = {s: n for s, n in meta["untagged"].items() if n}
  finetune.say_prepared(
      prepared, f"{len(tags)} tags ({'BIO: entities counted' if scheme else 'not BIO'})",
      config.train.seq_len, "; words left untagged (cut off, or no ids): " + ", ".join(
          f"{n} {s}" for s, n in untagged.items()) if untagged else "")
  return Setup(task=task, encoder=cfg, train=loaded["train"], eval=loaded["eval"],
               eval_fill={"tokens": prepared.pad_id, "labels": -1},
               record={"encoder": cfg.record(), "dataset": loaded["identity"],
                       "source": os.path.join(workdir, "data"), "labels": tags,
                       "start": start.source, "head": model.head, "family": start.family},
               start_params=start_params(start, cfg, config, len(tags),
                                                  head=model.head))


def _text(words) -> str | None:
  """A line's words as the running text a vocabulary is trained on."""
  if isinstance(words, list):
    return " ".join(w for w in words if isinstance(w, str))
  return None


def _tag_counts(labels: np.ndarray, num_tags: int, rows: int = 4096) -> np.ndarray:
  """How often each tag is the label of a word, read a block of rows at a time."""
  counts = np.zeros(num_tags, np.int64)
  for start in range(0, len(labels), rows):
    block = np.asarray(labels[start:start + rows])
    counts += np.bincount(block[block >= 0], minlength=num_tags)
  return counts


def summary(metrics: dict) -> str:
  entities = (f", entity F1 {metrics['entity_f1']:.3f}" if "entity_f1" in metrics else "")
  return (f"eval word accuracy {metrics['accuracy']:.3f}, macro-F1 {metrics['macro_f1']:.3f}"
          f"{entities} (majority tag {metrics['baseline_accuracy']:.3f}), eval loss "
          f"{metrics['loss']:.3f}")


DEFINITION = Definition(
    name=Tagger.task,
    fields={**finetune.FIELDS, "data.tokens_field": Field(string),
            "data.tags_field": Field(string)},
    setup=setup,
    plots=Plots(loss_title="Tagging loss", loss_unit="nats / tagged word", train_loss="train",
                metrics={"accuracy": "word accuracy", "macro_f1": "macro-F1",
                         "entity_f1": "entity F1"},
                baseline=("baseline_accuracy", "baseline: majority tag"),
                accuracy_title="Held-out word accuracy and F1"),
    summary=summary,
    predictor=Tagger,
    hf_model=lambda workdir, config: hf_model(read_run(workdir, Tagger), token_classifier),
    check=finetune.check,
    tokenizer=lambda config, workdir: run_tokenizer(workdir),
)
