"""MPNet directories: BERT's encoder without token types, RoBERTa's positions from padding id 1,
and a relative position bias (T5's buckets) shared by every layer. load_hf against
transformers' MPNet built from a tiny random config (float32 and float64, padded rows longer
than the bias's 128-position reach, packed rows), its masked-LM head and pooler, the bias's
gradient, the parity report, the export back, and the refusals; and through the program,
contrastive and classifier fine-tuning whose exports sentence-transformers and transformers
load as the run's own model."""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax_encoder import ConfigError, Encoder, EncoderConfig, segment_positions  # noqa: E402
from flax_encoder import families, sharding  # noqa: E402
from flax_encoder.attention import MultiHeadAttention  # noqa: E402
from flax_encoder.families.t5_bias import relative_buckets  # noqa: E402
from flax_encoder.families import (HFError, hf_config, load_hf,  # noqa: E402
                                   to_hf_state_dict)
from flax_encoder.families.mpnet import preset as mpnet_preset  # noqa: E402
from flax_encoder.heads import MaskedLMHead, Pooler  # noqa: E402
from tests import hf_models, runs  # noqa: E402

pytestmark = pytest.mark.library

TOLERANCE = {"float32": 1e-5, "float64": 1e-10}
PAD = 1  # transformers' MPNet's padding id
VOCAB = 99
# 160 positions less the two rows before the first: rows of 140 tokens reach distances past
# 128, where the buckets end.
SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=160, layer_norm_eps=1e-5)


def _mpnet(path, head: str):
  """A tiny random MPNetModel ('base', with its pooler) or MPNetForMaskedLM ('masked_lm'),
  every parameter drawn (the bias table, LayerNorms and biases too), saved into `path`."""
  torch.manual_seed(0)
  kind = {"base": transformers.MPNetModel, "masked_lm": transformers.MPNetForMaskedLM}[head]
  model = kind(transformers.MPNetConfig(**SIZES)).eval()
  with torch.no_grad():
    for param in model.parameters():
      param.add_(0.1 * torch.randn_like(param))
  model.save_pretrained(path)
  return str(path)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  return _mpnet(tmp_path_factory.mktemp("mpnet-base"), "base")


@pytest.fixture(scope="module")
def masked_lm(tmp_path_factory):
  return _mpnet(tmp_path_factory.mktemp("mpnet-masked-lm"), "masked_lm")


def _padded(batch=3, seq=140, seed=0) -> np.ndarray:
  ids = np.random.default_rng(seed).integers(PAD + 1, VOCAB, (batch, seq))
  ids[1, 100:] = PAD
  ids[2, 9:] = PAD
  return ids


def _theirs(directory, precision="float32", head="base"):
  kind = {"base": transformers.MPNetModel, "masked_lm": transformers.MPNetForMaskedLM}[head]
  model = kind.from_pretrained(directory, attn_implementation="eager").eval()
  return model.to({"float32": torch.float32, "float64": torch.float64}[precision])


def _mask(ids):
  return torch.tensor(ids != PAD).long()


# ---------------------------------------------------------------------------------------------
# The encoder, its heads, the bias's gradient and the parity report.


