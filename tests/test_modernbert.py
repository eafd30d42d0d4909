"""ModernBERT directories: load_hf against transformers' ModernBERT built from a tiny random
config (rotary positions of two bases, GeGLU, no biases, Pre-LN without the first layer's
attention norm, global attention every third layer and a sliding window in the others), in
float32 and float64, padded, longer than the window, packed; and the refusals."""

import json

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax_encoder import Encoder, segment_positions  # noqa: E402
from flax_encoder.families import HFError, load_hf  # noqa: E402
from flax_encoder.heads import MaskedLMHead  # noqa: E402

pytestmark = pytest.mark.library

WINDOW = 16  # local_attention: a token sees 8 positions either way in the local layers


def modernbert(path, dtype=torch.float32, **overrides):
  """A tiny random ModernBertForMaskedLM (LayerNorm weights drawn too, not left at 1), eager
  attention, saved into `path`; returns it in eval mode."""
  torch.manual_seed(0)
  sizes = dict(vocab_size=99, hidden_size=32, intermediate_size=40, num_hidden_layers=4,
               num_attention_heads=4, max_position_embeddings=256, local_attention=WINDOW,
               global_attn_every_n_layers=3, pad_token_id=0, bos_token_id=1, eos_token_id=2,
               cls_token_id=1, sep_token_id=2)
  config = transformers.ModernBertConfig(**{**sizes, **overrides})
  config._attn_implementation = "eager"
  model = transformers.ModernBertForMaskedLM(config).eval()
  with torch.no_grad():
    for name, param in model.named_parameters():
      if "norm" in name:
        param.add_(0.1 * torch.randn_like(param))
  model.to(dtype).save_pretrained(path)
  return model.to(dtype)


@pytest.fixture
def float64_rotary():
  """transformers' ModernBERT in float64 throughout (`modernbert_float64.modernbert_in_float64`)."""
  from flax_encoder.pytorch.modernbert_float64 import modernbert_in_float64
  with modernbert_in_float64():
    yield


def run(model, ids):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(ids != 0).long(),
                 output_hidden_states=True)


def padded_ids(batch=2, seq=40, seed=0, padding=9):
  ids = np.random.default_rng(seed).integers(3, 99, (batch, seq))
  ids[-1, seq - padding:] = 0
  return ids


def test_float32_equals_transformers_padded_and_past_the_window(tmp_path):
  model = modernbert(tmp_path)
  ids = padded_ids()
  out = run(model, ids)
  config, variables = load_hf(tmp_path)
  assert config.local_attention == WINDOW and [config.is_global(i) for i in range(4)] == [
      True, False, False, True]
  hidden = np.asarray(Encoder(config).apply(variables, ids))
  np.testing.assert_allclose(hidden, out.hidden_states[-1].numpy(), rtol=0, atol=1e-5)
  logits = MaskedLMHead(config).apply({"params": variables["heads"]["masked_lm"]}, hidden,
                                      variables["params"]["embedding"]["embedding"])
  np.testing.assert_allclose(np.asarray(logits), out.logits.numpy(), rtol=0, atol=1e-5)
  # The window matters: without it the local layers see everything, and the output differs.
  import dataclasses
  whole = dataclasses.replace(config, local_attention=0)
  assert np.abs(np.asarray(Encoder(whole).apply(variables, ids)) - hidden).max() > 1e-3
  for settings in (dict(attention_impl="xla"), dict(remat="full")):
    config, variables = load_hf(tmp_path, **settings)
    got = jax.jit(Encoder(config).apply)(variables, ids)
    np.testing.assert_allclose(np.asarray(got), hidden, rtol=0, atol=1e-5, err_msg=str(settings))


