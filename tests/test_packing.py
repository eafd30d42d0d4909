"""Packed rows: a sequence packed with others (segment ids, per-sequence positions) is encoded as
if it were alone, with every attention implementation that runs here, scanned or not."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_encoder import Encoder, EncoderConfig, segment_mask, segment_positions
from flax_encoder.inference import BucketedEncoder, export_encoder
from tests import runs

pytestmark = pytest.mark.library  # the library's own: run on accelerators too

# Two rows of 16: three sequences and a pad, then two sequences and three pads.
LENGTHS = [(5, 7, 3), (9, 4)]


def _packed(rng, vocab_size):
  """(tokens, segment_ids, the sequences alone) of the rows LENGTHS describes."""
  tokens, segments, alone = np.zeros((2, 16), np.int32), np.zeros((2, 16), np.int32), []
  for row, lengths in enumerate(LENGTHS):
    start = 0
    for i, n in enumerate(lengths):
      ids = rng.integers(1, vocab_size, n)
      tokens[row, start:start + n], segments[row, start:start + n] = ids, i + 1
      alone.append((row, start, ids))
      start += n
  return tokens, segments, alone


def test_segment_positions_count_from_each_sequence_start():
  segments = jnp.asarray([[1, 1, 1, 2, 2, 3, 0, 0], [4, 4, 4, 4, 4, 4, 4, 4]])
  np.testing.assert_array_equal(segment_positions(segments),
                                [[0, 1, 2, 0, 1, 0, 0, 1], [0, 1, 2, 3, 4, 5, 6, 7]])
  mask = np.asarray(segment_mask(segments))[0, 0]
  assert mask[0, :3].all() and not mask[0, 3:].any() and not mask[:, 6:].any()


@pytest.mark.parametrize("impl, dtype, scan, remat", [
    ("reference", "float32", False, "none"),
    ("xla", "float32", False, "none"),
    ("reference", "float32", True, "full"),
    ("xla", "float32", True, "save_dots"),
    ("reference", "float64", False, "none"),
    ("xla", "float64", False, "none"),
])
def test_a_packed_sequence_is_encoded_as_if_alone(impl, dtype, scan, remat):
  cfg = EncoderConfig(vocab_size=50, d_model=16, n_heads=4, d_ff=32, max_len=16, dropout=0.1,
                      n_layers=2 if dtype == "float32" else 1, attention_impl=impl, dtype=dtype,
                      param_dtype=dtype, scan_layers=scan, remat=remat)
  with jax.enable_x64(dtype == "float64"):
    tokens, segments, alone = _packed(np.random.default_rng(0), cfg.vocab_size)
    model = Encoder(cfg)
    variables = nn.unbox(model.init(jax.random.key(0), jnp.asarray(tokens)))
    # Compiled whole, as it runs: op by op, each sequence length compiled every operation anew.
    apply = jax.jit(model.apply)
    packed = apply(variables, tokens, segment_ids=segments,
                   positions=segment_positions(jnp.asarray(segments)))
    tolerance = 1e-5 if dtype == "float32" else 1e-12
    for row, start, ids in alone:
      by_itself = apply(variables, ids[None])[0]
      np.testing.assert_allclose(packed[row, start:start + len(ids)], by_itself,
                                 atol=tolerance, rtol=tolerance)
    # Without segment ids the sequences see each other: the outputs differ.
    row, start, ids = alone[1]
    crossed = np.asarray(apply(variables, tokens)[row, start:start + len(ids)])
    assert np.abs(crossed - np.asarray(apply(variables, ids[None])[0])).max() > 1e-3


def test_packing_inputs_are_checked(tiny_config):
  model = Encoder(tiny_config)
  tokens = jnp.ones((2, 8), jnp.int32)
  variables = model.init(jax.random.key(0), tokens)
  with pytest.raises(ValueError,
                     match=r"segment_ids has shape \[2, 4\], expected the tokens' "):
    model.apply(variables, tokens, segment_ids=jnp.ones((2, 4), jnp.int32))
  with pytest.raises(ValueError,
                     match=r"positions must lie in \[0, max_len=24\), got min 0, max 30"):
    model.apply(variables, tokens, positions=jnp.asarray([[0] * 7 + [30]] * 2))
  with pytest.raises(TypeError, match="positions must be an integer array"):
    model.apply(variables, tokens, positions=jnp.zeros((2, 8)))
  # Under jit the values cannot be checked: a position off either end reads NaN, not a row
  # counted back from the table's end.
  apply = jax.jit(lambda p: model.apply(variables, tokens, positions=p))
  for bad in (-1, 24):
    out = np.asarray(apply(jnp.asarray([[0] * 7 + [bad]] * 2)))
    assert np.isnan(out[:, 7]).all(), bad  # (and the rows that attend to it)


def test_bucketed_and_exported_encoders_take_packed_rows(tiny_config, tmp_path):
  cfg = dataclasses.replace(tiny_config, dropout=0.0)
  tokens, segments, alone = _packed(np.random.default_rng(1), cfg.vocab_size)
  model = Encoder(cfg)
  variables = nn.unbox(model.init(jax.random.key(0), jnp.asarray(tokens)))
  positions = np.asarray(segment_positions(jnp.asarray(segments)))
  expected = model.apply(variables, tokens, segment_ids=segments, positions=positions)
  real = segments > 0  # a padding position attends to nothing: its output means nothing
  encode = BucketedEncoder(cfg, variables, buckets=(8, 24))
  got = encode(tokens, segment_ids=segments, positions=positions)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(expected)[real], atol=2e-6)
  exported = export_encoder(cfg, variables, str(tmp_path / "packed.jaxexport"), seq_len=16,
                            packed=True)
  got = exported.call(tokens, segments, positions.astype(np.int32))
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(expected)[real], atol=2e-6)


def _implementations():
  """Every attention implementation, those that cannot run here marked to skip."""
  gpu = jax.default_backend() == "gpu"
  return ["reference", "xla", "splash", runs.triton(),
          pytest.param("cudnn", marks=pytest.mark.skipif(not gpu, reason="needs an NVIDIA GPU"))]


@pytest.mark.parametrize("impl", _implementations())
def test_no_implementation_attends_across_a_segment_boundary(impl):
  # Rows of 256 (Splash's blocks are 128) packing sequences that straddle block boundaries,
  # then padding. Changing every token outside a sequence must not change its outputs.
  from flax_encoder.kernels import interpret_kernels
  cfg = EncoderConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=256,
                      dropout=0.0, attention_impl=impl,
                      dtype="bfloat16" if impl == "cudnn" else "float32")
  rng = np.random.default_rng(0)
  segments = np.zeros((2, 256), np.int32)
  segments[0, :100], segments[0, 100:230], segments[0, 230:250] = 1, 2, 3
  segments[1, :200] = 1
  tokens = np.where(segments > 0, rng.integers(1, 50, (2, 256)), 0).astype(np.int32)
  positions = segment_positions(jnp.asarray(segments))
  model = Encoder(cfg)
  with interpret_kernels():
    variables = nn.unbox(model.init(jax.random.key(0), jnp.asarray(tokens)))
    apply = jax.jit(lambda t: model.apply(variables, t, segment_ids=segments,
                                          positions=positions))
    before = np.asarray(apply(tokens), np.float32)
    for row, segment in ((0, 2), (0, 1), (1, 1)):
      inside = segments[row] == segment
      changed = tokens.copy()
      changed[row, ~inside & (segments[row] > 0)] = rng.integers(1, 50, (~inside & (
          segments[row] > 0)).sum())
      changed[1 - row] = np.where(segments[1 - row] > 0, rng.integers(1, 50, 256), 0)
      after = np.asarray(apply(changed), np.float32)
      np.testing.assert_array_equal(after[row, inside], before[row, inside],
                                    err_msg=f"{impl}: row {row} segment {segment}")
    if impl != "reference":  # and each computes what the reference does
      reference = Encoder(dataclasses.replace(cfg, attention_impl="reference",
                                              dtype="float32"))
      expected = reference.apply(variables, tokens, segment_ids=segments, positions=positions)
      real = segments > 0
      np.testing.assert_allclose(before[real], np.asarray(expected)[real],
                                 atol=0.05 if impl == "cudnn" else 2e-5)


@pytest.mark.parametrize("impl, backend, device", [("splash", "tpu", "a TPU"),
                                                    runs.triton("triton", "gpu",
                                                                "an NVIDIA GPU")])
def test_the_pallas_kernels_refuse_what_they_cannot_do(tiny_config, impl, backend, device):
  cfg = dataclasses.replace(tiny_config, attention_impl=impl, dropout=0.0)
  tokens = jnp.ones((1, 24), jnp.int32)
  if jax.default_backend() != backend:
    with pytest.raises(ValueError, match=f"Pallas kernel for {device}.*interpret_kernels"):
      Encoder(cfg).init(jax.random.key(0), tokens)
  from flax_encoder.kernels import interpret_kernels
  with interpret_kernels(), pytest.raises(
      ValueError, match=r"multiple of 128 tokens.* \(the kernel.s blocks\), got 24"):
    Encoder(cfg).init(jax.random.key(0), tokens)
  with interpret_kernels(), pytest.raises(ValueError, match="segment ids, not by a mask"):
    Encoder(cfg).init(jax.random.key(0), tokens, jnp.ones((1, 1, 1, 24), bool))


@pytest.mark.parametrize("impl", ["splash", runs.triton()])
def test_the_pallas_kernels_train_as_the_reference_does_and_lower_for_their_device(impl):
  from flax_encoder.kernels import interpret_kernels, splash_attention, triton_attention
  cfg = EncoderConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=128,
                      dropout=0.0)
  segments = np.repeat(np.array([[1, 2, 3, 0]]), 32, axis=1)
  tokens = np.where(segments > 0, np.arange(128) % 49 + 1, 0).astype(np.int32)
  variables = nn.unbox(Encoder(cfg).init(jax.random.key(0), jnp.asarray(tokens)))

  def grads(impl):
    model = Encoder(dataclasses.replace(cfg, attention_impl=impl))
    loss = lambda v: jnp.sum(model.apply(v, tokens, segment_ids=segments)[segments > 0] ** 2)
    return jax.grad(loss)(variables)

  with interpret_kernels():
    kernel = grads(impl)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-4, rtol=1e-4),
               kernel, grads("reference"))
  # The kernel itself, lowered for its device from this machine: a Mosaic or Triton call.
  q = jax.ShapeDtypeStruct((2, 256, 2, 16), jnp.bfloat16)
  s = jax.ShapeDtypeStruct((2, 256), jnp.int32)
  function, platform, call = {"splash": (splash_attention, "tpu", "tpu_custom_call"),
                              "triton": (triton_attention, "cuda", "xla.gpu.triton")}[impl]
  try:
    lowered = jax.jit(function).trace(q, q, q, s).lower(lowering_platforms=(platform,))
  except RuntimeError as e:
    if "No supported GPU devices found" not in str(e):
      raise
    pytest.skip("this JAX lowers Triton kernels only where a GPU is (0.12 does)")
  assert call in lowered.as_text()


def test_bucketed_inference_with_a_pallas_kernel_pads_to_whole_blocks():
  from flax_encoder.kernels import interpret_kernels
  cfg = EncoderConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=256,
                      dropout=0.0, attention_impl="splash")
  tokens = np.random.default_rng(0).integers(1, 50, (2, 40)).astype(np.int32)
  tokens[1, 30:] = 0
  variables = nn.unbox(Encoder(dataclasses.replace(cfg, attention_impl="reference")).init(
      jax.random.key(0), jnp.asarray(tokens)))
  encode = BucketedEncoder(cfg, variables)
  assert encode.buckets == (128, 256)  # 16 … 64 are not whole blocks of the kernel
  with interpret_kernels():
    got = np.asarray(encode(tokens))
  expected = Encoder(dataclasses.replace(cfg, attention_impl="reference")).apply(
      variables, tokens)
  real = tokens > 0
  np.testing.assert_allclose(got[real], np.asarray(expected)[real], atol=2e-5)
  with pytest.raises(ValueError, match="multiple of 128 tokens.*got 16"):
    BucketedEncoder(cfg, variables, buckets=(16, 256))
