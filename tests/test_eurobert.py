"""EuroBERT directories: a Llama-style encoder (RMSNorm before each sub-layer and at the end,
rotary positions, grouped-query attention, SwiGLU, no biases). load_hf against transformers'
EuroBertModel built from a tiny random config (float32 and float64, padded and packed rows),
the parity report, the state dict and config.json back, its untied masked-LM decoder, the
refusals; and through the program, a classify run whose export transformers loads with the
run's probabilities, a sentence-transformers folder whose vectors SentenceEncoder gives, and
further pretraining (tests/test_hf_pretrain.py)."""

import json
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax_encoder import ConfigError, Encoder, EncoderConfig  # noqa: E402
from flax_encoder.families import (HFError, bert, hf_config, load_hf,  # noqa: E402
                                   to_hf_state_dict)
from tests import hf_models, runs  # noqa: E402

pytestmark = pytest.mark.library

TOLERANCE = {"float32": 1e-5, "float64": 1e-10}
VOCAB, PAD = 99, 0
SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=40, max_position_embeddings=160,
             pad_token_id=PAD, bos_token_id=1, eos_token_id=2, mask_token_id=3,
             rope_parameters={"rope_type": "default", "rope_theta": 500.0})


def _model(path, head="base", **changes):
  """A tiny random EuroBertModel ('base') or *ForMaskedLM, every parameter moved off
  transformers' initial values, saved into `path`."""
  torch.manual_seed(0)
  config = transformers.EuroBertConfig(**{**SIZES, **changes})
  kind = {"base": transformers.AutoModel, "masked_lm": transformers.AutoModelForMaskedLM}[head]
  model = kind.from_config(config)
  with torch.no_grad():
    for param in model.parameters():
      param.add_(0.1 * torch.randn_like(param))
  model.eval().save_pretrained(path)
  return str(path)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  return _model(tmp_path_factory.mktemp("eurobert"))


def _padded(batch=3, seq=40, seed=0):
  ids = np.random.default_rng(seed).integers(4, VOCAB, (batch, seq))
  ids[1, 30:] = PAD
  ids[2, 9:] = PAD
  return ids


def _theirs(directory, precision="float32"):
  model = transformers.AutoModel.from_pretrained(directory, attn_implementation="eager")
  return model.eval().to({"float32": torch.float32, "float64": torch.float64}[precision])


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_the_encoder_computes_what_transformers_computes(base, precision):
  from flax_encoder.pytorch.hf_parity import FLOAT64
  ids = _padded()
  with torch.no_grad(), FLOAT64["eurobert"]():  # its norms, angles and softmax in float64 too
    want = _theirs(base, precision)(input_ids=torch.tensor(ids),
                                    attention_mask=torch.tensor(ids != PAD).long())[0].numpy()
  with jax.enable_x64(precision == "float64"):
    config, variables = load_hf(base, dtype=precision, param_dtype=precision)
    assert (config.kv_heads, config.norm_type, config.norm_position, config.final_norm) == (
        2, "rms", "pre", True)
    hidden = np.asarray(Encoder(config).apply(variables, ids))
    xla, _ = load_hf(base, dtype=precision, param_dtype=precision, attention_impl="xla")
    fused = np.asarray(Encoder(xla).apply(variables, ids))
  real = ids != PAD
  np.testing.assert_allclose(hidden[real], want[real], rtol=0, atol=TOLERANCE[precision])
  np.testing.assert_allclose(fused[real], hidden[real], rtol=0, atol=TOLERANCE[precision])
  layer = variables["params"]["layers_0"]
  assert layer["self_attn"]["w_k"]["kernel"].shape == (32, 16)  # 2 key heads of 8
  assert "bias" not in layer["self_attn"]["w_q"] and "bias" not in layer["norm1"]


def test_packed_rows_encode_each_sequence_as_transformers_does_alone(base):
  config, variables = load_hf(base)
  hf_models.assert_packed_rows_as_alone(_theirs(base), config, variables, 4)


