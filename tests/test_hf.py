"""Hugging Face BERT-family directories: load_hf against transformers' own PyTorch models (built
from tiny random configs and save_pretrained here: nothing is downloaded), every head, packed
rows, every attention implementation, the refusals, and the way back (to_hf_state_dict)."""

import json

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax_encoder import Encoder, segment_positions  # noqa: E402
from flax_encoder.kernels import interpret_kernels  # noqa: E402
from flax_encoder.families import HFError, hf_config, load_hf, to_hf_state_dict  # noqa: E402
from flax_encoder.heads import MaskedLMHead, Pooler  # noqa: E402
from tests.runs import TRITON_MISSING  # noqa: E402

pytestmark = pytest.mark.library

SIZES = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=64)


def hf_model(family: str, head: str = "masked_lm", **overrides):
  """A tiny random transformers model of `family`, eager attention, in eval mode."""
  torch.manual_seed(0)
  if family == "distilbert":
    config = transformers.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4,
                                           hidden_dim=37, max_position_embeddings=64,
                                           **overrides)
  else:
    name = {"bert": "BertConfig", "roberta": "RobertaConfig",
            "xlm-roberta": "XLMRobertaConfig"}[family]
    pad = {} if family == "bert" else {"pad_token_id": 1}
    config = getattr(transformers, name)(**{**SIZES, **pad, **overrides})
  config._attn_implementation = "eager"
  auto = {"masked_lm": transformers.AutoModelForMaskedLM, "base": transformers.AutoModel}[head]
  return auto.from_config(config).eval()


def saved(model, path, dtype=torch.float32):
  model.to(dtype).save_pretrained(path)
  return path


def padded_ids(model, batch=3, seq=11, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, model.config.vocab_size, (batch, seq))
  ids[0, 7:] = model.config.pad_token_id
  ids[-1, 4:] = model.config.pad_token_id
  return ids


def torch_run(model, ids, **kwargs):
  mask = torch.tensor(ids != model.config.pad_token_id).long()
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=mask, output_hidden_states=True,
                 **kwargs)


@pytest.fixture(scope="module", params=["float32", "float64"])
def precision(request):
  if request.param == "float64":
    with jax.enable_x64(True):
      yield request.param
  else:
    yield request.param


TOLERANCE = {"float32": 1e-5, "float64": 1e-10}


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert", "xlm-roberta"])
def test_the_encoder_and_masked_lm_head_compute_what_transformers_computes(
    family, precision, tmp_path):
  dtype = {"float32": torch.float32, "float64": torch.float64}[precision]
  model = hf_model(family)
  config, variables = load_hf(saved(model, tmp_path, dtype), dtype=precision,
                              param_dtype=precision)
  ids = padded_ids(model)
  out = torch_run(model, ids)
  hidden = np.asarray(Encoder(config).apply(variables, ids))
  assert hidden.dtype == np.dtype(precision)
  np.testing.assert_allclose(hidden, out.hidden_states[-1].numpy(), rtol=0,
                             atol=TOLERANCE[precision])
  logits = MaskedLMHead(config).apply({"params": variables["heads"]["masked_lm"]}, hidden,
                                      variables["params"]["embedding"]["embedding"])
  np.testing.assert_allclose(np.asarray(logits), out.logits.numpy(), rtol=0,
                             atol=10 * TOLERANCE[precision])


def test_token_types_and_the_pooler_are_bert_s(tmp_path):
  model = hf_model("bert", head="base")
  config, variables = load_hf(saved(model, tmp_path))
  ids = padded_ids(model)
  types = np.zeros_like(ids)
  types[:, 5:] = 1
  out = torch_run(model, ids, token_type_ids=torch.tensor(types))
  hidden = Encoder(config).apply(variables, ids, token_types=types)
  np.testing.assert_allclose(np.asarray(hidden), out.last_hidden_state.numpy(), atol=1e-5)
  assert not np.allclose(np.asarray(Encoder(config).apply(variables, ids)), hidden, atol=1e-3)
  pooled = Pooler(config).apply({"params": variables["heads"]["pooler"]}, hidden)
  np.testing.assert_allclose(np.asarray(pooled), out.pooler_output.numpy(), atol=1e-5)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_packed_rows_encode_each_sequence_as_transformers_does_alone(family, tmp_path):
  model = hf_model(family, head="base")
  config, variables = load_hf(saved(model, tmp_path))
  rng = np.random.default_rng(1)
  a, b = rng.integers(3, 99, 6), rng.integers(3, 99, 4)
  row = np.full((1, 12), model.config.pad_token_id)
  row[0, :6], row[0, 6:10] = a, b
  segments = np.array([[1] * 6 + [2] * 4 + [0] * 2])
  packed = np.asarray(Encoder(config).apply(variables, row, segment_ids=segments,
                                            positions=np.asarray(segment_positions(segments))))
  for ids, at in ((a, slice(0, 6)), (b, slice(6, 10))):
    alone = torch_run(model, ids[None]).last_hidden_state.numpy()[0]
    np.testing.assert_allclose(packed[0, at], alone, atol=1e-5)


