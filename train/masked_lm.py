"""Masked-token prediction, the pretraining task: BERT's corruption of the token ids, drawn on
the device, the encoder plus an output layer at the chosen positions, and the losses.

`MaskedLMTask` is what the training step (`train.step`) needs of it; fine-tuning
(`train.classify`) is the other task of the same shape.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from flax_encoder import Encoder, EncoderConfig
from flax_encoder.dense import dense
from train.tokens import FIRST_TOKEN_ID, MASK_ID


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
                predictions: int) -> dict:
  """BERT's corruption of a batch of windows, for a jitted step.

  In each row, round(mask_rate * n) of its n tokens (ids >= FIRST_TOKEN_ID: never padding or a
  separator), at least one and at most `predictions`, are chosen uniformly; of them 80% become
  MASK_ID, 10% a random token, 10% stay. The draws depend only on `key` and the row's place
  in the batch, not on how the batch is split over devices (JAX's partitionable threefry).

  Args:
    tokens: int [batch, seq] token ids, of any integer dtype.
    key: the PRNG key of this batch.

  Returns:
    {'inputs': int32 [batch, seq] corrupted ids, 'positions': int32 [batch, predictions]
    the chosen positions (then filler), 'targets': int32 [batch, predictions] the ids there,
    'weights': float32 [batch, predictions], 1 at chosen positions and 0 at filler}.
  """
  tokens = tokens.astype(jnp.int32)
  choose_key, action_key, random_key = jax.random.split(key, 3)
  real = tokens >= FIRST_TOKEN_ID
  # The `predictions` real positions with the largest random scores, in random order, then
  # (in short rows) other positions as filler.
  scores = jnp.where(real, jax.random.uniform(choose_key, tokens.shape), -1.0)
  _, positions = jax.lax.top_k(scores, predictions)
  count = real.sum(-1, keepdims=True)
  chosen = jnp.where(count > 0, jnp.clip(jnp.round(mask_rate * count), 1, predictions), 0)
  weights = jnp.arange(predictions) < chosen
  targets = jnp.take_along_axis(tokens, positions, axis=1)
  action = jax.random.uniform(action_key, positions.shape)
  random_tokens = jax.random.randint(random_key, positions.shape, FIRST_TOKEN_ID, vocab_size)
  replaced = jnp.where(action < 0.8, MASK_ID, jnp.where(action < 0.9, random_tokens, targets))
  replaced = jnp.where(weights, replaced, targets)  # filler keeps its token
  inputs = jax.vmap(lambda row, at, values: row.at[at].set(values))(tokens, positions, replaced)
  return {"inputs": inputs, "positions": positions, "targets": targets,
          "weights": weights.astype(jnp.float32)}


class MaskedLM(nn.Module):
  """Encoder + an output layer to vocabulary logits. Encoder weights live under 'encoder'.

  Attributes:
    config: the encoder's.
    tie_embeddings: the output layer is the transposed embedding table plus a bias (BERT's
      choice), instead of a dense layer of its own ('head').
    head_at_every_position: with `positions`, compute the output layer at every position and
      then select (the cost that selecting first saves; benchmarks/head.py compares them).
  """

  config: EncoderConfig
  tie_embeddings: bool = False
  head_at_every_position: bool = False

  @nn.compact
  def __call__(self, tokens: jax.Array, positions: jax.Array | None = None, *,
               deterministic: bool = True) -> jax.Array:
    """int [batch, seq] -> logits [batch, seq, vocab], or at `positions` (int [batch, k]) only:
    [batch, k, vocab]; in config.dtype."""
    cfg = self.config
    encoder = Encoder(cfg, name="encoder")
    hidden = encoder(tokens, deterministic=deterministic)
    select = lambda x: jnp.take_along_axis(x, positions[..., None], axis=1)
    if positions is not None and not self.head_at_every_position:
      hidden = select(hidden)
    if self.tie_embeddings:
      table = nn.meta.unbox(encoder.variables["params"]["embedding"]["embedding"])
      bias = self.param("head_bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                                  ("vocab",)),
                        (cfg.vocab_size,), cfg.param_dtype)
      logits = jnp.einsum("bsd,vd->bsv", hidden.astype(cfg.dtype), table.astype(cfg.dtype))
      logits = logits + bias.astype(cfg.dtype)
    else:
      logits = dense(cfg, cfg.vocab_size, ("embed", "vocab"), "head",
                     kernel_init=nn.initializers.lecun_normal())(hidden)
    if positions is not None and self.head_at_every_position:
      logits = select(logits)
    return logits


def smoothed_loss_sum(logits, targets, weights, label_smoothing: float) -> jax.Array:
  """Label-smoothed cross-entropy summed over the weighted (masked) positions."""
  logits = logits.astype(jnp.float32)
  labels = optax.smooth_labels(jax.nn.one_hot(targets, logits.shape[-1]), label_smoothing)
  return jnp.sum(optax.softmax_cross_entropy(logits, labels) * weights)


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
  """Masked-token prediction as `train.step` runs it (see `train.step.Task`).

  Attributes:
    model: the encoder and its output layer.
    mask_rate: fraction of each row's tokens to predict.
    predictions: positions the output layer runs on per row.
    label_smoothing: of the training loss (the eval loss has none).
    baseline_token: the commonest token of the training data, the guess of the baseline.
  """

  model: MaskedLM
  mask_rate: float
  predictions: int
  label_smoothing: float
  baseline_token: int

  def init(self, rng: jax.Array, seq_len: int):
    """Parameters, boxed with their logical axes."""
    tokens = jnp.ones((1, seq_len), jnp.int32)
    return self.model.init(rng, tokens, jnp.zeros((1, 1), jnp.int32))["params"]

  def batch(self, tokens: jax.Array, key: jax.Array) -> dict:
    """Token ids [batch, seq] -> the masked batch (`mask_tokens`), drawn from `key`."""
    return mask_tokens(tokens, key, mask_rate=self.mask_rate,
                       vocab_size=self.model.config.vocab_size, predictions=self.predictions)

  def loss_count(self, batch: dict) -> jax.Array:
    """What the training loss is averaged over: the batch's masked positions."""
    return jnp.sum(batch["weights"])

  def loss_sum(self, params, batch: dict, dropout_rng: jax.Array) -> jax.Array:
    logits = self.model.apply({"params": params}, batch["inputs"], batch["positions"],
                              deterministic=False, rngs={"dropout": dropout_rng})
    return smoothed_loss_sum(logits, batch["targets"], batch["weights"], self.label_smoothing)

  def eval_sums(self, params, batch: dict) -> dict:
    logits = self.model.apply({"params": params}, batch["inputs"], batch["positions"])
    return eval_sums(logits, batch["targets"], batch["weights"], self.baseline_token)

  @staticmethod
  def eval_metrics(sums: dict) -> dict:
    """Summed eval_sums -> the metrics an evaluation reports."""
    count = max(sums["count"], 1.0)
    return {"loss": sums["ce"] / count, "accuracy": sums["correct"] / count,
            "baseline_accuracy": sums["baseline_correct"] / count}


def task(config, cfg: EncoderConfig, baseline_token: int) -> MaskedLMTask:
  """The task config.task describes (label smoothing from config.optim) for the encoder `cfg`."""
  return MaskedLMTask(
      model=MaskedLM(cfg, tie_embeddings=config.task.tie_embeddings),
      mask_rate=config.task.mask_rate,
      predictions=predictions_per_row(config.task.mask_rate, config.train.seq_len,
                                      config.task.max_predictions_per_seq),
      label_smoothing=config.optim.label_smoothing, baseline_token=baseline_token)