def test_the_buckets_are_transformers_own_at_every_distance_and_count():
  relative = np.arange(-300, 301)
  bucket = transformers.models.mpnet.modeling_mpnet.MPNetEncoder.relative_position_bucket
  for buckets in (4, 32, 64, 510):
    theirs = bucket(torch.tensor(relative), num_buckets=buckets).numpy()
    np.testing.assert_array_equal(relative_buckets(jnp.asarray(relative), buckets), theirs)


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_the_encoder_and_pooler_compute_what_transformers_computes(base, precision):
  ids = _padded()
  with torch.no_grad():
    out = _theirs(base, precision)(input_ids=torch.tensor(ids), attention_mask=_mask(ids))
  atol = TOLERANCE[precision]
  with jax.enable_x64(precision == "float64"):
    config, variables = load_hf(base, dtype=precision, param_dtype=precision)
    assert (config.relative_attention, config.position_offset, config.pad_id,
            config.type_vocab_size, config.max_len) == ("t5_bias,buckets=32", 2, PAD, 0, 158)
    hidden = np.asarray(Encoder(config).apply({"params": variables["params"]}, ids))
    pooled = np.asarray(Pooler(config).apply({"params": variables["heads"]["pooler"]}, hidden))
    # XLA's attention takes the bias too, and computes the same model.
    xla, _ = load_hf(base, dtype=precision, param_dtype=precision, attention_impl="xla")
    fused = np.asarray(Encoder(xla).apply({"params": variables["params"]}, ids))
  assert hidden.dtype == np.dtype(precision)
  np.testing.assert_allclose(hidden, out.last_hidden_state.numpy(), rtol=0, atol=atol)
  np.testing.assert_allclose(pooled, out.pooler_output.numpy(), rtol=0, atol=atol)
  np.testing.assert_allclose(fused, hidden, rtol=0, atol=atol)
  assert set(variables["heads"]) == {"pooler"}


def test_the_masked_lm_head_computes_transformers_logits(masked_lm):
  ids = _padded()
  with torch.no_grad():
    theirs = _theirs(masked_lm, head="masked_lm")(input_ids=torch.tensor(ids),
                                                   attention_mask=_mask(ids)).logits.numpy()
  config, variables = load_hf(masked_lm)
  hidden = Encoder(config).apply({"params": variables["params"]}, ids)
  logits = MaskedLMHead(config).apply({"params": variables["heads"]["masked_lm"]}, hidden,
                                      variables["params"]["embedding"]["embedding"])
  np.testing.assert_allclose(np.asarray(logits), theirs, rtol=0, atol=1e-5)
  assert set(variables["heads"]) == {"masked_lm"}  # MPNetForMaskedLM has no pooler


def test_packed_rows_encode_each_sequence_as_transformers_does_alone(base):
  config, variables = load_hf(base)
  model = _theirs(base)
  rng = np.random.default_rng(1)
  a, b = rng.integers(PAD + 1, VOCAB, 40), rng.integers(PAD + 1, VOCAB, 30)
  row = np.full((1, 80), PAD, np.int64)
  row[0, :40], row[0, 40:70] = a, b
  segments = np.array([[1] * 40 + [2] * 30 + [0] * 10])
  packed = np.asarray(Encoder(config).apply(variables, row, segment_ids=segments,
                                            positions=np.asarray(segment_positions(segments))))
  for ids, at in ((a, slice(0, 40)), (b, slice(40, 70))):
    with torch.no_grad():
      alone = model(input_ids=torch.tensor(ids[None])).last_hidden_state.numpy()[0]
    np.testing.assert_allclose(packed[0, at], alone, rtol=0, atol=1e-5)


def test_the_bias_table_gets_the_gradient_transformers_computes(base):
  ids = _padded(seq=40)
  weights = np.random.default_rng(2).normal(size=(*ids.shape, 32))
  model = _theirs(base, "float64")
  hidden = model(input_ids=torch.tensor(ids), attention_mask=_mask(ids)).last_hidden_state
  (hidden * torch.tensor(weights)).sum().backward()
  with jax.enable_x64(True):
    config, variables = load_hf(base, dtype="float64", param_dtype="float64", dropout=0.0)
    loss = lambda params: jnp.sum(Encoder(config).apply({"params": params}, ids) * weights)
    grads = jax.grad(loss)(variables["params"])
    table = np.asarray(grads["relative_attention_bias"]["embedding"])
    query = np.asarray(grads["layers_0"]["self_attn"]["w_q"]["kernel"])
  theirs = model.encoder.relative_attention_bias.weight.grad.numpy()
  assert np.abs(theirs).max() > 1e-3  # the bias matters to the loss
  np.testing.assert_allclose(table, theirs, rtol=0, atol=1e-9)
  np.testing.assert_allclose(query, model.encoder.layer[0].attention.attn.q.weight.grad.numpy().T,
                             rtol=0, atol=1e-9)


