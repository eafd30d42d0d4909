"""Masked-token prediction: the corruption drawn on the device and the output layer at the
chosen positions."""

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_encoder import Encoder, EncoderConfig
from flax_encoder.masked_lm import MaskedLM
from train.data.tokens import FIRST_TOKEN_ID, MASK_ID, PAD_ID, SEPARATOR_ID
from train.tasks.masked_lm import mask_tokens, predictions_per_row


def _mask(tokens, seed=0, mask_rate=0.15, vocab_size=1000, predictions=None):
  predictions = predictions or predictions_per_row(mask_rate, tokens.shape[1])
  fn = jax.jit(functools.partial(mask_tokens, mask_rate=mask_rate, vocab_size=vocab_size,
                                 predictions=predictions))
  return jax.device_get(fn(jnp.asarray(tokens), jax.random.PRNGKey(seed)))


def test_masking_chooses_round_rate_n_tokens_per_row_never_specials_and_keeps_80_10_10():
  rng = np.random.default_rng(0)
  tokens = rng.integers(FIRST_TOKEN_ID, 1000, (2000, 128)).astype(np.uint16)
  tokens[:, ::16] = SEPARATOR_ID
  lengths = rng.integers(0, 129, len(tokens))  # rows end in padding, some all padding
  tokens[np.arange(128) >= lengths[:, None]] = PAD_ID
  out = _mask(tokens)
  assert predictions_per_row(0.15, 128) == out["predict_at"].shape[1] == 20
  rows = np.arange(len(tokens))[:, None]
  chosen = out["weights"] > 0
  # Exactly round(0.15 n) of a row's n tokens (at least 1), at distinct positions.
  n = (tokens >= FIRST_TOKEN_ID).sum(1)
  expected = np.where(n > 0, np.maximum(1, np.round(0.15 * n)), 0)
  np.testing.assert_array_equal(chosen.sum(1), expected)
  assert all(len(set(p)) == len(p) for p in out["predict_at"])
  at = tokens[rows, out["predict_at"]]
  np.testing.assert_array_equal(out["targets"], at)
  assert (at[chosen] >= FIRST_TOKEN_ID).all()  # never padding or a separator
  # Unchosen positions keep their ids; chosen ones: 80% mask, 10% random, 10% kept.
  unchanged = np.ones(tokens.shape, bool)
  unchanged[np.repeat(rows, chosen.shape[1], 1)[chosen], out["predict_at"][chosen]] = False
  np.testing.assert_array_equal(out["inputs"][unchanged], tokens[unchanged])
  inputs = out["inputs"][rows, out["predict_at"]][chosen]
  assert abs((inputs == MASK_ID).mean() - 0.8) < 0.01
  assert abs((inputs == at[chosen]).mean() - 0.1 - 0.1 / 996) < 0.01
  assert inputs.max() < 1000 and (inputs[inputs != MASK_ID] >= FIRST_TOKEN_ID).all()
  # Uniform over a row's tokens: in full rows every column is chosen 19 / 128 of the time.
  full = _mask(rng.integers(FIRST_TOKEN_ID, 1000, (2000, 128)))
  per_column = np.bincount(full["predict_at"][full["weights"] > 0], minlength=128) / 2000
  assert np.abs(per_column - 19 / 128).max() < 0.04 and per_column.std() < 0.015


def test_masking_follows_the_key_only():
  tokens = np.random.default_rng(0).integers(FIRST_TOKEN_ID, 300, (8, 64))
  chex.assert_trees_all_equal(_mask(tokens, seed=3), _mask(tokens, seed=3))
  assert (_mask(tokens, seed=3)["predict_at"] != _mask(tokens, seed=4)["predict_at"]).any()
  capped = _mask(tokens, predictions=4)  # an explicit max_predictions_per_seq caps the count
  assert capped["weights"].sum(1).tolist() == [4] * 8
  with pytest.raises(ValueError, match="max_predictions_per_seq must be >= 1, got 0"):
    predictions_per_row(0.15, 64, 0)


@pytest.mark.parametrize("tie", [False, True])
def test_the_head_at_masked_positions_equals_full_logits_there(tie):
  cfg = EncoderConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=16)
  tokens = jnp.asarray(np.random.default_rng(0).integers(FIRST_TOKEN_ID, 50, (3, 16)))
  predict_at = jnp.asarray([[0, 5, 15], [2, 2, 9], [7, 1, 3]])
  selected = MaskedLM(cfg, tie_embeddings=tie)
  params = nn.unbox(selected.init(jax.random.PRNGKey(0), tokens, predict_at))
  full = MaskedLM(cfg, tie_embeddings=tie, head_at_every_position=True)
  every = full.apply(params, tokens)
  chex.assert_shape(every, (3, 16, 50))
  at = np.take_along_axis(np.asarray(every), np.asarray(predict_at)[..., None], axis=1)
  np.testing.assert_allclose(selected.apply(params, tokens, predict_at), at, rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(full.apply(params, tokens, predict_at), at, rtol=1e-6, atol=1e-6)
  names = set(params["params"])
  if tie:  # the embedding table is the output layer's weight: no second [d_model, vocab]
    assert names == {"encoder", "head_bias"}
    p = params["params"]
    hidden = Encoder(cfg).apply({"params": p["encoder"]}, tokens)
    expected = hidden @ p["encoder"]["embedding"]["embedding"].T + p["head_bias"]
    np.testing.assert_allclose(every, expected, rtol=1e-5, atol=1e-6)
  else:
    assert names == {"encoder", "head"}


def test_a_training_step_with_tied_embeddings_updates_the_table_and_the_bias():
  from tests import tiny
  config = tiny.get_config()
  config.task.tie_embeddings = True
  config, task, tx, schedule = tiny.setup(config)
  state = tiny.state(task, tx, config)
  assert set(state.params) == {"encoder", "head_bias"}
  new_state, metrics = tiny.jitted_step(task, tx, schedule)(
      state, next(tiny.batches(config)))
  assert np.isfinite(metrics["loss"])
  table = lambda s: s.params["encoder"]["embedding"]["embedding"]
  assert (table(new_state) != table(state)).any()
  assert (new_state.params["head_bias"] != state.params["head_bias"]).any()
