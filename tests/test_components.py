"""Shapes, golden values and tracing behaviour of each component on its own."""

import dataclasses
import functools
import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_encoder import (
  MASK_FILL,
  Encoder,
  EncoderConfig,
  EncoderLayer,
  MultiHeadAttention,
  PositionalEncoding,
  PositionwiseFeedForward,
  padding_mask,
  scaled_dot_product_attention,
  sinusoidal_positions,
  stack_layers,
  unstack_layers,
)
from flax_encoder.dropout import Dropout, apply_mask, keep_mask, random_words

pytestmark = pytest.mark.library  # the library's own: run on accelerators too


class SdpaTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_shapes_and_weights_sum_to_one(self):
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 5, 3, 4)) for i in range(3))
    out, weights = self.variant(scaled_dot_product_attention)(q, k, v)
    chex.assert_shape(out, (2, 5, 3, 4))
    chex.assert_shape(weights, (2, 3, 5, 5))
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_golden_two_keys(self):
    # One head, head_dim 1: scores q*k/1 = [0, 2] -> weights softmax([0, 2]).
    q = jnp.ones((1, 1, 1, 1))
    k = jnp.array([0.0, 2.0]).reshape(1, 2, 1, 1)
    v = jnp.array([10.0, 20.0]).reshape(1, 2, 1, 1)
    out, weights = self.variant(scaled_dot_product_attention)(q, k, v)
    w1 = math.exp(2) / (1 + math.exp(2))
    np.testing.assert_allclose(weights.ravel(), [1 - w1, w1], rtol=1e-6)
    np.testing.assert_allclose(out.ravel(), [10 * (1 - w1) + 20 * w1], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_masked_keys_get_zero_weight_and_all_masked_row_is_finite_mean(self):
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 4, 2, 8)) for i in range(3))
    mask = jnp.array([[True, True, False, False], [False] * 4])[:, None, None, :]
    out, weights = self.variant(scaled_dot_product_attention)(q, k, v, mask)
    np.testing.assert_array_equal(weights[0, :, :, 2:], 0.0)
    assert bool(jnp.all(jnp.isfinite(out)))
    # All keys masked: every score is MASK_FILL, so the weights are uniform (seed semantics).
    np.testing.assert_allclose(weights[1], 0.25, rtol=1e-6)
    np.testing.assert_allclose(out[1], jnp.broadcast_to(v[1].mean(0), (4, 2, 8)), rtol=1e-5)
    assert MASK_FILL == -1e9

  def test_dropout_on_weights_needs_rng_and_rescales(self):
    q = k = v = jnp.ones((1, 4, 1, 2))
    with pytest.raises(ValueError, match="dropout_rng"):
      scaled_dot_product_attention(q, k, v, dropout_rate=0.5)
    out, _ = scaled_dot_product_attention(q, k, v, dropout_rate=0.5,
                                          dropout_rng=jax.random.key(0))
    # Uniform weights 1/4 on four ones: kept weights become 1/2, so outputs are multiples of 1/2.
    np.testing.assert_allclose(np.asarray(out) * 2, np.round(np.asarray(out) * 2), atol=1e-6)


