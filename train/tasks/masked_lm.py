"""Masked-token prediction, the pretraining task: BERT's corruption of the token ids, drawn on
the device, the encoder plus an output layer at the chosen positions, and the losses.

`MaskedLMTask` is what the training step (`train.run.step`) needs of it, and `DEFINITION` what the
program knows of the task (`train.task`); fine-tuning (`train.tasks.classify`) is the other task.
"""

from __future__ import annotations

import dataclasses
import math
import sys

import jax
import jax.numpy as jnp
import optax

from flax_encoder import EncoderConfig, families, segment_positions
from flax_encoder.masked_lm import MaskedLM
from train.data import dataset
from train.data.tokens import PROJECT_IDS, SpecialIds
from train.errors import RunError
from train.run import settings
from train.run.load import load_encoder, load_params, recorded_encoder_config
from train.run.optim import smoothed_loss_sum
from train.tasks import start as start_lib
from train.task import (FIXES_STATE, FREE, Definition, Field, HFModel, Plots, Resume, Setup,
                        boolean, integer, number, optional, paths, string)


def predictions_per_row(mask_rate: float, seq_len: int, given: int | None = None) -> int:
  """Positions predicted per row (BERT's max_predictions_per_seq): enough for `mask_rate` of a
  full row unless `given`."""
  if not 0 < mask_rate <= 1:
    raise ValueError(f"config.task.mask_rate must be in (0, 1], got {mask_rate}")
  if given is None:
    return max(1, math.ceil(mask_rate * seq_len))
  if given < 1:
    raise ValueError(f"config.task.max_predictions_per_seq must be >= 1, got {given}")
  return min(given, seq_len)


def mask_tokens(tokens: jax.Array, key: jax.Array, *, mask_rate: float, vocab_size: int,
                predictions: int, ids: SpecialIds = PROJECT_IDS) -> dict:
  """BERT's corruption of a batch of windows, for a jitted step.

  In each row, round(mask_rate * n) of its n text tokens (`ids.is_text`: never padding, a
  separator or another special id), at least one and at most `predictions`, are chosen
  uniformly; of them 80% become `ids.mask`, 10% a random token (from ids.first_token on),
  10% stay. The draws depend only on `key` and the row's place
  in the batch, not on how the batch is split over devices (JAX's partitionable threefry).

  Args:
    tokens: int [batch, seq] token ids, of any integer dtype.
    key: the PRNG key of this batch.

  Returns:
    {'inputs': int32 [batch, seq] corrupted ids, 'predict_at': int32 [batch, predictions]
    the chosen positions (then filler), 'targets': int32 [batch, predictions] the ids there,
    'weights': float32 [batch, predictions], 1 at chosen positions and 0 at filler}.
  """
  tokens = tokens.astype(jnp.int32)
  choose_key, action_key, random_key = jax.random.split(key, 3)
  real = ids.is_text(tokens)
  # The `predictions` real positions with the largest random scores, in random order, then
  # (in short rows) other positions as filler.
  scores = jnp.where(real, jax.random.uniform(choose_key, tokens.shape), -1.0)
  _, predict_at = jax.lax.top_k(scores, predictions)
  count = real.sum(-1, keepdims=True)
  chosen = jnp.where(count > 0, jnp.clip(jnp.round(mask_rate * count), 1, predictions), 0)
  weights = jnp.arange(predictions) < chosen
  targets = jnp.take_along_axis(tokens, predict_at, axis=1)
  action = jax.random.uniform(action_key, predict_at.shape)
  random_tokens = jax.random.randint(random_key, predict_at.shape, ids.first_token, vocab_size)
  replaced = jnp.where(action < 0.8, ids.mask, jnp.where(action < 0.9, random_tokens, targets))
  replaced = jnp.where(weights, replaced, targets)  # filler keeps its token
  inputs = jax.vmap(lambda row, at, values: row.at[at].set(values))(tokens, predict_at, replaced)
  return {"inputs": inputs, "predict_at": predict_at, "targets": targets,
          "weights": weights.astype(jnp.float32)}


