"""DeBERTa v3 (and v2) directories: BERT's Post-LN encoder with disentangled attention
(flax_encoder/families/disentangled.py, registered in flax_encoder.relative). load_hf against
transformers' DebertaV2Model built from tiny random configs with v3's settings and with v2's
(float32 and float64, padded rows longer than the buckets' reach, packed rows whose segments
each equal themselves alone), the buckets, the masked-LM logits, the parity report, the state
dict and config.json back, the refusals; through the program, classify (tests/test_hf_train),
tag and regress runs and further pretraining (tests/test_hf_pretrain) whose exports
transformers loads with the run's numbers."""

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
from flax_encoder.families.disentangled import log_buckets  # noqa: E402
from flax_encoder.heads import MaskedLMHead  # noqa: E402
from tests import hf_models  # noqa: E402

pytestmark = pytest.mark.library

TOLERANCE = {"float32": 1e-5, "float64": 1e-10}
VOCAB, PAD = 99, 0
# deberta-v3's settings at tiny sizes: 16 buckets, so 60-token rows reach the log buckets
V3 = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
          intermediate_size=40, max_position_embeddings=160, relative_attention=True,
          pos_att_type=["p2c", "c2p"], position_buckets=16, max_relative_positions=64,
          share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
          type_vocab_size=0, layer_norm_eps=1e-7, pad_token_id=PAD)
# deberta-v2's: BERT's position table and token types, every distance its own, c2p only
V2 = dict(V3, position_biased_input=True, type_vocab_size=2, position_buckets=-1,
          norm_rel_ebd="none", pos_att_type=["c2p"])


def _model(path, head="base", **settings):
  torch.manual_seed(0)
  config = transformers.DebertaV2Config(**settings)
  kind = {"base": transformers.AutoModel, "masked_lm": transformers.AutoModelForMaskedLM}[head]
  model = kind.from_config(config)
  with torch.no_grad():
    for param in model.parameters():
      param.add_(0.1 * torch.randn_like(param))
  model.eval().save_pretrained(path)
  return str(path)


@pytest.fixture(scope="module", params=["v3", "v2"])
def base(request, tmp_path_factory):
  return _model(tmp_path_factory.mktemp(f"deberta-{request.param}"),
                **{"v3": V3, "v2": V2}[request.param])


def _padded(batch=3, seq=60, seed=0):
  ids = np.random.default_rng(seed).integers(4, VOCAB, (batch, seq))
  ids[1, 45:] = PAD
  ids[2, 9:] = PAD
  return ids


def _theirs(directory, precision="float32", head="base"):
  kind = {"base": transformers.AutoModel, "masked_lm": transformers.AutoModelForMaskedLM}[head]
  model = kind.from_pretrained(directory, attn_implementation="eager").eval()
  return model.to({"float32": torch.float32, "float64": torch.float64}[precision])


def test_the_buckets_are_transformers_own_at_every_distance():
  from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position
  distances = np.arange(-1100, 1101)
  for buckets, max_relative in ((16, 64), (256, 512), (32, 100), (4, 1024)):
    want = make_log_bucket_position(torch.tensor(distances), buckets, max_relative).numpy()
    np.testing.assert_array_equal(log_buckets(distances, buckets, max_relative), want)


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_the_encoder_computes_what_transformers_computes(base, precision):
  from flax_encoder.pytorch.hf_parity import FLOAT64
  ids = _padded()
  with torch.no_grad(), FLOAT64["deberta-v2"]():  # its scale in float64 too
    want = _theirs(base, precision)(input_ids=torch.tensor(ids),
                                    attention_mask=torch.tensor(ids != PAD).long())[0].numpy()
  with jax.enable_x64(precision == "float64"):
    config, variables = load_hf(base, dtype=precision, param_dtype=precision)
    assert config.relative_attention.startswith("disentangled,")
    hidden = np.asarray(Encoder(config).apply(variables, ids))
    xla, _ = load_hf(base, dtype=precision, param_dtype=precision, attention_impl="xla")
    fused = np.asarray(Encoder(xla).apply(variables, ids))
  real = ids != PAD  # transformers zeroes its padding's embeddings; no real token sees them
  np.testing.assert_allclose(hidden[real], want[real], rtol=0, atol=TOLERANCE[precision])
  np.testing.assert_allclose(fused[real], hidden[real], rtol=0, atol=TOLERANCE[precision])


