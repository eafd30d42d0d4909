"""Parity with the PyTorch tutorial port (flax_encoder.pytorch.reference).

float32: max abs error <= 1e-5; float64 (jax_enable_x64, torch table in float64): <= 1e-10,
which shows the same math, not merely close math. Forward and parameter gradients, padded
batches with a different length per row, both state-dict layouts, Post-LN and Pre-LN.
"""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch bridge needs the torch extra")

from flax_encoder import (
  Encoder,
  EncoderConfig,
  EncoderLayer,
  MultiHeadAttention,
  PositionalEncoding,
  PositionwiseFeedForward,
  scaled_dot_product_attention,
)
from flax_encoder.pytorch import reference
from flax_encoder.pytorch.convert import PE_KEY, from_torch_state_dict

pytestmark = pytest.mark.library  # the library's own: run on accelerators too

TOL = {"float32": 1e-5, "float64": 1e-10}
# Row 2 has one real token, row 3 none: an all-padding row must stay finite and match.
TOKENS = np.array([[5, 9, 2, 7, 11, 3], [4, 8, 1, 0, 0, 0], [6, 0, 0, 0, 0, 0], [0] * 6])


def _config(dtype, **overrides):
  fields = dict(vocab_size=13, d_model=16, n_heads=4, d_ff=32, n_layers=2, max_len=12,
                dropout=0.0, dtype=dtype, param_dtype=dtype)
  return EncoderConfig(**{**fields, **overrides})


@pytest.fixture(params=["float32", "float64"])
def dtype(request):
  with jax.enable_x64(request.param == "float64"):
    yield request.param


def _torch_model(config, layout="tutorial"):
  torch_dtype = torch.float64 if config.dtype == np.float64 else torch.float32
  torch.manual_seed(0)
  return reference.Encoder(config, layout, table_dtype=torch_dtype).to(torch_dtype).eval()


def _variables(model, config, layout="tutorial"):
  state = {k: v for k, v in model.state_dict().items() if k != PE_KEY}
  return from_torch_state_dict(state, config, layout)


def _np(t):
  return t.detach().numpy()


def test_scaled_dot_product_attention(dtype):
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=(3, 4, 5, 8)).astype(dtype) for _ in range(3))  # [b, h, s, d]
  mask = (TOKENS[:3, :5] != 0)[:, None, None, :]
  out_t, w_t = reference.scaled_dot_product_attention(*map(torch.tensor, (q, k, v)),
                                                       torch.tensor(mask))
  to_bshd = lambda x: jnp.asarray(x.transpose(0, 2, 1, 3))
  out, w = scaled_dot_product_attention(to_bshd(q), to_bshd(k), to_bshd(v), jnp.asarray(mask))
  assert out.dtype == dtype
  np.testing.assert_allclose(np.asarray(out).transpose(0, 2, 1, 3), _np(out_t), rtol=0,
                             atol=TOL[dtype])
  np.testing.assert_allclose(w, _np(w_t), rtol=0, atol=TOL[dtype])


def test_components_with_converted_weights(dtype):
  config = _config(dtype)
  model = _torch_model(config)
  params = _variables(model, config)["params"]
  rng = np.random.default_rng(1)
  x = rng.normal(size=(4, 6, config.d_model)).astype(dtype)
  mask = (TOKENS != 0)[:, None, None, :]
  xt, mt = torch.tensor(x), torch.tensor(mask)
  layer_t, layer_p = model.layers[0], params["layers_0"]
  xj, mj = jnp.asarray(x), jnp.asarray(mask)
  cases = [
      ("self_attn", MultiHeadAttention(config).apply({"params": layer_p["self_attn"]}, xj,
                                                     mask=mj),
       layer_t.self_attn(xt, xt, xt, mt)[0]),
      ("feed_forward", PositionwiseFeedForward(config).apply(
          {"params": layer_p["feed_forward"]}, xj), layer_t.feed_forward(xt)),
      ("layer", EncoderLayer(config).apply({"params": layer_p}, xj, mj), layer_t(xt, mt)),
      ("positions", PositionalEncoding(config.max_len, config.d_model).apply({}, xj),
       model.pos_encoder(xt)),
  ]
  for name, got, expected in cases:
    chex.assert_shape(got, expected.shape)
    assert got.dtype == dtype, name
    np.testing.assert_allclose(got, _np(expected), rtol=0, atol=TOL[dtype], err_msg=name)


@pytest.mark.parametrize("layout", ["tutorial", "torch_nn"])
@pytest.mark.parametrize("norm_position, activation", [("post", "relu"), ("pre", "gelu")])
def test_encoder_forward_and_parameter_gradients(dtype, layout, norm_position, activation):
  config = _config(dtype, norm_position=norm_position, activation=activation)
  model = _torch_model(config, layout)
  variables = _variables(model, config, layout)
  # nn.MultiheadAttention adds the mask (-1e9) where the tutorial port fills it; the two agree
  # except on an all-padding row in float64, so that row is left to the tutorial layout.
  tokens = TOKENS if layout == "tutorial" else TOKENS[:3]
  cotangent = np.random.default_rng(2).normal(size=tokens.shape + (config.d_model,))
  cotangent = cotangent.astype(dtype) / cotangent.size

  out_t = model(torch.tensor(tokens))
  (out_t * torch.tensor(cotangent)).sum().backward()
  grads_t = {k: p.grad for k, p in model.named_parameters()}
  grads_t = from_torch_state_dict(grads_t, config, layout)["params"]

  def loss(params):
    out = Encoder(config).apply({"params": params}, jnp.asarray(tokens))
    return jnp.sum(out * cotangent), out

  grads, out = jax.grad(loss, has_aux=True)(variables["params"])
  assert out.dtype == dtype and bool(jnp.all(jnp.isfinite(out)))
  np.testing.assert_allclose(out, _np(out_t), rtol=0, atol=TOL[dtype])
  chex.assert_trees_all_close(grads, grads_t, rtol=0, atol=TOL[dtype])


def test_explicit_mask_of_query_by_key(dtype):
  config = _config(dtype)
  model = _torch_model(config)
  variables = _variables(model, config)
  mask = np.broadcast_to(np.tril(np.ones((6, 6), bool)), (4, 1, 6, 6)) & (TOKENS != 0)[:, None,
                                                                                       None, :]
  expected = model(torch.tensor(TOKENS), torch.tensor(mask))
  got = Encoder(config).apply(variables, jnp.asarray(TOKENS), jnp.asarray(mask))
  np.testing.assert_allclose(got, _np(expected), rtol=0, atol=TOL[dtype])


def test_parity_holds_through_the_scanned_layout():
  config = _config("float32")
  model = _torch_model(config)
  scanned = dataclasses.replace(config, scan_layers=True)
  variables = _variables(model, scanned)
  got = Encoder(scanned).apply(variables, jnp.asarray(TOKENS))
  np.testing.assert_allclose(got, _np(model(torch.tensor(TOKENS))), rtol=0, atol=TOL["float32"])
