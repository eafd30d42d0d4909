r"""Fine-tuning a reranker (a cross-encoder: a query and a document in, one relevance score out).

  python -m train --config=configs/rerank.py --workdir runs/rerank \
      --config.data.train=train.jsonl --config.data.eval=eval.jsonl \
      --config.init.hf=ms-marco-MiniLM-L6-v2   # a reranker, or any encoder to make one of

A training line is {"query": str, "positive": str, "negative": str or [str, …]} (negatives
optional). Each query is trained against a group of 1 + config.task.negatives documents: its
positive, its line's hard negatives, then positives of other lines drawn at random (sampled
in-batch negatives, as sentence-transformers' CrossEncoder losses draw them), fixed when the
data is prepared. Each (query, document) pair is one example of the *ForSequenceClassification
model with one output ([CLS] query [SEP] document [SEP], the longer text cut first), its logit
the score. config.task.loss: "listwise", the cross-entropy of the positive among its group's
scores (sentence-transformers' CrossEntropyLoss); "bce", each pair's binary cross-entropy
against its label, 1 for the positive and 0 for the negatives, averaged over the group
(BinaryCrossEntropyLoss).

Evaluation reranks each held-out query's candidates: a line {"query", "positive": str or
[str, …], "documents": [str, …]} lists the first stage's candidates in its order (the first
config.data.eval_candidates of them; positives it missed stay missed, so the figures are those
of the whole pipeline); a line with "negative" instead reranks its positives and negatives
shuffled (a random first stage). It reports MRR@10 and nDCG@10 of the reranked order beside
those of the first stage's, and the loss over the candidates.

`python -m train.predict` scores {"query", "document"} lines (the score as
sentence-transformers' CrossEncoder.predict gives it: the sigmoid of the logit, and the
logit); `python -m train.export --layout hf` writes a *ForSequenceClassification directory
that `CrossEncoder` loads with the run's scores.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder.classifier import SequenceClassifier, second_text_types
from flax_encoder.tokenizer import laid_out
from train.data import dataset, examples, sources
from train.errors import RunError
from train.files import sha256_bytes
from train.task import FREE, Definition, Field, Plots, Resume, Setup, choice, integer, string
from train.tasks import contrastive, finetune
from train.tasks.regress import Regressor
from train.tasks.start import Start, pooling, start_params
from train.tasks.supervised import (SupervisedTask, hf_model, line_texts, read_run,
                                    sequence_classifier)
from train.tasks.tokenizing import run_tokenizer, type_separator

FORMAT = "flax-encoder rerank 2"
LOSSES = ("listwise", "bce", "margin_mse")
TOP = 10  # the cut-off of MRR and nDCG


# ---------------------------------------------------------------------------------------------
# The losses and metrics. Shapes: q = queries of a batch, g = documents of a group (or
# candidates of a held-out query), s = ids of a pair.


@dataclasses.dataclass(frozen=True)
class RerankTask(SupervisedTask):
  """Reranking as `train.run.step` runs it (see `train.run.step.Task`). A training batch holds
  'tokens' [q, g, s] (each query's group, its positive first) and 'labels' float32 [q, g]; a
  held-out batch 'tokens' [q, g, s], 'relevant' and 'present' uint8 [q, g] (which candidates
  are positives, and which are there at all: none in the rows that pad the last batch) and
  'positives' int32 [q] (the query's positives, found or not: nDCG's ideal)."""

  model: SequenceClassifier  # one output
  loss: str  # one of LOSSES

  def init(self, rng: jax.Array, seq_len: int):
    return self.model.init(rng, jnp.ones((1, seq_len), jnp.int32))["params"]

  def scores(self, params, batch: dict, dropout_rng: jax.Array | None = None):
    """The batch's [q, g, s] pairs -> float32 [q, g] logits; each pair's token types (where the
    model has them) 1 from where its document begins ('seconds' [q, g]), as the tokenizer
    gives them, whatever special tokens the query spells."""
    tokens = batch["tokens"]
    queries, group, length = tokens.shape
    rows = {"tokens": tokens.reshape(queries * group, length)}
    if self.model.type_separator is not None:
      rows["token_types"] = second_text_types(batch["seconds"].reshape(-1), length)
    logits = self.outputs(params, rows, dropout_rng)
    return logits[:, 0].reshape(queries, group)

  def loss_count(self, batch: dict) -> jax.Array:
    if "present" in batch:
      return jnp.sum(jnp.any(batch["present"] > 0, axis=1))
    return jnp.asarray(batch["tokens"].shape[0])

  def loss_sum(self, params, batch: dict, dropout_rng: jax.Array) -> jax.Array:
    logits = self.scores(params, batch, dropout_rng)
    if self.loss == "margin_mse":
      return jnp.sum(margin_mse(logits, batch["teacher"]))
    return jnp.sum(self._losses(logits, batch["labels"], jnp.ones_like(logits, bool)))

  def _losses(self, logits, labels, present) -> jax.Array:
    """Each query's loss [q] over its `present` documents: listwise (and, held out, for a
    margin_mse run, which has no teacher there), the cross-entropy of its positives among them
    (-log of their summed probability); bce, the mean binary cross-entropy of each against its
    label."""
    if self.loss in ("listwise", "margin_mse"):
      everything = jax.nn.logsumexp(jnp.where(present, logits, -jnp.inf), axis=1)
      relevant = jax.nn.logsumexp(jnp.where(present & (labels > 0), logits, -jnp.inf), axis=1)
      return jnp.where(jnp.isfinite(relevant), everything - relevant, 0.0)
    # log(1 + e^x) - y x: the binary cross-entropy of sigmoid(x) against y, without overflow
    each = jax.nn.softplus(logits) - labels * logits
    return jnp.sum(jnp.where(present, each, 0.0), 1) / jnp.maximum(jnp.sum(present, 1), 1)

  def eval_sums(self, params, batch: dict) -> dict:
    present, relevant = batch["present"] > 0, batch["relevant"] > 0
    logits = self.scores(params, batch)
    reranked = ranking_sums(_ranks(logits, present), relevant, batch["positives"])
    first_stage = ranking_sums(_ranks(-jnp.arange(present.shape[1], dtype=jnp.float32)
                                      [None, :].repeat(present.shape[0], 0), present),
                               relevant, batch["positives"])
    queries = jnp.any(present, axis=1)
    losses = self._losses(logits, relevant.astype(jnp.float32), present)
    return {"queries": jnp.sum(queries), "loss": jnp.sum(jnp.where(queries, losses, 0.0)),
            **reranked, **{f"first_stage_{k}": v for k, v in first_stage.items()}}

  def eval_metrics(self, sums: dict) -> dict:
    n = max(float(sums["queries"]), 1.0)
    return {name: float(value) / n for name, value in sums.items() if name != "queries"}


def margin_mse(logits: jax.Array, teacher: jax.Array) -> jax.Array:
  """Each query's [q] mean squared error of the student's margins, its positive's logit (the
  first of [q, g] `logits`) less each negative's, against the teacher's (`teacher` [q, g]:
  its scores, NaN for the group's drawn negatives, which it did not score): sentence-
  transformers' CrossEncoder MarginMSELoss over each line's own negatives."""
  scored = jnp.isfinite(teacher[:, 1:])
  student = logits[:, :1] - logits[:, 1:]
  target = jnp.where(scored, teacher[:, :1] - teacher[:, 1:], 0.0)
  squares = jnp.where(scored, (student - target) ** 2, 0.0)
  return jnp.sum(squares, 1) / jnp.maximum(jnp.sum(scored, 1), 1)


def _ranks(scores: jax.Array, present: jax.Array) -> jax.Array:
  """int32 [q, g]: each present candidate's place (1 for the highest score) among its query's
  present candidates, ties to the earlier one; past every present one where absent."""
  q, g = scores.shape
  earlier = jnp.arange(g)[None, :] < jnp.arange(g)[:, None]  # [j, k]: k before j
  ahead = (scores[:, None, :] > scores[:, :, None]) | (
      (scores[:, None, :] == scores[:, :, None]) & earlier[None])  # [q, j, k]: k ranks before j
  ranks = 1 + jnp.sum(ahead & present[:, None, :], axis=2)
  return jnp.where(present, ranks, g + 1)


def ranking_sums(ranks: jax.Array, relevant: jax.Array, positives: jax.Array) -> dict:
  """Summed over the queries: MRR@10 (the reciprocal rank of the first positive in the top
  10, else 0) and nDCG@10 (binary relevance; the ideal puts all the query's `positives` first,
  those the candidates missed included)."""
  hit = relevant & (ranks <= TOP)
  reciprocal = jnp.max(jnp.where(hit, 1.0 / ranks, 0.0), axis=1)
  dcg = jnp.sum(jnp.where(hit, 1.0 / jnp.log2(ranks + 1.0), 0.0), axis=1)
  ideal = jnp.sum(jnp.where(jnp.arange(TOP)[None, :] < positives[:, None],
                            1.0 / jnp.log2(jnp.arange(TOP) + 2.0)[None, :], 0.0), axis=1)
  return {"mrr_at_10": jnp.sum(reciprocal),
          "ndcg_at_10": jnp.sum(jnp.where(ideal > 0, dcg / jnp.maximum(ideal, 1e-9), 0.0))}


# ---------------------------------------------------------------------------------------------
# The groups, prepared once into WORKDIR/data.
#
#   train.tokens.bin     the pairs' ids [n, 1 + negatives, seq_len], padded; the positive's first
#   train.labels.bin     float32 [n, 1 + negatives]: 1 for the positive, 0 for the negatives
#   train.teacher.bin    float32 [n, 1 + negatives] (config.task.loss margin_mse): the teacher's
#                        scores of the group's documents, NaN for those drawn from other lines
#   train.seconds.bin    int32 [n, 1 + negatives]: where each pair's document begins (its ids,
#                        then the template's end, are of token type 1 where the model has types)
#   eval.tokens.bin      the candidates' pairs [m, eval_candidates, seq_len]
#   eval.seconds.bin     int32 [m, eval_candidates]: as train's
#   eval.relevant.bin    uint8 [m, eval_candidates]: the positives among them
#   eval.present.bin     uint8 [m, eval_candidates]: the candidates a line has
#   eval.positives.bin   int32 [m]: the line's positives, found by the first stage or not
#   dataset.json         what examples.write_splits records, format FORMAT


def _texts(record: dict, field: str, where: str, required: bool) -> list[str]:
  """A field of one text or a list of them, as a list (empty where absent and not required)."""
  value = record.get(field)
  if value is None and not required:
    return []
  values = [value] if isinstance(value, str) else value
  if not isinstance(values, list) or not values or not all(
      isinstance(v, str) and v.strip() for v in values):
    got = "no such field" if field not in record else f"got {value!r}"[:60]
    raise RunError(f"{where}: {field!r}: {got}, expected a non-empty string or a list of them")
  return values


def _lines(source: sources.Source, fields: dict, split: str, scored: bool = False
           ) -> Iterator[tuple]:
  """(line number, query, positives, negatives, documents, the teacher's scores or None) of
  each line, checked: with `scored`, a training line's "scores" (fields['scores']), the
  teacher's of its positive then each of its negatives."""
  for number, record in examples.records(source):
    where = f"{source.path}:{number}"
    query = _texts(record, fields["query"], where, True)
    if len(query) != 1:
      raise RunError(f"{where}: {fields['query']!r}: a list, expected one string")
    positives = _texts(record, fields["positive"], where, True)
    negatives = _texts(record, fields["negative"], where, False)
    documents = _texts(record, fields["documents"], where, False) if split == "eval" else []
    scores = None
    if scored and split == "train":
      scores = record.get(fields["scores"])
      finite = lambda x: (isinstance(x, (int, float)) and not isinstance(x, bool)
                          and math.isfinite(x))
      if not negatives or not (isinstance(scores, list) and len(scores) == 1 + len(negatives)
                               and all(finite(x) for x in scores)):
        got = f"{fields['scores']!r}: {scores!r}"[:80] if fields["scores"] in record else (
            f"no {fields['scores']!r}")
        raise RunError(f"{where}: {got}, expected the teacher's scores of the positive and each "
                       f"of the {len(negatives)} negatives (config.task.loss='margin_mse', "
                       f"which needs a negative or more)")
    yield number, query[0], positives, negatives, documents, scores


def prepare_groups(paths: dict, directory: str, tokenizer, tokenizer_file, seq_len: int,
                   fields: dict, pad_id: int, separator_id: int, template, negatives: int,
                   candidates: int, seed: int, scored: bool = False) -> dict:
  """Writes the groups of `paths` {'train': …, 'eval': …} into `directory` (the layout above),
  each pair laid out as the starting tokenizer lays out a pair (`template`, else
  `separator_id` between) and cut to `seq_len` ids, with the teacher's scores of the training
  groups where `scored`; returns its dataset.json."""
  laid = (*template.start, *template.between, *template.end) if template else (separator_id,)
  examples.check_ids(tokenizer, pad_id, laid)
  dtype = examples.ids_dtype(tokenizer)
  rng = np.random.default_rng(seed)
  width = {"train": 1 + negatives, "eval": candidates}
  splits = iter(paths)

  def encode(source, counts):
    split = next(splits)
    lines = list(_lines(source, fields, split, scored))
    groups, labels, positives, teacher = [], [], [], []
    if split == "train":
      everyone = [line[2][0] for line in lines]
      for i, (_, _, pos, negs, _, scores) in enumerate(lines):
        docs = [pos[0], *negs[:negatives]]
        if scores is not None:  # the drawn negatives' NaN: the teacher did not score them
          teacher.append(np.concatenate([scores[:len(docs)], np.full(width[split] - len(docs),
                                                                    np.nan)]))
        others = len(lines) - 1
        drawn = rng.choice(max(others, 1), size=width[split] - len(docs),
                           replace=others < width[split] - len(docs)) if others else []
        docs += [everyone[j + (j >= i)] for j in drawn]
        groups.append(docs)
        labels.append([1.0] + [0.0] * (len(docs) - 1))
    else:
      for _, _, pos, negs, docs, _ in lines:
        if not docs:  # a random first stage: the positives among the negatives, shuffled
          docs = [*pos, *negs]
          docs = [docs[j] for j in rng.permutation(len(docs))]
        docs = docs[:candidates]
        groups.append(docs)
        labels.append([1.0 if d in pos else 0.0 for d in docs])
        positives.append(len(set(pos)))
    for start in range(0, len(lines), examples.CHUNK):
      chunk = range(start, min(start + examples.CHUNK, len(lines)))
      tokens = np.full((len(chunk), width[split], seq_len), pad_id, dtype)
      seconds = np.full((len(chunk), width[split]), seq_len, np.int32)
      present = np.zeros((len(chunk), width[split]), np.uint8)
      queries = tokenizer.encode_leading([lines[i][1] for i in chunk], seq_len + 1)
      for row, (i, query) in enumerate(zip(chunk, queries)):
        counts.tokenized(lines[i][0], lines[i][1], query, tokenizer.unk_id)
        docs = groups[i]
        for j, ids in enumerate(tokenizer.encode_leading(docs, seq_len + 1)):
          pair, truncated, seconds[row, j] = laid_out(query, ids, seq_len, separator_id,
                                                      template)
          tokens[row, j, :len(pair)] = pair
          present[row, j] = 1
          counts.truncated += truncated
          counts.tokenized(lines[i][0], docs[j], ids, tokenizer.unk_id)
      arrays = {"tokens": tokens, "seconds": seconds}
      label_rows = np.zeros((len(chunk), width[split]), np.float32)
      for row, i in enumerate(chunk):
        label_rows[row, :len(labels[i])] = labels[i]
      if split == "train":
        arrays["labels"] = label_rows
        if scored:
          arrays["teacher"] = np.asarray([teacher[i] for i in chunk], np.float32)
      else:
        arrays.update(relevant=(label_rows > 0).astype(np.uint8), present=present,
                      positives=np.asarray([positives[i] for i in chunk], np.int32))
      counts.examples += len(chunk)
      yield arrays

  return examples.write_splits(paths, directory, tokenizer, tokenizer_file, encode,
                               "a query and its positive", {
                                   "format": FORMAT, "label_kind": "rerank", "pad_id": pad_id,
                                   "seq_len": seq_len, "fields": fields, "width": width,
                                   "separator_id": separator_id, "negatives": negatives,
                                   "eval_candidates": candidates, "seed": seed,
                                   "teacher": scored,
                                   "template": template.to_dict() if template else None,
                                   "dtype": np.dtype(dtype).name})


def load_groups(directory: str) -> dict:
  """{'train': rows, 'eval': rows} memory-mapped (the layout above), 'meta' (dataset.json)
  and 'identity' (its SHA-256)."""
  with open(os.path.join(directory, "dataset.json"), "rb") as f:
    raw = f.read()
  meta = dataset.read_meta(directory, FORMAT)
  dtype, seq_len = np.dtype(meta["dtype"]), meta["seq_len"]
  loaded = {"meta": meta, "identity": sha256_bytes(raw)}
  for split, n in meta["examples"].items():
    g = meta["width"][split]
    read = lambda name, kind, shape: np.memmap(os.path.join(directory, f"{split}.{name}.bin"),
                                               kind, "r", shape=shape)
    rows = {"tokens": read("tokens", dtype, (n, g, seq_len)),
            "seconds": read("seconds", np.int32, (n, g))}
    if split == "train":
      rows["labels"] = read("labels", np.float32, (n, g))
      if meta.get("teacher"):
        rows["teacher"] = read("teacher", np.float32, (n, g))
    else:
      rows.update(relevant=read("relevant", np.uint8, (n, g)),
                  present=read("present", np.uint8, (n, g)),
                  positives=read("positives", np.int32, (n,)))
    loaded[split] = rows
  return loaded


# ---------------------------------------------------------------------------------------------
# What the loop needs, and what the program knows of the task.


def _fields(config) -> dict:
  return {"query": config.data.query_field, "positive": config.data.positive_field,
          "negative": config.data.negative_field, "documents": config.data.documents_field,
          "scores": config.data.scores_field,
          # a predicted line's, as train.predict reads it (RerankPredictor.read)
          "text": config.data.query_field, "pair": config.data.document_field,
          "label": config.data.label_field}


def setup(config, workdir: str, resume: Resume) -> Setup:
  """Reranker fine-tuning on config.data.train, reranking config.data.eval."""
  paths = {"train": config.data.train, "eval": config.data.eval}
  fields, task = _fields(config), config.task

  def build(directory, tokenizer, tokenizer_file, pad_id, template):
    return prepare_groups(paths, directory, tokenizer, tokenizer_file, config.train.seq_len,
                          fields, pad_id, config.data.separator_id, template, task.negatives,
                          config.data.eval_candidates, config.train.seed,
                          task.loss == "margin_mse")

  prepared = finetune.prepare(
      config, workdir, resume, paths,
      lambda record: [v for f in ("query", "positive", "negative") for v in
                      _as_list(record.get(fields[f]))],
      build, {"format": FORMAT, "fields": fields, "negatives": task.negatives,
              "eval_candidates": config.data.eval_candidates, "seed": config.train.seed,
              "separator_id": config.data.separator_id,
              **({"teacher": True} if task.loss == "margin_mse" else {})},
      load=load_groups)
  cfg, meta, loaded = prepared.encoder, prepared.meta, prepared.loaded
  model = SequenceClassifier(cfg, 1, pooling(config, prepared.start), type_separator(meta),
                             check_traced_ids=False)
  finetune.say_prepared(prepared, f"queries, each against {1 + task.negatives} documents "
                        f"({task.loss} loss)", config.train.seq_len,
                        f"; each held-out query reranks up to {meta['width']['eval']} candidates")
  return Setup(task=RerankTask(model, task.loss), encoder=cfg, train=loaded["train"],
               eval=loaded["eval"],
               eval_fill={"tokens": prepared.pad_id, "seconds": 0, "relevant": 0,
                          "present": 0, "positives": 0},
               record={"encoder": cfg.record(), "dataset": loaded["identity"],
                       "source": os.path.join(workdir, "data"),
                       "start": prepared.start.source, "pooling": model.pooling,
                       "family": prepared.start.family},
               start_params=_with_start_classifier(
                   start_params(prepared.start, cfg, config, 1, model.pooling), prepared.start,
                   cfg, model.pooling))


def _with_start_classifier(params: dict | None, start: Start, cfg, pooling: str
                           ) -> dict | None:
  """`params` with the classifier of the start where it is a reranker (a
  *ForSequenceClassification of one label, as flax_encoder.cross_encoder reads it) pooled as
  the run pools: fine-tuning goes on from its scores rather than from a new classifier."""
  classifier = start.hf and start.hf.get("classifier")
  if not classifier or params is None:
    return params
  if "error" in classifier:
    raise RunError(f"config.init.hf: {classifier['error']}")
  said = (f"config.init.hf: {start.source} is a classifier of {classifier['num_labels']} "
          f"labels")
  if classifier["num_labels"] != 1 or classifier["pooling"] != pooling:
    if jax.process_index() == 0:
      print(f"{said} pooled by {classifier['pooling']!r}: the reranker's score starts from a "
            f"new classifier (pooled by {pooling!r})", file=sys.stderr)
    return params
  dtype = np.dtype(cfg.param_dtype)
  head = jax.tree.map(lambda x: np.asarray(x).astype(dtype), classifier["params"])
  return {**params, **head}


def _as_list(value) -> list:
  return value if isinstance(value, list) else [value]


class RerankPredictor(Regressor):
  """A fine-tuned reranker (`run`: a rerank run's workdir, or the run read): (query,
  document) lines in, scores out."""

  task = "rerank"
  data_format = FORMAT
  types_from_pairs = True  # as it trained (RerankTask.scores)

  def predict(self, chunk: list) -> tuple[list[dict], list]:
    logits = self.numbers([t for t, _ in chunk], [p for _, p in chunk])
    scores = 1 / (1 + np.exp(-logits.astype(np.float64)))
    return ([{"score": float(s), "logit": float(x)} for s, x in zip(scores, logits)],
            scores.tolist())

  def read(self, record: dict, where: str) -> tuple:
    """((query, document), the line's label (1 relevant, 0 not) or NaN where it has none)."""
    text, pair = line_texts(record, self.fields, where)
    if pair is None:
      raise RunError(f"{where}: no {self.fields['pair']!r} field, expected the document to "
                     f"score against {self.fields['text']!r}")
    label, field = record.get(self.fields["label"]), self.fields["label"]
    return (text, pair), (np.nan if label is None else examples.target(label, where, field))

  def scores(self, true: list, predicted: list) -> dict | None:
    """Of the labelled lines: the binary cross-entropy of the scores, and their accuracy at
    0.5."""
    true, predicted = np.asarray(true, np.float64), np.asarray(predicted, np.float64)
    labelled = ~np.isnan(true)
    if not labelled.any():
      return None
    true, p = true[labelled], np.clip(predicted[labelled], 1e-12, 1 - 1e-12)
    return {"bce": float(np.mean(-true * np.log(p) - (1 - true) * np.log(1 - p))),
            "accuracy": float(np.mean((p > 0.5) == (true > 0.5)))}


def summary(metrics: dict) -> str:
  return (f"eval MRR@10 {metrics['mrr_at_10']:.3f} (first stage "
          f"{metrics['first_stage_mrr_at_10']:.3f}), nDCG@10 {metrics['ndcg_at_10']:.3f} (first "
          f"stage {metrics['first_stage_ndcg_at_10']:.3f}), eval loss {metrics['loss']:.3f}")


def defaults(config) -> None:
  """The run's length, where neither num_steps nor epochs is set: one epoch from a pretrained
  start, as the other retrieval tasks (`contrastive.one_epoch_from_a_start`), said in one line
  (process 0)."""
  said = contrastive.one_epoch_from_a_start(config)
  if said and jax.process_index() == 0:
    print("; ".join(said), file=sys.stderr)


DEFINITION = Definition(
    name=RerankPredictor.task,
    fields={**{k: v for k, v in finetune.FIELDS.items() if k != "task.packed"},
            "task.pooling": finetune.TEXT_FIELDS["task.pooling"],
            "task.loss": Field(choice(LOSSES)),
            "task.negatives": Field(integer(1)),
            "data.query_field": Field(string),
            "data.positive_field": Field(string),
            "data.negative_field": Field(string),
            "data.documents_field": Field(string),
            "data.scores_field": Field(string),
            "data.document_field": Field(string, FREE),  # prediction only
            "data.label_field": Field(string, FREE),
            "data.separator_id": Field(integer(0)),
            "data.eval_candidates": Field(integer(2))},
    setup=setup,
    plots=Plots(loss_title="Reranking loss", loss_unit="nats / query",
                train_loss="train (each query's group)",
                eval_loss="eval (each query's candidates)",
                metrics={"mrr_at_10": "MRR@10", "ndcg_at_10": "nDCG@10"},
                baseline=("first_stage_mrr_at_10", "baseline: MRR@10 of the first stage"),
                accuracy_title="Held-out reranking of each query's candidates"),
    summary=summary,
    defaults=defaults,
    predictor=RerankPredictor,
    hf_model=lambda workdir, config: hf_model(
        read_run(workdir, RerankPredictor), lambda run, family: sequence_classifier(run, family)),
    check=finetune.check,
    tokenizer=lambda config, workdir: run_tokenizer(workdir),
)