def test_packed_rows_encode_each_sequence_as_transformers_does_alone(base):
  config, variables = load_hf(base)
  hf_models.assert_packed_rows_as_alone(_theirs(base), config, variables, 4, lengths=(50, 30))


def test_the_masked_lm_head_computes_transformers_logits(tmp_path):
  directory = _model(tmp_path / "mlm", "masked_lm", **V3)
  ids = _padded()
  with torch.no_grad():
    want = _theirs(directory, head="masked_lm")(
        input_ids=torch.tensor(ids), attention_mask=torch.tensor(ids != PAD).long()).logits
  config, variables = load_hf(directory)
  hidden = Encoder(config).apply({"params": variables["params"]}, ids)
  logits = MaskedLMHead(config).apply({"params": variables["heads"]["masked_lm"]}, hidden,
                                      variables["params"]["embedding"]["embedding"])
  real = ids != PAD
  np.testing.assert_allclose(np.asarray(logits)[real], want.numpy()[real], rtol=0, atol=1e-5)


def test_the_parity_report_compares_the_embeddings_and_every_layer(base, capsys):
  stages = hf_models.parity_report_stages(base, capsys, ("embeddings", "encoder.", "last_hidden"))
  assert stages == ["embeddings", "encoder.layer.0.attention", "encoder.layer.0",
                    "encoder.layer.1.attention", "encoder.layer.1", "last_hidden_state"]


def test_the_state_dict_and_config_are_transformers_own_and_load_back_as_they_were(base,
                                                                                  tmp_path):
  import safetensors.numpy
  config, variables = load_hf(base)
  state = to_hf_state_dict(variables, config, "deberta-v2")
  theirs = safetensors.numpy.load_file(os.path.join(base, "model.safetensors"))
  assert sorted(state) == sorted(theirs)
  for key, value in theirs.items():
    np.testing.assert_array_equal(state[key], value, err_msg=key)
  written = hf_config(config, "deberta-v2", architectures=["DebertaV2Model"])
  model = _theirs(base)
  for key, value in written.items():
    if key == "pos_att_type":  # a set, in any order
      assert sorted(model.config.pos_att_type) == sorted(value)
    elif key not in ("architectures", "pad_token_id"):
      assert getattr(model.config, key) == value, key
  out = tmp_path / "out"
  out.mkdir()
  safetensors.numpy.save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
  (out / "config.json").write_text(json.dumps(written))
  back, variables_back = load_hf(out)
  assert back == config
  assert all(jax.tree.leaves(jax.tree.map(np.array_equal, variables_back, variables)))


@pytest.mark.parametrize("field, value, named", [
    ("share_att_key", False, "share_att_key=False"),
    ("conv_kernel_size", 3, "conv_kernel_size=3"),
    ("relative_attention", False, "relative_attention=False"),
    ("pooler_hidden_size", 16, "pooler_hidden_size=16"),
    ("pos_att_type", ["p2p"], "pos_att_type"),
])
def test_a_config_json_transformers_computes_otherwise_is_refused_naming_the_field(
    field, value, named, tmp_path):
  directory = _model(tmp_path / "m", **V3)
  path = os.path.join(directory, "config.json")
  hf = json.load(open(path))
  hf[field] = value
  json.dump(hf, open(path, "w"))
  with pytest.raises(HFError) as e:
    load_hf(directory)
  assert named in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("spec, expected", [
    ("rotary", "one of ['disentangled', 't5_bias']"),
    ("disentangled,buckets=7", "',buckets=N' (N >= 0, even)"),
    ("disentangled,types=c2p|x2y", "',types=' some of c2p|p2c"),
    ("disentangled,colour=red", "',buckets=N'"),
])
def test_a_relative_attention_spec_it_cannot_compute_is_refused_naming_the_field(spec,
                                                                                  expected):
  with pytest.raises(ConfigError) as e:
    EncoderConfig(64, relative_attention=spec)
  assert str(e.value).startswith(f"EncoderConfig.relative_attention: {spec!r}, expected ")
  assert expected in str(e.value)