def document_ids(tokens: jax.Array, ids: SpecialIds = PROJECT_IDS) -> jax.Array:
  """int32 [batch, seq]: the segment id of each token's document in its window, 1 + the
  separators before it (a separator ends its document and belongs to it); 0 at padding."""
  separators = (tokens == ids.separator).astype(jnp.int32)
  return jnp.where(tokens == ids.pad, 0, jnp.cumsum(separators, axis=1) - separators + 1)


def eval_sums(logits, targets, weights, baseline_token: int) -> dict:
  """Sums over masked positions: cross-entropy (no smoothing), correct, baseline correct."""
  logits = logits.astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return {"ce": jnp.sum(ce * weights),
          "correct": jnp.sum((jnp.argmax(logits, -1) == targets) * weights),
          "baseline_correct": jnp.sum((targets == baseline_token) * weights),
          "count": jnp.sum(weights)}


@dataclasses.dataclass(frozen=True)
class MaskedLMTask:
  """Masked-token prediction as `train.run.step` runs it (see `train.run.step.Task`).

  Attributes:
    model: the encoder and its output layer.
    mask_rate: fraction of each row's tokens to predict.
    predictions: positions the output layer runs on per row.
    label_smoothing: of the training loss (the eval loss has none).
    baseline_token: the commonest token of the training data, the guess of the baseline.
    cross_document_attention: the documents packed into a window see each other, with
      positions running on across them; False encodes each as if alone (segment ids and
      per-document positions from the separators, in the step).
    ids: the data's special ids (this project's, or a Hugging Face checkpoint's own).
  """

  model: MaskedLM
  mask_rate: float
  predictions: int
  label_smoothing: float
  baseline_token: int
  cross_document_attention: bool = True
  ids: SpecialIds = PROJECT_IDS

  def init(self, rng: jax.Array, seq_len: int):
    """Parameters, boxed with their logical axes."""
    tokens = jnp.ones((1, seq_len), jnp.int32)
    return self.model.init(rng, tokens, jnp.zeros((1, 1), jnp.int32))["params"]

  def batch(self, tokens: jax.Array, key: jax.Array) -> dict:
    """Token ids [batch, seq] -> the masked batch (`mask_tokens`), drawn from `key`."""
    return mask_tokens(tokens, key, mask_rate=self.mask_rate,
                       vocab_size=self.model.config.vocab_size, predictions=self.predictions,
                       ids=self.ids)

  def loss_count(self, batch: dict) -> jax.Array:
    """What the training loss is averaged over: the batch's masked positions."""
    return jnp.sum(batch["weights"])

  def loss_sum(self, params, batch: dict, dropout_rng: jax.Array) -> jax.Array:
    logits = self.model.apply({"params": params}, batch["inputs"], batch["predict_at"],
                              **self._documents(batch["inputs"]), deterministic=False,
                              rngs={"dropout": dropout_rng})
    return smoothed_loss_sum(logits, batch["targets"], batch["weights"], self.label_smoothing)

  def eval_sums(self, params, batch: dict) -> dict:
    logits = self.model.apply({"params": params}, batch["inputs"], batch["predict_at"],
                              **self._documents(batch["inputs"]))
    return eval_sums(logits, batch["targets"], batch["weights"], self.baseline_token)

  def _documents(self, inputs: jax.Array) -> dict:
    """The encoder's segment ids and positions that keep documents apart, unless they may
    see each other. Masking never touches a separator, so they come from the inputs."""
    if self.cross_document_attention:
      return {}
    segment_ids = document_ids(inputs, self.ids)
    return {"segment_ids": segment_ids, "positions": segment_positions(segment_ids)}

  @staticmethod
  def eval_metrics(sums: dict) -> dict:
    """Summed eval_sums -> the metrics an evaluation reports."""
    count = max(float(sums["count"]), 1.0)
    return {"loss": float(sums["ce"]) / count, "accuracy": float(sums["correct"]) / count,
            "baseline_accuracy": float(sums["baseline_correct"]) / count}

  @staticmethod
  def token_count(rows) -> int:
    """Tokens in a batch of windows."""
    return int(rows.size)