class PositionsTest(chex.TestCase):

  def test_golden_values_interleaved_sin_cos(self):
    pe = sinusoidal_positions(3, 4)
    chex.assert_shape(pe, (3, 4))
    np.testing.assert_allclose(pe[0], [0, 1, 0, 1], atol=1e-7)
    # pos 1: dims (0, 1) use frequency 1, dims (2, 3) use 10000^(-2/4) = 0.01.
    np.testing.assert_allclose(pe[1], [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
                               rtol=1e-6)

  def test_module_adds_table_and_rejects_long_input(self):
    x = jnp.zeros((2, 5, 6))
    y = PositionalEncoding(max_len=8, d_model=6).apply({}, x)
    np.testing.assert_allclose(y[1], sinusoidal_positions(5, 6), rtol=1e-6)
    with pytest.raises(ValueError, match="max_len=4"):
      PositionalEncoding(max_len=4, d_model=6).apply({}, x)

  @chex.variants(with_jit=True, without_jit=True)
  def test_padding_mask(self):
    # the pad ids that end a row are padding; one among the text's ids (a literal "[PAD]") is
    # the text's, as a tokenizer's attention mask has it
    mask = self.variant(padding_mask)(jnp.array([[5, 0, 3, 0, 0], [0, 0, 0, 0, 0]]))
    chex.assert_shape(mask, (2, 1, 1, 5))
    np.testing.assert_array_equal(mask[:, 0, 0], [[True, True, True, False, False],
                                                  [False] * 5])


def _init(module, *args, **kwargs):
  return nn.unbox(module.init(jax.random.key(0), *args, **kwargs))


def test_module_shapes_and_parameter_names(tiny_config):
  cfg = tiny_config
  x = jnp.ones((2, 7, cfg.d_model))
  for module, names in [(MultiHeadAttention(cfg), {"w_q", "w_k", "w_v", "w_o"}),
                        (PositionwiseFeedForward(cfg), {"w_1", "w_2"}),
                        (EncoderLayer(cfg), {"self_attn", "feed_forward", "norm1", "norm2"})]:
    variables = _init(module, x)
    assert set(variables["params"]) == names
    chex.assert_shape(module.apply(variables, x), (2, 7, cfg.d_model))
  chex.assert_shape(_init(PositionwiseFeedForward(cfg), x)["params"]["w_1"]["kernel"],
                    (cfg.d_model, cfg.d_ff))


def test_attention_weights_are_sown(tiny_config):
  cfg = tiny_config
  tokens = jnp.array([[3, 4, 5, 0], [6, 7, 0, 0]])
  model = Encoder(cfg)
  variables = _init(model, tokens)
  _, state = model.apply(variables, tokens, mutable=["intermediates"])
  weights = state["intermediates"]["layers_1"]["self_attn"]["attention_weights"][0]
  chex.assert_shape(weights, (2, cfg.n_heads, 4, 4))
  np.testing.assert_array_equal(weights[1, :, :, 2:], 0.0)  # padding keys


def test_encoder_shapes_dtype_and_full_size_eval_shape(tiny_config):
  tokens = jnp.array([[3, 4, 5, 0], [6, 7, 0, 0]])
  model = Encoder(tiny_config)
  variables = _init(model, tokens)
  out = model.apply(variables, tokens)
  chex.assert_shape(out, (2, 4, tiny_config.d_model))
  chex.assert_type(out, jnp.float32)
  # The paper's base model, shapes only: nothing is allocated.
  base = EncoderConfig.base(32000)
  shapes = jax.eval_shape(Encoder(base).init, jax.random.key(0), jnp.ones((8, 128), jnp.int32))
  n_params = sum(x.size for x in jax.tree.leaves(shapes))
  # 32000*512 embedding + 6 layers * (4*(512*512+512) + 2*512*2048 + 2048 + 512 + 4*512) + 2*512
  assert n_params == 32000 * 512 + 6 * (4 * (512 * 512 + 512) + 2 * 512 * 2048 + 2048 + 512
                                        + 4 * 512) + 2 * 512
  out = jax.eval_shape(Encoder(base).apply, shapes, jnp.ones((8, 128), jnp.int32))
  chex.assert_shape(out, (8, 128, 512))


def test_bfloat16_compute_with_float32_params(tiny_config):
  cfg = dataclasses.replace(tiny_config, dtype="bfloat16")
  tokens = jnp.array([[3, 4, 5, 0]])
  variables = _init(Encoder(cfg), tokens)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(variables))
  out = Encoder(cfg).apply(variables, tokens)
  chex.assert_type(out, jnp.bfloat16)
  ref = Encoder(tiny_config).apply(variables, tokens)
  np.testing.assert_allclose(np.asarray(out, np.float32), ref, atol=0.1)


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_keep_mask_keeps_1_minus_rate_in_each_half_of_the_last_axis(rate):
  keep = np.asarray(keep_mask(jax.random.key(0), rate, (64, 4096)))
  sigma = math.sqrt(rate * (1 - rate) / (keep.size / 2))
  for half in (keep[:, :2048], keep[:, 2048:]):  # low and high 16 bits of the same words
    assert abs(half.mean() - (1 - rate)) < 5 * sigma
  # Independent halves: they agree about as often as two independent draws would.
  agree = (keep[:, :2048] == keep[:, 2048:]).mean()
  assert abs(agree - ((1 - rate) ** 2 + rate**2)) < 5 * sigma


@pytest.mark.parametrize("key", [jax.random.key(0), jax.random.PRNGKey(7),
                                 jax.random.fold_in(jax.random.key(3), 9),
                                 jax.random.key(5, impl="rbg")],
                         ids=["typed", "raw", "folded", "rbg"])
@pytest.mark.parametrize("shape", [(), (5,), (3, 7), (2, 3, 5, 64)])
def test_random_words_are_the_words_jax_random_bits_draws(key, shape):
  """Threefry's rounds written out (an rbg key goes to jax.random.bits), traced or not."""
  expected = np.asarray(jax.random.bits(key, shape, jnp.uint32))
  np.testing.assert_array_equal(random_words(key, shape), expected)
  np.testing.assert_array_equal(jax.jit(random_words, static_argnums=1)(key, shape), expected)


def test_random_words_lower_without_a_loop():
  """What makes them faster on the CPU, where jax lowers its own threefry to a while loop."""
  lowered = jax.jit(random_words, static_argnums=1).lower(jax.random.key(0), (8, 64))
  assert "while" not in lowered.as_text()