@pytest.mark.parametrize("settings", [dict(remat="full"), dict(scan_layers=True)])
def test_remat_and_scanned_layers_give_the_same_encoder(base, settings):
  ids = _padded(seq=20)
  config, variables = load_hf(base)
  want = Encoder(config).apply(variables, ids)
  other, stacked = load_hf(base, **settings)
  np.testing.assert_allclose(Encoder(other).apply(stacked, ids), want, rtol=0, atol=1e-5)


def test_the_parity_report_compares_the_embeddings_and_every_layer(base, capsys):
  from flax_encoder.pytorch.parity import main
  for flags in ([], ["--float64"]):
    assert main(["--hf", base, *flags]) == 0
    out = capsys.readouterr().out
    stages = [line.split()[0] for line in out.splitlines()
              if line.startswith(("embeddings", "encoder.", "last_hidden"))]
    assert stages == ["embeddings", "encoder.layer.0.attention", "encoder.layer.0",
                      "encoder.layer.1.attention", "encoder.layer.1", "last_hidden_state"]
    assert "PASS" in out


def test_the_bias_table_has_logical_axes_the_rules_map(base):
  config, _ = load_hf(base)
  shapes = jax.eval_shape(Encoder(config).init, jax.random.key(0), jnp.ones((1, 4), jnp.int32))
  spec = nn.get_partition_spec(shapes)["params"]["relative_attention_bias"]["embedding"]
  assert tuple(spec) == (None, None)  # replicated, as the position table's rows
  assert nn.unbox(shapes)["params"]["relative_attention_bias"]["embedding"].shape == (32, 4)
  assert all(name is None or name in dict(sharding.RULES) for name in spec)


# ---------------------------------------------------------------------------------------------
# The export back.


@pytest.mark.parametrize("head", ["base", "masked_lm"])
def test_the_state_dict_and_config_are_transformers_own_and_load_back_as_they_were(
    head, base, masked_lm, tmp_path):
  import safetensors.numpy
  directory = {"base": base, "masked_lm": masked_lm}[head]
  model = _theirs(directory, head=head)
  config, variables = load_hf(directory)
  prefix = "" if head == "base" else "mpnet."
  state = to_hf_state_dict(variables, config, "mpnet", prefix=prefix)
  theirs = {k: v.numpy() for k, v in model.state_dict().items()}
  assert sorted(state) == sorted(theirs)
  for key, value in theirs.items():
    np.testing.assert_array_equal(state[key], value, err_msg=key)
  written = hf_config(config, "mpnet", architectures=[type(model).__name__])
  own = model.config.to_dict()
  for key, value in written.items():
    if not key.endswith("token_id"):  # the caller's to give, as ALBERT's
      assert own[key] == value, key

  out = tmp_path / "out"
  out.mkdir()
  safetensors.numpy.save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
  (out / "config.json").write_text(json.dumps(written))
  again = _theirs(out, head=head)
  assert type(again) is type(model)
  ids = _padded(seq=30)
  with torch.no_grad():
    want = model(input_ids=torch.tensor(ids), attention_mask=_mask(ids))[0].numpy()
    got = again(input_ids=torch.tensor(ids), attention_mask=_mask(ids))[0].numpy()
  np.testing.assert_array_equal(got, want)
  back, variables_back = load_hf(out)
  assert back == config
  assert jax.tree.structure(variables_back) == jax.tree.structure(variables)
  assert all(jax.tree.leaves(jax.tree.map(np.array_equal, variables_back, variables)))


def test_a_model_from_scratch_with_a_relative_bias_exports_as_mpnet():
  config = mpnet_preset(64, d_model=16, n_heads=2, d_ff=24, n_layers=2, max_len=32)
  assert families.of_architecture(config).name == "mpnet"
  assert families.config_from_hf(hf_config(config, "mpnet")) == config
  roberta = families.get("roberta").preset(64, d_model=16, n_heads=2, d_ff=24, n_layers=2,
                                           max_len=32)
  with pytest.raises(HFError, match=r"^this model is not an? mpnet model: it has .*"
                                    r"relative_attention=''"):
    hf_config(roberta, "mpnet")
  with pytest.raises(HFError, match=r"^this model is not an mpnet model: it has pad_id=0, an "
                                    r"mpnet model 1 "):
    hf_config(mpnet_preset(64, pad_id=0, d_model=16, n_heads=2), "mpnet")