def task(config, cfg: EncoderConfig, baseline_token: int, ids: SpecialIds = PROJECT_IDS,
         checkpoint_head: bool = False, decoder_head: bool = False) -> MaskedLMTask:
  """The task config.task describes (label smoothing from config.optim) for the encoder `cfg`
  and data of special `ids`; `checkpoint_head`: a Hugging Face checkpoint's head (`decoder_head`:
  an untied decoder)."""
  return MaskedLMTask(
      model=MaskedLM(cfg, tie_embeddings=_tied(config, cfg, checkpoint_head),
                     checkpoint_head=checkpoint_head, decoder_head=decoder_head,
                     check_traced_ids=False),  # the windows' ids are checked as read
      mask_rate=config.task.mask_rate,
      predictions=predictions_per_row(config.task.mask_rate, config.train.seq_len,
                                      config.task.max_predictions_per_seq),
      label_smoothing=config.optim.label_smoothing, baseline_token=baseline_token,
      cross_document_attention=config.task.cross_document_attention, ids=ids)


def _tied(config, cfg: EncoderConfig, checkpoint_head: bool) -> bool:
  """config.task.tie_embeddings, where the table can be the output layer: its width is the
  encoder's (a factorised table's is not; BERT's head projects to it)."""
  if config.task.tie_embeddings and cfg.embedding_width != cfg.d_model and not checkpoint_head:
    raise RunError(f"config.task.tie_embeddings: True with config.model.embedding_size "
                   f"{cfg.embedding_size}, expected False: the table's rows are narrower than "
                   f"the encoder's output")
  return config.task.tie_embeddings


def setup(config, workdir: str, resume: Resume) -> Setup:
  """Pretraining on the windows config.data names (train.data.dataset.windows), from scratch or,
  with config.init.hf, on from a Hugging Face checkpoint."""
  windows = dataset.windows(config, workdir, resume.resuming, resume.allow_changes)
  baseline = dataset.most_frequent_token(windows.train, specials=windows.specials)
  start = config.init.get("hf") if "init" in config else None
  family = None  # the Hugging Face checkpoint's family (its name), for the run's record
  if start:
    copied = start_lib.read_start(start)  # what its exports read, taken before the weights
    cfg, params, family, heads = _from_hf(config, start, windows)
    start_lib.keep_start(copied, heads, workdir)
  else:
    cfg, params = settings.encoder_config(config.model, windows.vocab_size, windows.source,
                                          config.train.seq_len), None
  return Setup(task=task(config, cfg, baseline, windows.specials, checkpoint_head=bool(start),
                         decoder_head=_untied(family)),
               encoder=cfg, train=windows.train,
               eval=windows.eval[:config.data.max_eval_windows], eval_fill=windows.specials.pad,
               record={"encoder": cfg.record(), "dataset": windows.identity,
                       "source": windows.source, "start": start or "scratch",
                       "family": family},
               sources=windows.sources, start_params=params)


def _from_hf(config, path: str, windows: dataset.Windows):
  """(EncoderConfig, starting parameters, family name, its heads) of the Hugging Face
  checkpoint at `path`, run as config.model's training and execution fields say; the windows
  must hold its own ids."""
  from flax_encoder.families import read_hf
  run = {name: config.model[name] for name in EncoderConfig.fields("training") +
         EncoderConfig.fields("execution") if config.model.get(name) is not None}
  try:
    family, cfg, variables = read_hf(path, **run)
  except (FileNotFoundError, ValueError, TypeError) as e:
    raise RunError(f"config.init.hf: {e}".splitlines()[0]) from None
  if windows.specials.first_token != 0 or windows.tokenizer.path is None or not (
      _same_tokenizer(path, windows.tokenizer.path)):
    raise RunError(f"config.data.prepared: {windows.source} holds other ids than the "
                   f"checkpoint's; prepare the corpus with its tokenizer and ids: python -m "
                   f"train.prepare --tokenizer {path} ...")
  params = {"encoder": variables["params"]}
  if "masked_lm" in variables.get("heads", {}):
    params["masked_lm"] = variables["heads"]["masked_lm"]
  elif config.init.get("fresh_head"):
    if jax.process_index() == 0:
      head = ("its decoder drawn afresh" if _untied(family) else "dense, LayerNorm and output "
              "bias drawn afresh; its decoder the word embeddings")
      print(f"{path} has no masked-LM head: a new one starts ({head})", file=sys.stderr)
  else:
    kind = "its own decoder" if _untied(family) else "tied to its word embeddings"
    raise RunError(f"config.init.hf: {path} has no masked-LM head (a *ForMaskedLM or "
                   f"*ForPreTraining checkpoint has one); set config.init.fresh_head=True to "
                   f"start a new one, {kind}")
  if windows.vocab_size > cfg.vocab_size:
    raise RunError(f"config.data.prepared: ids up to {windows.vocab_size - 1}, but {path}'s "
                   f"embedding has {cfg.vocab_size} rows")
  settings.check_seq_len(cfg, config.train.seq_len)
  return cfg, params, family, variables.get("heads", {})