def test_every_attention_implementation_scan_and_remat_give_the_same_encoder(tmp_path):
  model = hf_model("roberta", head="base", max_position_embeddings=160)
  directory = saved(model, tmp_path)
  ids = padded_ids(model, batch=2, seq=128)
  want = torch_run(model, ids).last_hidden_state.numpy()
  runs = [dict(attention_impl="xla"), dict(scan_layers=True, remat="full")]
  for settings in runs:
    config, variables = load_hf(directory, **settings)
    assert config.attention_dropout == (0.0 if "attention_impl" in settings else 0.1)
    got = jax.jit(Encoder(config).apply)(variables, ids)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, err_msg=str(settings))
  real = ids != model.config.pad_token_id
  with interpret_kernels():
    for impl in ("splash",) + (() if TRITON_MISSING else ("triton",)):
      config, variables = load_hf(directory, attention_impl=impl)
      got = np.asarray(Encoder(config).apply(variables, ids))
      np.testing.assert_allclose(got[real], want[real], atol=1e-5, err_msg=impl)


def test_a_bert_encoder_lowers_for_tpu_and_cuda(tmp_path):
  config, variables = load_hf(saved(hf_model("bert", head="base"), tmp_path),
                              dtype="bfloat16", attention_impl="xla")
  ids = jax.ShapeDtypeStruct((2, 16), np.int32)
  traced = jax.jit(Encoder(config, check_traced_ids=False).apply).trace(variables, ids)
  for platform in ("tpu", "cuda"):
    assert "bf16" in traced.lower(lowering_platforms=(platform,)).as_text()


def _write_config(path, **changes):
  file = path / "config.json"
  config = json.loads(file.read_text())
  config.update(changes)
  file.write_text(json.dumps(config))


@pytest.mark.parametrize("change, named", [
    (dict(model_type="gpt2"), "model_type 'gpt2'"),
    (dict(position_embedding_type="relative_key"), "position_embedding_type='relative_key'"),
    (dict(is_decoder=True), "is_decoder=True"),
    (dict(hidden_act="mish"), "hidden_act='mish'"),
    (dict(tie_word_embeddings=False), "not tied"),
    (dict(num_attention_heads=5), "n_heads"),
])
def test_what_it_would_compute_differently_is_refused_naming_it(change, named, tmp_path):
  saved(hf_model("bert"), tmp_path)
  _write_config(tmp_path, **change)
  with pytest.raises(HFError, match=named) as e:
    load_hf(tmp_path)
  assert "\n" not in str(e.value)


def test_a_directory_it_cannot_read_is_one_line(tmp_path):
  with pytest.raises(HFError, match="not a directory"):
    load_hf(tmp_path / "missing")
  with pytest.raises(HFError, match="config.json: no such file"):
    load_hf(tmp_path)
  saved(hf_model("bert"), tmp_path)
  (tmp_path / "model.safetensors").unlink()
  with pytest.raises(HFError, match="no weights"):
    load_hf(tmp_path)


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert"])
def test_the_way_back_loads_in_transformers_as_the_same_model(family, tmp_path):
  model = hf_model(family)
  config, variables = load_hf(saved(model, tmp_path / "in"))
  prefix = {"bert": "bert.", "roberta": "roberta.", "distilbert": "distilbert."}[family]
  state = to_hf_state_dict(variables, config, family, prefix=prefix)
  out = tmp_path / "out"
  out.mkdir()
  import safetensors.numpy
  decoder = [k for k in state if k.endswith("decoder.weight") or k == "vocab_projector.weight"]
  safetensors.numpy.save_file({k: v for k, v in state.items() if k not in decoder},
                              str(out / "model.safetensors"), metadata={"format": "pt"})
  (out / "config.json").write_text(json.dumps(hf_config(config, family)))
  again = transformers.AutoModelForMaskedLM.from_pretrained(out, attn_implementation="eager")
  ids = padded_ids(model)
  np.testing.assert_array_equal(torch_run(again, ids).logits.numpy(),
                                torch_run(model, ids).logits.numpy())