def test_the_parity_report_compares_the_embeddings_every_layer_and_the_final_norm(base, capsys):
  stages = hf_models.parity_report_stages(base, capsys,
                                          ("embeddings", "layers.", "norm", "last_hidden"))
  assert stages == ["embeddings", "layers.0.self_attn", "layers.0", "layers.1.self_attn",
                    "layers.1", "norm", "last_hidden_state"]


def test_the_state_dict_and_config_are_transformers_own_and_load_back_as_they_were(base,
                                                                                  tmp_path):
  import safetensors.numpy
  config, variables = load_hf(base)
  state = to_hf_state_dict(variables, config, "eurobert")
  theirs = safetensors.numpy.load_file(os.path.join(base, "model.safetensors"))
  assert sorted(state) == sorted(theirs)
  for key, value in theirs.items():
    np.testing.assert_array_equal(state[key], value, err_msg=key)
  written = hf_config(config, "eurobert", architectures=["EuroBertModel"])
  model = _theirs(base)
  for key, value in written.items():
    if not key.endswith("token_id") and key != "architectures":
      assert getattr(model.config, key) == value, key
  out = tmp_path / "out"
  out.mkdir()
  safetensors.numpy.save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
  (out / "config.json").write_text(json.dumps(written))
  back, variables_back = load_hf(out)
  assert back == config
  assert all(jax.tree.leaves(jax.tree.map(np.array_equal, variables_back, variables)))


def test_biases_are_read_where_config_json_has_them(tmp_path):
  directory = _model(tmp_path / "biased", attention_bias=True)
  config, variables = load_hf(directory)
  assert config.unbiased == "w_1,w_2,decoder"  # lm_head's bias is mlp_bias's
  assert "bias" in variables["params"]["layers_1"]["self_attn"]["w_o"]
  ids = _padded()
  with torch.no_grad():
    want = _theirs(directory)(input_ids=torch.tensor(ids),
                              attention_mask=torch.tensor(ids != PAD).long())[0].numpy()
  real = ids != PAD
  np.testing.assert_allclose(np.asarray(Encoder(config).apply(variables, ids))[real],
                             want[real], rtol=0, atol=1e-5)


def test_the_untied_masked_lm_decoder_computes_transformers_logits_and_is_written_back(
    tmp_path):
  import safetensors.numpy

  from flax_encoder.heads import DecoderHead
  directory = _model(tmp_path / "mlm", "masked_lm")
  ids = _padded()
  with torch.no_grad():
    model = transformers.AutoModelForMaskedLM.from_pretrained(directory,
                                                              attn_implementation="eager")
    want = model.eval()(input_ids=torch.tensor(ids),
                        attention_mask=torch.tensor(ids != PAD).long()).logits.numpy()
  config, variables = load_hf(directory)
  assert "decoder" in config.unbiased  # lm_head's bias is mlp_bias's: none
  hidden = Encoder(config).apply({"params": variables["params"]}, ids)
  logits = DecoderHead(config).apply({"params": variables["heads"]["masked_lm"]}, hidden)
  real = ids != PAD
  np.testing.assert_allclose(np.asarray(logits)[real], want[real], rtol=0, atol=1e-5)
  state = to_hf_state_dict(variables, config, "eurobert", prefix="model.")
  theirs = safetensors.numpy.load_file(os.path.join(directory, "model.safetensors"))
  assert sorted(state) == sorted(theirs)  # lm_head.weight its own, not the embeddings'
  for key, value in theirs.items():
    np.testing.assert_array_equal(state[key], value, err_msg=key)


@pytest.mark.parametrize("changes, named", [
    (dict(kv_heads=3), "EncoderConfig.kv_heads: 3, expected 0 or a divisor of n_heads (4)"),
    (dict(unbiased="w_1,head"), "EncoderConfig.unbiased: 'w_1,head', expected a comma-"),
    (dict(norm_bias=True), "EncoderConfig.norm_bias: True, expected False with norm_type='rms'"),
    (dict(norm_type="batch"), "EncoderConfig.norm_type: 'batch', expected one of"),
])
def test_settings_it_cannot_compute_are_refused_naming_the_field(changes, named):
  from flax_encoder.families import eurobert
  with pytest.raises(ConfigError) as e:
    eurobert.preset(64, d_model=16, n_heads=4, d_ff=24, n_layers=2, pad_id=0, **changes)
  assert str(e.value).startswith(named)