def _same_tokenizer(directory: str, prepared: str) -> bool:
  """Whether the data were prepared with the tokenizer of the Hugging Face `directory` (its
  tokenizer.json, or the one its vocabulary files build)."""
  from flax_encoder.hf_tokenizer import tokenizer_from_directory
  try:
    own = tokenizer_from_directory(directory).model
  except ValueError as e:
    raise RunError(f"config.init.hf: {e}") from None
  with open(prepared, "rb") as f:
    return f.read() == own


def hf_model(workdir: str, config) -> HFModel:
  """The run as transformers' model: from a Hugging Face checkpoint, its *ForMaskedLM (the
  encoder and the masked-LM head, the checkpoint's tokenizer); from scratch the bare encoder
  (AutoModel), whose ids carry this project's offset."""
  start = config.init.get("hf") if "init" in config else None
  if not start:
    cfg, variables = load_encoder(workdir)
    return HFModel(cfg, None, lambda family: (
        families.to_hf_state_dict(variables, cfg, family.name),
        {"architectures": [f"{family.stem}Model"]}), None)
  cfg, variables, family = trained_with_head(workdir)
  return HFModel(cfg, family, lambda family: (
      families.to_hf_state_dict(variables, cfg, family.name, prefix=family.prefix),
      {"architectures": [f"{family.stem}ForMaskedLM"]}),
      # trained on the checkpoint's own ids (setup checked the prepared data's tokenizer is
      # the checkpoint's)
      dataset.run_tokenizer(config, workdir).path)


def _untied(family: str | None) -> bool:
  """Whether the Hugging Face family `family` (None: none) has an untied masked-LM decoder."""
  from flax_encoder.families import get
  return family is not None and get(family).untied_decoder


def trained_with_head(workdir: str) -> tuple[EncoderConfig, dict, str | None]:
  """(EncoderConfig, {'params': the encoder's, 'heads': {'masked_lm': …}}, the family it
  recorded) of a further pretraining run's newest verified checkpoint."""
  def init_for(meta):
    model = MaskedLM(recorded_encoder_config(meta), checkpoint_head=True,
                     decoder_head=_untied(meta.get("family")))
    return lambda: model.init(jax.random.PRNGKey(0), jnp.ones((1, 1), jnp.int32))["params"]

  params, meta = load_params(workdir, init_for)
  return (recorded_encoder_config(meta),
          {"params": params["encoder"], "heads": {"masked_lm": params["masked_lm"]}},
          meta.get("family"))


def summary(metrics: dict) -> str:
  return (f"eval masked-token accuracy {metrics['accuracy']:.3f} (most frequent token "
          f"{metrics['baseline_accuracy']:.3f}), eval loss {metrics['loss']:.3f}")


DEFINITION = Definition(
    name="masked_lm",
    fields={
        "task.mask_rate": Field(number(0, 1)),
        "task.max_predictions_per_seq": Field(optional(integer(1))),
        "task.tie_embeddings": Field(boolean, FIXES_STATE),
        "task.cross_document_attention": Field(boolean),
        "data.prepared": Field(optional(string)),
        "data.weights": Field(optional(string)),
        "data.paths": Field(paths),
        "data.eval_fraction": Field(number(0, 1, high_open=True)),
        "data.max_eval_windows": Field(integer(1), FREE),
        "init.hf": Field(optional(string), FIXES_STATE),
        "init.fresh_head": Field(boolean, FREE),
    },
    setup=setup,
    plots=Plots(loss_title="Masked-token loss", loss_unit="nats / masked token",
                train_loss="train (label-smoothed)",
                metrics={"accuracy": "masked-token accuracy"},
                baseline=("baseline_accuracy", "baseline: most frequent token"),
                accuracy_title="Held-out masked-token accuracy"),
    summary=summary,
    hf_model=hf_model,
)