# ---------------------------------------------------------------------------------------------
# What is refused, and what older records still are.


@pytest.mark.parametrize("impl, dtype, title", [
    ("cudnn", "bfloat16", "cuDNN flash attention"),
    ("splash", "float32", "TPU Splash attention"),
    runs.triton("triton", "float32", "JAX's Triton attention kernel"),
])
def test_a_kernel_that_takes_no_bias_is_refused_naming_both_fields(base, impl, dtype, title):
  with pytest.raises(ConfigError) as e:
    mpnet_preset(64, d_model=16, n_heads=2, attention_impl=impl, dtype=dtype,
                 attention_dropout=0.0)
  assert str(e.value) == (f"EncoderConfig.attention_impl: {impl!r}, expected 'xla' with "
                          f"relative_attention='t5_bias': {title} takes no bias on the "
                          f"attention scores")
  with pytest.raises(HFError) as e:
    load_hf(base, attention_impl=impl, dtype=dtype)
  assert "attention_impl" in str(e.value) and "relative_attention='t5_bias'" in str(e.value)
  assert "\n" not in str(e.value)


def test_attention_given_a_bias_its_kernel_cannot_take_is_refused():
  config = EncoderConfig(64, d_model=16, n_heads=2, attention_impl="splash")
  x = jnp.ones((1, 4, 16))
  with pytest.raises(ValueError) as e:
    MultiHeadAttention(config).init(jax.random.key(0), x, bias=jnp.zeros((1, 2, 4, 4)))
  assert str(e.value).splitlines()[0] == ("attention_impl='splash' takes no bias on the "
                                          "scores: use attention_impl='reference' or 'xla'")


@pytest.mark.parametrize("buckets", [2, 31, 512, -2, "x", ""])
def test_a_bucket_count_t5_has_no_buckets_for_is_refused(buckets):
  spec = f"t5_bias,buckets={buckets}"
  with pytest.raises(ConfigError) as e:
    mpnet_preset(64, d_model=16, n_heads=2, relative_attention=spec)
  assert e.value.field == "relative_attention" and e.value.value == spec
  assert "N even from 4 to 510" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("buckets", [2, 31, 512, -2, True])
def test_a_bucket_count_of_the_former_field_is_refused_naming_it(buckets):
  record = {**EncoderConfig(64, d_model=16, n_heads=2).record(),
            "relative_attention_buckets": buckets}
  with pytest.raises(ConfigError) as e:
    EncoderConfig.from_record(record)
  assert e.value.field == "relative_attention_buckets" and e.value.value is buckets
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("field, value, expected", [
    ("relative_attention_num_buckets", 16, "expected 32: transformers' MPNet buckets relative "
                                           "positions by 32"),
    ("pad_token_id", 0, "expected 1: transformers' MPNet counts positions from padding id 1"),
])
def test_a_config_json_transformers_computes_otherwise_is_refused_naming_the_field(
    base, field, value, expected, tmp_path):
  hf = json.load(open(os.path.join(base, "config.json")))
  (tmp_path / "config.json").write_text(json.dumps({**hf, field: value}))
  os.symlink(os.path.join(base, "model.safetensors"), tmp_path / "model.safetensors")
  with pytest.raises(HFError) as e:
    load_hf(tmp_path)
  assert f"{field}={value} is not supported ({expected}" in str(e.value)
  assert "\n" not in str(e.value)


def test_a_record_written_before_mpnet_loads_as_the_model_it_was():
  config = families.get("roberta").preset(64, d_model=16, n_heads=2, d_ff=24, n_layers=2)
  record = {k: v for k, v in config.record().items() if k != "relative_attention"}
  assert EncoderConfig.from_record(record, dropout=0.1) == config
  assert config.relative_attention == ""
  params = Encoder(config).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"]
  assert "relative_attention_bias" not in params  # and no bias parameter is made