def test_a_kernel_that_takes_no_bias_and_a_second_relative_scheme_are_refused():
  with pytest.raises(ConfigError, match="^EncoderConfig.attention_impl: 'cudnn', expected .* "
                                        "with relative_attention='disentangled'"):
    EncoderConfig(64, relative_attention="disentangled", attention_impl="cudnn",
                  dtype="bfloat16")
  with pytest.raises(ConfigError, match="^EncoderConfig.relative_attention: .*one relative"):
    record = EncoderConfig(64, relative_attention="disentangled").record()
    EncoderConfig.from_record({**record, "relative_attention_buckets": 32})


def test_a_spec_is_kept_in_its_canonical_form_and_a_record_before_it_loads_as_it_was():
  config = EncoderConfig(64, relative_attention=" disentangled, types=p2c|c2p ,buckets=8")
  assert config.relative_attention == (
      "disentangled,buckets=8,max_relative=512,types=c2p|p2c,norm=layer_norm")
  old = bert.preset(64, d_model=16, n_heads=2, d_ff=24, n_layers=2)
  record = {k: v for k, v in old.record().items() if k != "relative_attention"}
  assert EncoderConfig.from_record(record, dropout=0.1) == old


@pytest.mark.slow
@pytest.mark.parametrize("task", ["tag", "regress"])
def test_tag_and_regress_runs_export_what_transformers_computes_on_their_eval(task, tmp_path):
  from tests.test_rotary_bert import tag_or_regress
  tag_or_regress("deberta-v2", task, tmp_path)


@pytest.mark.parametrize("seq", [1, 2])
def test_rows_of_one_or_two_tokens_are_transformers_own(base, seq):
  ids = np.random.default_rng(3).integers(4, VOCAB, (2, seq))
  with torch.no_grad():
    want = _theirs(base)(input_ids=torch.tensor(ids))[0].numpy()
  config, variables = load_hf(base)
  np.testing.assert_allclose(np.asarray(Encoder(config).apply(variables, ids)), want, rtol=0,
                             atol=1e-5)


TEXTS = ["Hello,  world!\tnaïve  Café", "the quick [MASK] fox", "  leading spaces", "trailing  ",
         "x\n\ny", "It's 3.14 o'clock — déjà vu", "e\u0301cole", "UNSEEN ťřž 你好"]


@pytest.mark.parametrize("options", [{}, {"do_lower_case": True, "split_by_punct": True},
                                     {"add_prefix_space": False}])
def test_a_directory_with_spm_model_alone_is_tokenized_as_transformers_tokenizes_it(
    options, tmp_path):
  """deberta-v3-base's files: spm.model and tokenizer_config.json, no tokenizer.json."""
  import io

  import sentencepiece

  from flax_encoder.hf_tokenizer import tokenizer_from_directory
  model = io.BytesIO()
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter([t for t in TEXTS for _ in range(20)]), model_writer=model,
      vocab_size=60, model_type="unigram", pad_id=0, pad_piece="[PAD]", bos_id=1,
      bos_piece="[CLS]", eos_id=2, eos_piece="[SEP]", unk_id=3, unk_piece="[UNK]",
      character_coverage=1.0, minloglevel=2)
  (tmp_path / "spm.model").write_bytes(model.getvalue())
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({
      "tokenizer_class": "DebertaV2Tokenizer", "mask_token": "[MASK]", **options}))
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  ours = tokenizer_from_directory(tmp_path)
  assert [ours.template().start, ours.template().between, ours.template().end] == [
      (1,), (2,), (2,)]
  for text in TEXTS:
    assert ours.encode_batch([text])[0].tolist() == theirs(text, add_special_tokens=False)[
        "input_ids"], text
  assert ours.vocab_size == len(theirs) == 61  # [MASK] after the model's 60 pieces