def test_float64_equals_transformers_to_1e_10(tmp_path, float64_rotary):
  model = modernbert(tmp_path, torch.float64)
  # Less padding than half the window: in transformers' float64 a padding token whose window
  # holds only padding is NaN, and its mask (scores + the dtype's minimum) carries the NaN
  # into every token whose window holds it.
  ids = padded_ids(seq=64, padding=6)
  out = run(model, ids)
  with jax.enable_x64(True):
    config, variables = load_hf(tmp_path, dtype="float64", param_dtype="float64")
    hidden = np.asarray(Encoder(config).apply(variables, ids))
  assert hidden.dtype == np.float64
  np.testing.assert_allclose(hidden, out.hidden_states[-1].numpy(), rtol=0, atol=1e-10)


def test_packed_rows_encode_each_sequence_as_transformers_does_alone(tmp_path):
  model = modernbert(tmp_path)
  config, variables = load_hf(tmp_path)
  rng = np.random.default_rng(1)
  a, b = rng.integers(3, 99, 30), rng.integers(3, 99, 20)
  row = np.zeros((1, 56), np.int64)
  row[0, :30], row[0, 30:50] = a, b
  segments = np.array([[1] * 30 + [2] * 20 + [0] * 6])
  packed = np.asarray(Encoder(config).apply(variables, row, segment_ids=segments,
                                            positions=np.asarray(segment_positions(segments))))
  for ids, at in ((a, slice(0, 30)), (b, slice(30, 50))):
    alone = run(model, ids[None]).hidden_states[-1].numpy()[0]
    np.testing.assert_allclose(packed[0, at], alone, rtol=0, atol=1e-5)


def test_a_modernbert_encoder_lowers_for_tpu_and_cuda(tmp_path):
  modernbert(tmp_path)
  config, variables = load_hf(tmp_path, dtype="bfloat16", attention_impl="xla")
  ids = jax.ShapeDtypeStruct((2, 32), np.int32)
  traced = jax.jit(Encoder(config, check_traced_ids=False).apply).trace(variables, ids)
  for platform in ("tpu", "cuda"):
    assert "bf16" in traced.lower(lowering_platforms=(platform,)).as_text()


@pytest.mark.parametrize("change, named", [
    (dict(layer_types=["full_attention"] * 4), "layer_types="),
    (dict(rope_parameters={"full_attention": {"rope_type": "linear", "rope_theta": 1.0,
                                              "factor": 2.0},
                           "sliding_attention": {"rope_type": "default", "rope_theta": 1.0}}),
     "rope_type='linear'"),
    (dict(mlp_bias=True), "mlp_bias=True"),
    (dict(classifier_activation="silu"), "classifier_activation='silu'"),
    (dict(decoder_bias=False), "decoder_bias=False"),
])
def test_what_it_would_compute_differently_is_refused_naming_it(change, named, tmp_path):
  modernbert(tmp_path)
  file = tmp_path / "config.json"
  file.write_text(json.dumps({**json.loads(file.read_text()), **change}))
  with pytest.raises(HFError, match=named) as e:
    load_hf(tmp_path)
  assert "\n" not in str(e.value)


def test_scanned_layers_are_refused_for_a_first_layer_without_its_norm(tmp_path):
  modernbert(tmp_path)
  config, variables = load_hf(tmp_path)
  import dataclasses
  with pytest.raises(ValueError, match="first_attention_norm=False makes layer 0 unlike"):
    Encoder(dataclasses.replace(config, scan_layers=True)).init(
        jax.random.PRNGKey(0), np.ones((1, 8), np.int32))


def test_the_parity_report_compares_every_layer_and_the_final_norm(tmp_path, capsys):
  from flax_encoder.pytorch.parity import main
  modernbert(tmp_path)
  assert main(["--hf", str(tmp_path)]) == 0
  out = capsys.readouterr().out
  stages = [line.split()[0] for line in out.splitlines() if line.startswith(("embeddings",
                                                                             "layers", "final"))]
  assert stages == ["embeddings", *[f"layers.{i}{part}" for i in range(4)
                                    for part in (".attn", "")], "final_norm"]
  assert "PASS" in out
  assert main(["--hf", str(tmp_path), "--float64"]) == 0
  assert "PASS" in capsys.readouterr().out