@pytest.mark.parametrize("buckets", [0, 32])
def test_a_record_of_the_bias_as_a_field_loads_as_the_relative_attention_part(buckets):
  # Runs saved while the bias was EncoderConfig.relative_attention_buckets hold it beside an
  # empty relative_attention; their parameters are where they were.
  config = mpnet_preset(64, d_model=16, n_heads=2, d_ff=24, n_layers=2)
  if not buckets:
    config = dataclasses.replace(config, relative_attention="")
  record = {**config.record(), "relative_attention": "",
            "relative_attention_buckets": buckets}
  loaded = EncoderConfig.from_record(record, dropout=0.1)
  assert loaded == config and "relative_attention_buckets" not in loaded.record()
  assert loaded.relative_attention == ("t5_bias,buckets=32" if buckets else "")
  params = Encoder(loaded).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"]
  assert ("relative_attention_bias" in params) == bool(buckets)
  with pytest.raises(ConfigError, match="^EncoderConfig.relative_attention: .*one relative"):
    EncoderConfig.from_record({**record, "relative_attention": "disentangled",
                               "relative_attention_buckets": 32})


# ---------------------------------------------------------------------------------------------
# Through the program: fine-tuning from tests/hf_models' tiny MPNet (with its tokenizer), and
# the exports transformers and sentence-transformers load.

# Short runs: enough steps at a high rate to move the model away from where it started.
SHORT_RUN = ["--config.train.num_steps=4", "--config.train.batch_size=8",
             "--config.train.seq_len=16", "--config.train.log_every=2",
             "--config.train.eval_every=4", "--config.train.checkpoint_every=4",
             "--config.optim.warmup_steps=1", "--config.optim.learning_rate=5e-3"]


def _program(task: str, workdir, data: tuple[str, str], start: str):
  runs.train(str(workdir), f"--config={os.path.join(runs.ROOT, 'configs', task + '.py')}",
             f"--config.data.train={data[0]}", f"--config.data.eval={data[1]}",
             f"--config.init.hf={start}", *SHORT_RUN, config=None)
  return str(workdir)


def _topic_pairs(directory) -> tuple[str, str]:
  """(train.jsonl, eval.jsonl) of 16 and 8 pairs: an anchor and a positive of two to four
  words drawn from the same line of hf_models.TEXTS (digits, letters, symbols or words)."""
  rng = np.random.default_rng(0)
  topics = [line.split() for line in hf_models.TEXTS[:4]]
  text = lambda words: " ".join(rng.choice(words, rng.integers(2, 5)))

  def write(name, n):
    lines = [{"anchor": text(topics[i % 4]), "positive": text(topics[i % 4])} for i in range(n)]
    (directory / name).write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(directory / name)

  return write("train.jsonl", 16), write("eval.jsonl", 8)


def test_a_contrastive_run_from_a_sentence_transformers_mpnet_exports_its_embeddings(tmp_path):
  st = pytest.importorskip("sentence_transformers")
  from sentence_transformers.base.modules import Normalize, Transformer
  from sentence_transformers.sentence_transformer.modules import Pooling

  from train.outputs.export import main as export_main
  from train.tasks.contrastive import sentence_encoder
  mpnet = hf_models.write(tmp_path / "mpnet", "mpnet", head="base")
  start = str(tmp_path / "start")  # all-mpnet-base-v2's modules
  st.SentenceTransformer(modules=[Transformer(mpnet, max_seq_length=16),
                                  Pooling(32, pooling_mode="mean"), Normalize()],
                         device="cpu").save(start)
  pairs = _topic_pairs(tmp_path)
  workdir = _program("embed", tmp_path / "run", pairs, start)
  out = str(tmp_path / "exported")
  assert export_main(["--workdir", workdir, "--layout", "sentence-transformers",
                      "--out", out]) == 0
  assert json.load(open(os.path.join(out, "config.json")))["model_type"] == "mpnet"
  texts = [json.loads(line)[name] for line in open(pairs[1]) for name in ("anchor", "positive")]
  texts.append("the quick brown fox jumps over the lazy dog 0 1 2 3 4 5 6 7 8 9")  # cut at 16
  want = sentence_encoder(workdir)(texts)
  theirs = st.SentenceTransformer(out, device="cpu")
  assert theirs.max_seq_length == 16 < len(theirs.tokenizer(texts[-1]).input_ids)
  got = theirs.encode(texts)
  print(f"sentence-transformers against the run: {np.abs(got - want).max():.1e}")
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
  # the run's model, not the one it started from
  before = st.SentenceTransformer(start, device="cpu").encode(texts)
  assert np.abs(got - before).max() > 1e-2


