"""Sliding-window attention without a [seq, seq] mask (`windowed.windowed_attention`): the
same numbers and gradients as the full-mask path, padded, packed and past the ends, in the
Encoder's local layers under attention_impl 'xla', and no [seq, seq] array in its program."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_encoder import Encoder, EncoderConfig, segment_positions
from flax_encoder.kernels import fused_attention
from flax_encoder.layer import EncoderLayer
from flax_encoder.packing import attention_ids, ids_mask
from flax_encoder.windowed import local_window, windowed_attention
from tests import runs

pytestmark = pytest.mark.library


def _inputs(rng, seq, packed):
  """Row 0 packs two sequences, a padding token inside the first and padding at the end (when
  `packed`); row 1 ends in padding longer than a window, whose queries may attend to nothing."""
  tokens = rng.integers(1, 50, (2, seq))
  tokens[0, 3] = 0
  tokens[1, seq - 9:] = 0
  segments = None
  if packed:
    segments = np.ones((2, seq), np.int32)
    segments[0, seq // 3:] = 2
    segments[0, seq - 4:] = 0
  return tokens, segments


@pytest.mark.parametrize("width,seq", [(16, 40), (16, 8), (32, 100), (7, 50), (1, 20), (2, 33)])
@pytest.mark.parametrize("packed", [False, True])
def test_the_windowed_path_computes_what_the_full_mask_does(width, seq, packed):
  rng = np.random.default_rng(seq + width)
  tokens, segments = _inputs(rng, seq, packed)
  ids = attention_ids(jnp.asarray(tokens), 0, segments)
  mask = ids_mask(ids) & local_window(seq, seq, width)
  with jax.enable_x64(True):
    q, k, v = (jnp.asarray(rng.normal(size=(2, seq, 3, 8))) for _ in range(3))
    full = lambda q, k, v: fused_attention(q, k, v, mask, "xla")
    band = lambda q, k, v: windowed_attention(q, k, v, ids, width)
    np.testing.assert_allclose(jax.jit(band)(q, k, v), jax.jit(full)(q, k, v), rtol=0,
                               atol=1e-13)
    # Gradients too, through every output (queries that attend to nothing included).
    cotangent = jnp.asarray(rng.normal(size=q.shape))
    pull = lambda f: jax.jit(lambda *qkv: jax.vjp(f, *qkv)[1](cotangent))(q, k, v)
    for got, want in zip(pull(band), pull(full)):
      np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_attention_ids_stand_for_the_padding_and_segment_masks():
  from flax_encoder.masks import padding_mask
  from flax_encoder.packing import segment_mask
  tokens, segments = _inputs(np.random.default_rng(0), 12, packed=True)
  unpacked = np.broadcast_to(padding_mask(tokens), (2, 1, 12, 12))
  np.testing.assert_array_equal(ids_mask(attention_ids(tokens, 0)), unpacked)
  # packed, segment 0 alone is padding: a pad id within a segment is its text's
  packed = segment_mask(segments)
  np.testing.assert_array_equal(ids_mask(attention_ids(tokens, 0, segments)), packed)


def _config(**changes):
  return EncoderConfig(**{**dict(
      vocab_size=50, d_model=16, n_heads=2, d_ff=24, n_layers=3, max_len=128,
      norm_position="pre", position_embedding="rotary", local_attention=8,
      global_attention_every=3, final_norm=True), **changes})


@pytest.mark.parametrize("changes", [{}, dict(scan_layers=True), dict(remat="full")],
                         ids=["layers", "scanned", "remat"])
def test_the_encoders_local_layers_under_xla_equal_the_reference(changes):
  config = _config(**changes)
  rng = np.random.default_rng(0)
  tokens, segments = _inputs(rng, 40, packed=True)
  positions = segment_positions(segments)
  variables = Encoder(config).init(jax.random.key(0), tokens)
  xla = dataclasses.replace(config, attention_impl="xla")
  for seg, pos in ((None, None), (segments, positions)):
    encode = lambda config: jax.jit(lambda v: Encoder(config).apply(
        v, tokens, segment_ids=seg, positions=pos))(variables)
    np.testing.assert_allclose(encode(xla), encode(config), rtol=0, atol=2e-5)


def _square(text, seq):
  """Whether a lowered program holds an array with two axes of `seq`."""
  return re.search(rf"\b{seq}x{seq}x", text) is not None or f"x{seq}x{seq}x" in text


def test_a_local_layer_builds_no_seq_by_seq_array_forward_or_backward():
  seq = 1024
  config = _config(attention_impl="xla", max_len=seq)
  tokens = jnp.ones((1, seq), jnp.int32)
  x = jnp.ones((1, seq, config.d_model))
  ids = attention_ids(tokens, 0)
  layer = EncoderLayer(config)
  variables = layer.init(jax.random.key(0), x, ids, True, None, False)

  def lowered(mask, is_global):
    loss = lambda v, x: layer.apply(v, x, mask, True, None, is_global).sum()
    return jax.jit(jax.grad(loss, argnums=(0, 1))).lower(variables, x).as_text()

  assert not _square(lowered(ids, False), seq)
  # The check can fail: a global layer, and a local one given a mask, hold [seq, seq] arrays.
  assert _square(lowered(ids, True), seq)
  assert _square(lowered(ids_mask(ids), False), seq)


@pytest.mark.parametrize("scan", [False, True], ids=["layers", "scanned"])
def test_splash_takes_the_window_as_its_local_mask(scan):
  # Splash (interpret mode here) skips the blocks outside the band; rows of 256 (its blocks
  # are 128), packed, with a window of 32, equal the reference at every real token.
  from flax_encoder.kernels import interpret_kernels
  config = _config(max_len=256, local_attention=32, scan_layers=scan)
  rng = np.random.default_rng(0)
  segments = np.zeros((1, 256), np.int32)
  segments[0, :150], segments[0, 150:240] = 1, 2
  tokens = np.where(segments > 0, rng.integers(1, 50, (1, 256)), 0)
  positions = segment_positions(segments)
  variables = Encoder(config).init(jax.random.key(0), tokens)
  def encode(config, v):
    return Encoder(config).apply(v, tokens, segment_ids=segments, positions=positions)

  want = jax.jit(lambda v: encode(config, v))(variables)
  with interpret_kernels():
    splash = dataclasses.replace(config, attention_impl="splash")
    got = jax.jit(lambda v: encode(splash, v))(variables)
  real = segments > 0
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], rtol=0, atol=2e-5)
  wide = jax.jit(lambda v: encode(dataclasses.replace(config, local_attention=1024), v))(
      variables)  # a window in name only
  assert np.abs(np.asarray(wide) - np.asarray(want))[real].max() > 1e-3


@runs.NEEDS_TRITON
def test_triton_with_a_window_is_refused_naming_what_takes_one():
  from flax_encoder.config import ConfigError
  with pytest.raises(ConfigError, match="attention_impl.*'xla' or 'cudnn'.*takes no window"):
    _config(attention_impl="triton")


def test_an_exported_encoder_with_local_layers_takes_any_batch(tmp_path):
  from flax_encoder.inference import export_encoder
  config = _config(attention_impl="xla")
  variables = Encoder(config).init(jax.random.key(0), np.ones((1, 8), np.int32))
  export_encoder(config, variables, str(tmp_path / "e.jaxexport"), seq_len=64)
  exported = jax.export.deserialize((tmp_path / "e.jaxexport").read_bytes())
  tokens, _ = _inputs(np.random.default_rng(0), 64, packed=False)
  encode = jax.jit(Encoder(config).apply)
  for batch in (1, 2):
    np.testing.assert_allclose(exported.call(tokens[:batch].astype(np.int32)),
                               encode(variables, tokens[:batch]), atol=2e-5)
