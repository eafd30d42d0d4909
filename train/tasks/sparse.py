r"""Contrastive fine-tuning of sparse (SPLADE) embeddings: a text's vector is its masked-LM
logits, log(1 + relu(·)), max-pooled (or summed) over its ids: one weight per vocabulary
entry, most of them 0.

  python -m train --config=configs/sparse.py --workdir runs/splade \
      --config.data.train=pairs.jsonl --config.data.eval=held_out.jsonl \
      --config.init.hf=SPLADE_OR_MLM_DIR   # a SparseEncoder folder, or any *ForMaskedLM
  python -m train.export --workdir runs/splade --layout sentence-transformers --out splade/

The pairs are configs/embed.py's ({"anchor", "positive"[, "negative"]}), prepared and packed as
train.tasks.contrastive prepares and packs them. The loss is sentence-transformers' SpladeLoss
around SparseMultipleNegativesRankingLoss: the cross-entropy of anchor i over its dot products
with the batch's positives (and hard negatives) times config.task.scale, plus the FLOPS
regulariser of the batch's documents (positives and negatives) and of its queries (anchors),
each weighted (config.task.document_regularizer, config.task.query_regularizer): the squared
mean weight of each vocabulary entry over the batch, summed, which pushes entries to 0 in every
text at once. Evaluation ranks every held-out anchor against every held-out positive by dot
product (MRR@10, nDCG@10, recall@1 and @10) and reports the vectors' active dimensions.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from flax_encoder import families
from flax_encoder import modules_json
from flax_encoder.masked_lm import MaskedLM
from flax_encoder.ranking import diagonal_metrics
from flax_encoder.sparse import (POOLING_STRATEGIES, SPLADE_ACTIVATIONS, SpladeEmbedding,
                                 SpladeModel)
from flax_encoder.tokenizer import Template
from train.errors import RunError
from train.run.load import recorded_encoder_config
from train.task import (Definition, Field, HFModel, Plots, Resume, Setup, boolean, choice,
                        number)
from train.tasks import contrastive, finetune, tokenizing
from train.tasks.contrastive import (ContrastiveTask, cross_entropy_sum, diagonal, distillation,
                                    pair_scores)
from train.tasks.start import start_files_read

TOP = contrastive.TOP


@dataclasses.dataclass(frozen=True)
class SparseRankingLoss:
  """SparseMultipleNegativesRankingLoss over dot products times `scale`, and the FLOPS
  regulariser of the documents and queries, weighted."""

  scale: float = 1.0
  document_regularizer: float = 3e-5
  query_regularizer: float = 5e-5
  inputs = ("has_negative",)  # what it takes of the batch after the texts

  def __call__(self, anchors, positives, negatives=None, has_negative=None) -> jax.Array:
    """The loss summed over the B anchors of [B, v] vectors (the regularisers B times, so
    that the mean over anchors carries them once); `negatives` [B, v] add their columns where
    `has_negative` [B] (default all) is true."""
    scores = self.scale * anchors @ positives.T  # [anchor, positive]
    candidates, documents = scores, positives
    present = jnp.ones(len(positives), bool)
    if negatives is not None:
      has = (jnp.ones(len(negatives), bool) if has_negative is None
             else jnp.asarray(has_negative, bool))
      hard = jnp.where(has[None, :], self.scale * anchors @ negatives.T, -jnp.inf)
      candidates = jnp.concatenate([scores, hard], axis=1)
      documents = jnp.concatenate([positives, negatives])
      present = jnp.concatenate([present, has])
    ranking = cross_entropy_sum(candidates, diagonal(scores))
    return ranking + len(anchors) * (self.document_regularizer * flops(documents, present) +
                                     self.query_regularizer * flops(anchors))


@dataclasses.dataclass(frozen=True)
class SparseDistillationLoss:
  """A teacher's scores distilled into sparse vectors, as sentence-transformers' SpladeLoss
  around SparseMarginMSELoss ("margin_mse") or SparseDistillKLDivLoss ("kl") computes it:
  `contrastive.distillation` of the dot products, and SparseRankingLoss's FLOPS regularisers
  of the documents (positives and negatives) and the queries."""

  kind: str
  temperature: float = 2.0
  document_regularizer: float = 3e-5
  query_regularizer: float = 5e-5
  scale: float = 1.0  # the held-out loss's (SparseTask.eval_metrics), not this one's
  inputs = ("teacher",)

  def __call__(self, anchors, positives, negatives, teacher) -> jax.Array:
    base = distillation(self.kind, pair_scores(anchors, positives, negatives), teacher,
                        self.temperature)
    return base + len(anchors) * (
        self.document_regularizer * flops(jnp.concatenate([positives, negatives])) +
        self.query_regularizer * flops(anchors))


def flops(vectors: jax.Array, present: jax.Array | None = None) -> jax.Array:
  """The FLOPS regulariser of [n, v] vectors (the `present` ones): the squared mean of each
  dimension over them, summed (Paria et al. 2020)."""
  if present is None:
    return jnp.sum(jnp.mean(vectors, axis=0) ** 2)
  weights = present.astype(vectors.dtype)[:, None]
  return jnp.sum((jnp.sum(vectors * weights, 0) / jnp.maximum(jnp.sum(weights), 1)) ** 2)


@dataclasses.dataclass(frozen=True)
class SparseTask(ContrastiveTask):
  """ContrastiveTask's batches and held-out rows, each text's vector SPLADE's (`model` is the
  library's SpladeEmbedding, params {'encoder', 'masked_lm'}); ranked by dot product."""

  def eval_metrics(self, sums: dict) -> dict:
    """The ranking metrics of every held-out anchor against every held-out positive by dot
    product, the loss over them all (without the regularisers), the active dimensions of the
    anchors' and positives' vectors, and MRR@10 of a random ranking."""
    anchors, positives = (np.asarray(sums[k], np.float64) for k in ("anchors", "positives"))
    scores = self.loss.scale * anchors @ positives.T
    peak = scores.max(axis=1, keepdims=True)
    log_z = peak[:, 0] + np.log(np.sum(np.exp(scores - peak), axis=1))
    n = len(scores)
    return {"loss": float(np.mean(log_z - np.diagonal(scores))), **diagonal_metrics(scores),
            "active_dims_anchor": float(np.mean(np.count_nonzero(anchors, axis=1))),
            "active_dims_positive": float(np.mean(np.count_nonzero(positives, axis=1))),
            "random_mrr_at_10": float(sum(1 / r for r in range(1, min(TOP, n) + 1)) / n)}