def test_a_record_written_before_these_fields_loads_as_the_model_it_was():
  config = bert.preset(64, d_model=16, n_heads=2, d_ff=24, n_layers=2)
  record = {k: v for k, v in config.record().items()
            if k not in ("kv_heads", "norm_type", "unbiased")}
  assert EncoderConfig.from_record(record, dropout=0.1) == config


@pytest.mark.parametrize("field, value, named", [
    ("num_key_value_heads", 3, "num_key_value_heads=3"),
    ("pretraining_tp", 2, "pretraining_tp=2"),
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0},
     "rope_parameters.rope_type='llama3'"),
])
def test_a_config_json_transformers_computes_otherwise_is_refused_naming_the_field(
    base, field, value, named, tmp_path):
  import shutil
  directory = tmp_path / "m"
  shutil.copytree(base, directory)
  hf = json.loads((directory / "config.json").read_text())
  hf[field] = value
  (directory / "config.json").write_text(json.dumps(hf))
  with pytest.raises(HFError) as e:
    load_hf(directory)
  assert named in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["bos", "mean"])
def test_a_classify_run_exports_what_transformers_loads_with_the_runs_probabilities(
    pooling, tmp_path):
  from train.outputs.export import main as export
  from train.tasks.classify import Predictor
  directory = hf_models.write(tmp_path / "eurobert", "eurobert", classifier_pooling=pooling)
  train, eval_ = hf_models.labelled_pairs(tmp_path, 48, 12, (2, 6))
  workdir = str(tmp_path / "run")
  runs.train(workdir, f"--config={os.path.join(runs.ROOT, 'configs', 'classify.py')}",
             f"--config.data.train={train}", f"--config.data.eval={eval_}",
             f"--config.init.hf={directory}", "--config.train.num_steps=6",
             "--config.train.batch_size=8", "--config.train.seq_len=32",
             "--config.train.log_every=3", "--config.train.eval_every=6",
             "--config.train.checkpoint_every=6", "--config.optim.warmup_steps=2", config=None)
  out = str(tmp_path / "exported")
  assert export(["--workdir", workdir, "--layout", "hf", "--out", out]) == 0
  model = transformers.AutoModelForSequenceClassification.from_pretrained(
      out, attn_implementation="eager").eval()
  assert type(model).__name__ == "EuroBertForSequenceClassification"
  assert model.config.classifier_pooling == pooling
  rows = [json.loads(line) for line in open(eval_)][:6]
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  batch = tokenizer([r["text"] for r in rows], [r["text_pair"] for r in rows], padding=True,
                    return_token_type_ids=False, return_tensors="pt")
  with torch.no_grad():
    theirs = torch.softmax(model(**batch).logits, -1).numpy()
  ours = Predictor(workdir).probabilities([r["text"] for r in rows],
                                          [r["text_pair"] for r in rows])
  np.testing.assert_allclose(ours, theirs, atol=1e-5)


@pytest.mark.slow
def test_a_sentence_transformers_folder_gives_its_vectors(tmp_path):
  st = pytest.importorskip("sentence_transformers")
  from sentence_transformers.base.modules import Normalize, Transformer
  from sentence_transformers.sentence_transformer.modules import Pooling

  from flax_encoder.embeddings import SentenceEncoder
  encoder = hf_models.write(tmp_path / "eurobert", "eurobert", head="base")
  folder = str(tmp_path / "st")
  st.SentenceTransformer(modules=[Transformer(encoder, max_seq_length=16),
                                  Pooling(32, pooling_mode="mean"), Normalize()],
                         device="cpu").save(folder)
  texts = [" ".join(t.split()[:n]) for t in hf_models.TEXTS[:4] for n in (2, 5, 40)]
  want = st.SentenceTransformer(folder, device="cpu").encode(texts)
  np.testing.assert_allclose(SentenceEncoder.load(folder)(texts), want, rtol=0, atol=1e-5)