def test_a_classify_run_from_mpnet_exports_what_transformers_loads_as_itself(tmp_path):
  from train.outputs.export import main as export_main
  from train.tasks.classify import Predictor
  data = hf_models.labelled_pairs(tmp_path, 24, 8, (1, 3))  # each pair fits 16 ids
  start = hf_models.write(tmp_path / "mpnet", "mpnet")  # MPNetForMaskedLM
  workdir = _program("classify", tmp_path / "run", data, start)
  out = str(tmp_path / "exported")
  assert export_main(["--workdir", workdir, "--layout", "hf", "--out", out]) == 0
  model = transformers.AutoModelForSequenceClassification.from_pretrained(
      out, attn_implementation="eager").eval()
  assert type(model).__name__ == "MPNetForSequenceClassification"
  assert model.config.id2label == {0: "digits", 1: "letters", 2: "symbols"}
  rows = [json.loads(line) for line in open(data[1])]
  texts, pairs = [r["text"] for r in rows], [r["text_pair"] for r in rows]
  batch = transformers.AutoTokenizer.from_pretrained(out)(texts, pairs, padding=True,
                                                         return_tensors="pt")
  assert batch["input_ids"].shape[1] <= 16 and (batch["input_ids"] == PAD).any()
  with torch.no_grad():
    theirs = model(**batch).logits
  probabilities, theirs = torch.softmax(theirs, -1).numpy(), theirs.numpy()
  predictor = Predictor(workdir)
  ours = predictor.probabilities(texts, pairs)
  print(f"probabilities against transformers': {np.abs(ours - probabilities).max():.1e}")
  np.testing.assert_allclose(ours, probabilities, rtol=0, atol=1e-5)
  # the logits too, of the run's parameters on transformers' ids
  from flax_encoder.classifier import SequenceClassifier
  clf = predictor.text_classifier()
  logits = SequenceClassifier(clf.config, 3, clf.pooling, clf.type_separator).apply(
      {"params": clf.params}, batch["input_ids"].numpy())
  print(f"logits against transformers': {np.abs(np.asarray(logits) - theirs).max():.1e}")
  np.testing.assert_allclose(np.asarray(logits), theirs, rtol=0, atol=1e-5)
  # the run's encoder, not the one it started from
  before = transformers.MPNetModel.from_pretrained(start).encoder.layer[0].attention.attn.q
  assert not torch.allclose(model.mpnet.encoder.layer[0].attention.attn.q.weight,
                            before.weight, atol=1e-3)


def test_a_sequence_classifier_directory_gives_the_encoder_transformers_computes(tmp_path):
  # MPNetForSequenceClassification keeps the encoder under "mpnet.", as the masked LM does
  directory = hf_models.write(tmp_path / "classifier", "mpnet", head="sequence_classification")
  model = transformers.MPNetForSequenceClassification.from_pretrained(
      directory, attn_implementation="eager").eval()
  batch = transformers.AutoTokenizer.from_pretrained(directory)(
      ["a b c", "the quick brown fox"], ["0 1", "+ - *"], padding=True, return_tensors="np")
  ids, real = batch["input_ids"], batch["attention_mask"] == 1
  with torch.no_grad():
    theirs = model.mpnet(input_ids=torch.tensor(ids),
                         attention_mask=torch.tensor(real).long()).last_hidden_state.numpy()
  config, variables = load_hf(directory)
  ours = np.asarray(Encoder(config).apply({"params": variables["params"]}, ids))
  assert not real.all()  # a padded row
  np.testing.assert_allclose(ours[real], theirs[real], rtol=0, atol=1e-5)