# ---------------------------------------------------------------------------------------------
# What the loop needs.


def _untied(family: str | None) -> bool:
  return family is not None and families.get(family).untied_decoder


def setup(config, workdir: str, resume: Resume) -> Setup:
  """Sparse contrastive fine-tuning on config.data.train, ranked on config.data.eval."""
  paths = {"train": config.data.train, "eval": config.data.eval}
  prepared = contrastive.prepared_pairs(config, workdir, resume, paths)
  cfg, loaded, start = prepared.encoder, prepared.loaded, prepared.start
  head = start.hf.get("masked_lm") if start.hf else None
  if start.hf is None or (head is None and not config.init.fresh_head):
    raise RunError(f"config.init.hf: {config.init.hf or 'unset'}, expected a Hugging Face "
                   f"*ForMaskedLM directory or a SparseEncoder folder: SPLADE's vectors are "
                   f"its masked-LM head's (config.init.fresh_head=True starts a new one on "
                   f"an encoder without)")
  if head is None and jax.process_index() == 0:
    print(f"{config.init.hf} has no masked-LM head: a new one starts (dense, LayerNorm and "
          f"output bias drawn afresh; its decoder the word embeddings)", file=sys.stderr)
  held_out = contrastive.held_out_pairs(config, prepared)
  family = start.family
  task_config = config.task
  model = SpladeEmbedding(SpladeModel(cfg, task_config.pooling, task_config.activation,
                                      _untied(family)), check_traced_ids=False)
  chunks = contrastive.gradcache_chunks(config, loaded)
  regularizers = (float(task_config.document_regularizer), float(task_config.query_regularizer))
  loss = (SparseRankingLoss(float(task_config.scale), *regularizers) if task_config.loss == "mnrl"
          else SparseDistillationLoss(task_config.loss, float(task_config.temperature),
                                      *regularizers, float(task_config.scale)))
  task = SparseTask(model, loss, held_out.count, chunks)
  negatives = "with hard negatives" if "negative" in loaded["train"] else "no hard negatives"
  finetune.say_prepared(prepared, f"pairs ({negatives}), sparse vectors of {cfg.vocab_size} "
                        f"dimensions", config.train.seq_len)
  dtype = np.dtype(cfg.param_dtype)
  return Setup(task=task, encoder=cfg, train=loaded["train"], eval=held_out.rows,
               eval_fill=held_out.fill,
               record={"encoder": cfg.record(), "dataset": loaded["identity"],
                       "source": os.path.join(workdir, "data"), "start": start.source,
                       "family": family, "pooling": task_config.pooling,
                       "activation": task_config.activation},
               start_params={"encoder": start.params, **({} if head is None else {
                   "masked_lm": jax.tree.map(lambda x: x.astype(dtype), head)})},
               packer=contrastive.pair_packer(config, prepared, chunks))


def defaults(config) -> None:
  """contrastive's defaults; the pooling and activation of a SparseEncoder folder as
  config.init.hf where unset (else max and relu, sentence-transformers' for a masked LM)."""
  pooling = _start_pooling(config)
  said = []
  for name, value in (("pooling", pooling.get("pooling_strategy", "max")),
                      ("activation", pooling.get("activation_function", "relu"))):
    if config.task[name] is None:
      config.task[name] = value
      if pooling:
        said.append(f"config.task.{name}: {value!r}, {config.init.hf}'s SpladePooling")
  if said and jax.process_index() == 0:
    print("; ".join(said), file=sys.stderr)
  contrastive.defaults(config)