def test_keep_mask_falls_back_to_bernoulli_on_an_odd_last_axis():
  keep = keep_mask(jax.random.key(0), 0.25, (1000, 7))
  np.testing.assert_array_equal(keep, jax.random.bernoulli(jax.random.key(0), 0.75, (1000, 7)))


def test_dropout_scales_kept_values_and_masks_the_gradient_with_the_same_mask():
  x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 6)), jnp.float32)
  layer = Dropout(0.25)
  rngs = {"dropout": jax.random.key(1)}
  out = layer.apply({}, x, deterministic=False, rngs=rngs)
  keep = np.asarray(out) != 0
  assert 0 < keep.mean() < 1
  np.testing.assert_allclose(np.asarray(out)[keep], np.asarray(x)[keep] / 0.75, rtol=1e-6)
  np.testing.assert_array_equal(layer.apply({}, x, deterministic=True), x)
  grad = jax.grad(lambda x: jnp.sum(layer.apply({}, x, deterministic=False, rngs=rngs) * x))(x)
  np.testing.assert_allclose(grad, np.where(keep, 2 * np.asarray(x) / 0.75, 0), rtol=1e-6)
  # apply_mask's hand-written backward equals autodiff of the same expression.
  mask = jnp.asarray(keep)
  g = jax.grad(lambda x: jnp.sum(apply_mask(x, mask, 4 / 3) ** 2))(x)
  e = jax.grad(lambda x: jnp.sum(jnp.where(mask, x * (4 / 3), 0) ** 2))(x)
  np.testing.assert_allclose(g, e, rtol=1e-6)


def test_dropout_uses_the_dropout_rng(tiny_config):
  tokens = jnp.array([[3, 4, 5, 6]])
  model = Encoder(tiny_config)
  variables = _init(model, tokens)
  run = lambda seed: model.apply(variables, tokens, deterministic=False,
                                 rngs={"dropout": jax.random.key(seed)})
  np.testing.assert_array_equal(run(1), run(1))
  assert not np.allclose(run(1), run(2))
  assert not np.allclose(run(1), model.apply(variables, tokens))
  with pytest.raises(Exception, match="dropout"):
    model.apply(variables, tokens, deterministic=False)


def test_jitted_encode_does_not_retrace_for_repeated_shapes(tiny_config):
  model = Encoder(tiny_config)
  tokens = jnp.array([[3, 4, 5, 0], [6, 7, 0, 0]])
  variables = _init(model, tokens)
  chex.clear_trace_counter()

  @jax.jit
  @chex.assert_max_traces(n=1)
  def encode(variables, tokens):
    return model.apply(variables, tokens)

  for i in range(4):
    encode(variables, tokens + i)  # new values, same shape: no retrace
  with pytest.raises(AssertionError):
    encode(variables, jnp.ones((2, 5), jnp.int32))  # a new shape traces again


@pytest.mark.parametrize("impl", ["xla"])
@pytest.mark.parametrize("explicit_mask", [False, True])
def test_attention_implementations_agree(tiny_config, impl, explicit_mask):
  tokens = jnp.array([[3, 4, 5, 0, 0], [6, 7, 8, 9, 10], [0, 0, 0, 0, 0]])
  mask = None
  if explicit_mask:  # a [batch, 1, seq, seq] mask: each query sees itself and earlier keys
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((5, 5), bool)), (3, 1, 5, 5))
  reference = Encoder(tiny_config)
  variables = _init(reference, tokens)
  other = Encoder(dataclasses.replace(tiny_config, attention_impl=impl))
  expected = reference.apply(variables, tokens, mask)
  np.testing.assert_allclose(other.apply(variables, tokens, mask), expected, atol=2e-5)
  np.testing.assert_allclose(jax.jit(other.apply)(variables, tokens, mask), expected, atol=2e-5)


def test_the_xla_implementation_in_float64_is_float64(tiny_config):
  # jax.nn.dot_product_attention's XLA path takes its softmax in float32 whatever its inputs:
  # float64 models get the same maths computed in float64 instead.
  cfg = dataclasses.replace(tiny_config, dtype="float64", param_dtype="float64", dropout=0.0)
  with jax.enable_x64(True):
    tokens = jnp.array([[3, 4, 5, 0, 0], [6, 7, 8, 9, 10]])
    reference = Encoder(cfg)
    variables = _init(reference, tokens)
    xla = Encoder(dataclasses.replace(cfg, attention_impl="xla"))
    got, expected = xla.apply(variables, tokens), reference.apply(variables, tokens)
    assert got.dtype == jnp.float64
    np.testing.assert_allclose(got, expected, atol=1e-13, rtol=0)


def test_cudnn_implementation_off_gpu_raises_clearly(tiny_config):
  cfg = dataclasses.replace(tiny_config, attention_impl="cudnn", dtype="bfloat16")
  tokens = jnp.array([[3, 4, 5, 0]])
  if jax.default_backend() == "gpu":
    pytest.skip("a GPU is present; the cuDNN path is exercised by the benchmarks")
  with pytest.raises(Exception, match="(?i)cudnn|gpu|cuda"):
    Encoder(cfg).init(jax.random.key(0), tokens)


@pytest.mark.parametrize("remat", ["none", "full", "save_dots"])
def test_scanned_layers_match_unrolled_forward_and_gradient(tiny_config, remat):
  tokens = jnp.array([[3, 4, 5, 0], [6, 7, 8, 9]])
  unrolled = Encoder(tiny_config)
  variables = _init(unrolled, tokens)
  cfg = dataclasses.replace(tiny_config, scan_layers=True, remat=remat)
  scanned = Encoder(cfg)
  scanned_params = stack_layers(variables["params"], cfg.n_layers)
  chex.assert_trees_all_equal_shapes(scanned_params, _init(scanned, tokens)["params"])
  chex.assert_shape(scanned_params["layers"]["norm1"]["scale"], (2, cfg.d_model))

  def loss(model, params):
    return jnp.sum(model.apply({"params": params}, tokens) ** 2)

  np.testing.assert_allclose(scanned.apply({"params": scanned_params}, tokens),
                             unrolled.apply(variables, tokens), atol=1e-5)
  grad_unrolled = jax.grad(lambda p: loss(unrolled, p))(variables["params"])
  grad_scanned = jax.grad(lambda p: loss(scanned, p))(scanned_params)
  chex.assert_trees_all_close(unstack_layers(grad_scanned, cfg.n_layers), grad_unrolled,
                              atol=1e-4)
  chex.assert_trees_all_equal(unstack_layers(scanned_params, cfg.n_layers), variables["params"])


@pytest.mark.parametrize("uses", ["output+weights", "output", "weights"])
@pytest.mark.parametrize("rate", [0.0, 0.4])
def test_attention_backward_pass_matches_autodiff_including_the_weights_output(rate, uses):
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((2, 6, 3, 4)), jnp.float32) for _ in range(3))
  mask = jnp.asarray([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]], bool)[:, None, None, :]
  a = jnp.asarray(rng.standard_normal((2, 6, 3, 4)), jnp.float32)
  b = jnp.asarray(rng.standard_normal((2, 3, 6, 6)), jnp.float32)
  dropout_rng = jax.random.key(3)

  def autodiff(q, k, v):  # the same forward written out, differentiated by JAX
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    weights = jax.nn.softmax(jnp.where(mask, scores, MASK_FILL), axis=-1)
    dropped = weights
    if rate:
      keep = keep_mask(dropout_rng, rate, weights.shape)
      assert 0 < keep.mean() < 1
      dropped = jnp.where(keep, weights / (1 - rate), 0)
    return jnp.einsum("bhqk,bkhd->bqhd", dropped, v), weights

  def loss(attend, q, k, v):
    out, weights = attend(q, k, v)  # an unused output gets a symbolic-zero cotangent
    return (jnp.sum(out * a) if "output" in uses else 0.0) + (
        jnp.sum(weights * b) if "weights" in uses else 0.0)

  attend = lambda q, k, v: scaled_dot_product_attention(
      q, k, v, mask, dropout_rate=rate, dropout_rng=dropout_rng)
  np.testing.assert_allclose(attend(q, k, v)[0], autodiff(q, k, v)[0], atol=1e-6)
  expected = jax.grad(functools.partial(loss, autodiff), argnums=(0, 1, 2))(q, k, v)
  got = jax.grad(functools.partial(loss, attend), argnums=(0, 1, 2))(q, k, v)
  for g, e in zip(got, expected):
    np.testing.assert_allclose(g, e, atol=2e-6)



def test_a_bfloat16_lookup_sums_its_gradient_in_the_tables_float32():
  # 4096 lookups of one row, each with a cotangent of 1: a bfloat16 sum stops at 256 (257 is
  # not a bfloat16), as it did when the table was cast before the gather (nn.Embed's way); a
  # float32 sum reaches 4096. The forward values are the bfloat16 rows either way.
  from flax_encoder.encoder import Embed
  table = Embed(8, 4, dtype=jnp.bfloat16)
  ids = jnp.zeros((4, 1024), jnp.int32)
  params = table.init(jax.random.PRNGKey(0), ids)
  grad = jax.grad(lambda p: table.apply(p, ids).astype(jnp.float32).sum())(params)
  np.testing.assert_array_equal(grad["params"]["embedding"][0], 4096.0)
  np.testing.assert_array_equal(table.apply(params, ids)[0, 0],
                                params["params"]["embedding"][0].astype(jnp.bfloat16))