def _start_pooling(config) -> dict:
  """The SpladePooling settings of config.init.hf where it is a SparseEncoder folder ({}
  otherwise, or where it cannot be read: loading it says what is wrong)."""
  start = config.init.get("hf")
  try:
    files = start_files_read(start) if start else None
    modules = modules_json.read_modules(start, files) if start else None
    for module in modules or []:
      if module.get("type", "").endswith("SpladePooling"):
        return modules_json.read_json(os.path.join(start, module["path"], "config.json"),
                                      kind=dict, files=files) or {}
  except (ValueError, OSError):
    pass
  return {}


def check(config) -> None:
  """contrastive's checks of a batch; the start's SpladePooling where it has one."""
  contrastive.check_batch(config)
  task = config.task
  pooling = _start_pooling(config)
  for name, key in (("pooling", "pooling_strategy"), ("activation", "activation_function")):
    if key in pooling and pooling[key] != task[name]:
      raise RunError(f"config.task.{name}: {task[name]!r}, but config.init.hf "
                     f"{config.init.hf} has {pooling[key]!r} (its SpladePooling); set "
                     f"config.task.{name}={pooling[key]} to fine-tune the vectors it gives")


def summary(metrics: dict) -> str:
  return (f"eval MRR@10 {metrics['mrr_at_10']:.3f} (random ranking "
          f"{metrics['random_mrr_at_10']:.3f}), nDCG@10 {metrics['ndcg_at_10']:.3f}, "
          f"active dimensions {metrics['active_dims_anchor']:.0f} (anchors) "
          f"{metrics['active_dims_positive']:.0f} (positives), eval loss {metrics['loss']:.3f}")


# ---------------------------------------------------------------------------------------------
# The run read back: train.export --layout hf or sentence-transformers.


def read_trained(workdir: str, **settings) -> tuple:
  """`contrastive.read_run` of the sparse run `workdir`: the parameters {'encoder',
  'masked_lm'}."""
  return contrastive.read_run(workdir, lambda record: MaskedLM(
      recorded_encoder_config(record), checkpoint_head=True,
      decoder_head=_untied(record.get("family"))), **settings)


def sparse_encoder(workdir: str, dtype: str = "float32"):
  """The run as a flax_encoder.sparse.SparseEncoder computed in `dtype`: its masked LM, its
  pooling; its tokenizer and template, texts cut to its seq_len."""
  from flax_encoder.sparse import SparseEncoder
  cfg, params, record = read_trained(workdir, dtype=dtype)
  meta = contrastive.read_meta(os.path.join(workdir, "data"))
  model = SpladeModel(cfg, record["pooling"], record["activation"],
                      _untied(record.get("family")))
  return SparseEncoder(model, params, tokenizing.run_tokenizer(workdir, meta), meta["seq_len"],
                       template=Template.from_dict(meta["template"]) if meta.get("template")
                       else Template())


def hf_model(workdir: str, config) -> HFModel:
  """The run as transformers' *ForMaskedLM: its encoder and masked-LM head."""
  cfg, params, record = read_trained(workdir)
  tokenizer = contrastive.run_tokenizer(config, workdir)
  own = tokenizer.spec.kind == "huggingface" and tokenizer.offset == 0
  variables = {"params": params["encoder"], "heads": {"masked_lm": params["masked_lm"]}}
  return HFModel(cfg, record.get("family"), lambda family: (
      families.to_hf_state_dict(variables, cfg, family.name, prefix=family.prefix),
      {"architectures": [f"{family.stem}ForMaskedLM"]}), tokenizer.spec.path if own else None)


DEFINITION = Definition(
    name="sparse",
    fields={**contrastive.PAIR_FIELDS, **contrastive.DISTILLATION_FIELDS,
            "task.pooling": Field(choice(POOLING_STRATEGIES)),
            "task.activation": Field(choice(SPLADE_ACTIVATIONS)),
            "task.document_regularizer": Field(number(0, low_open=False)),
            "task.query_regularizer": Field(number(0, low_open=False)),
            "init.fresh_head": Field(boolean)},
    setup=setup,
    plots=Plots(loss_title="Sparse contrastive loss (in-batch negatives, FLOPS)",
                loss_unit="nats / anchor", train_loss="train (with the regularisers)",
                **contrastive.RANKING_PLOTS,
                accuracy_title="Held-out retrieval: each anchor among all positives"),
    summary=summary,
    hf_model=hf_model,
    sentence_encoder=sparse_encoder,
    check=check,
    defaults=defaults,
    tokenizer=contrastive.run_tokenizer,
)
