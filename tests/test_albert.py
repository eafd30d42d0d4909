"""ALBERT directories: a factorised embedding (tables of embedding_size, normalised there and
projected to hidden_size) and one layer's parameters at every depth. load_hf against
transformers' ALBERT built from a tiny random config (float32 and float64, padded, two token
types, packed), its masked-LM head and pooler, the parity report, fine-tuning from its pooler,
further pretraining from its masked-LM head, the export back, and the refusals."""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from configs import classify as classify_config  # noqa: E402
from configs import default, tag as tag_config  # noqa: E402
from flax_encoder import ConfigError, Encoder, EncoderConfig, segment_positions  # noqa: E402
from flax_encoder import sharding  # noqa: E402
from flax_encoder.families import (HFError, albert, bert, config_from_hf,  # noqa: E402
                                   from_hf_state_dict, hf_config, load_hf, modernbert,
                                   read_hf_config, read_hf_weights)
from flax_encoder.heads import MaskedLMHead, Pooler  # noqa: E402
from tests import hf_models, runs  # noqa: E402
from train.data import prepare
from train.task import Resume  # noqa: E402
from train.tasks import classify, masked_lm, tag  # noqa: E402

TOLERANCE = {"float32": 1e-5, "float64": 1e-10}
SEQ_LEN = 24
SEP = 3  # the WordPiece tokenizer's [SEP] (tests/hf_models.py)
WORDS = "the quick brown fox jumps over the lazy dog 0123 4567 89 abcd efgh ij".split()


def _albert(path, head: str) -> str:
  """tests/hf_models.py's tiny ALBERT (3 layers of one layer's parameters, embedding_size 16,
  hidden_size 32) with its tokenizer, every parameter drawn (LayerNorms not left at 1, biases
  not at 0), saved into `path`."""
  directory = hf_models.write(path, "albert", head=head)
  auto = {"pretraining": transformers.AutoModelForPreTraining,
          "masked_lm": transformers.AutoModelForMaskedLM}[head]
  model = auto.from_pretrained(directory)
  torch.manual_seed(1)
  with torch.no_grad():
    for param in model.parameters():
      param.add_(0.1 * torch.randn_like(param))
  model.save_pretrained(directory)
  return directory


@pytest.fixture(scope="module")
def pretraining(tmp_path_factory):
  """An AlbertForPreTraining directory: the encoder, its pooler, the masked-LM head and the
  sentence-order head (which load_hf leaves out, as BERT's next-sentence head)."""
  return _albert(tmp_path_factory.mktemp("albert-pretraining"), "pretraining")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """{task: (train.jsonl, eval.jsonl)}: pairs of texts with a class each, and words with BIO
  tags."""
  directory = tmp_path_factory.mktemp("data")
  rng = np.random.default_rng(0)
  text = lambda: " ".join(rng.choice(WORDS, int(rng.integers(2, 7))))
  rows = []
  for _ in range(24):
    a, b = text(), text()
    words = f"{a} {b}".split()
    rows.append({"text": a, "text_pair": b, "label": ("short", "long")[len(a) > 14],
                 "tokens": words, "tags": ["B-X" if w == "fox" else "O" for w in words]})
  files = {}
  for task in ("classify", "tag"):
    files[task] = []
    for split, part in (("train", rows[:16]), ("eval", rows[16:])):
      path = directory / f"{task}.{split}.jsonl"
      path.write_text("".join(json.dumps(r) + "\n" for r in part))
      files[task].append(str(path))
  return files


def _padded(batch=3, seq=11, seed=0) -> np.ndarray:
  ids = np.random.default_rng(seed).integers(5, 100, (batch, seq))
  ids[0, 7:] = 0
  ids[-1, 4:] = 0
  return ids


def _types(ids: np.ndarray) -> np.ndarray:
  """Token types as a pair has them: 1 from the first [SEP] on (the second text and its [SEP]),
  0 at padding."""
  seps = np.cumsum(ids == SEP, axis=1) - (ids == SEP)
  return ((seps >= 1) & (ids != 0)).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# The encoder, its heads and the parity report.


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_the_encoder_masked_lm_head_and_pooler_compute_what_transformers_computes(
    pretraining, precision):
  dtype = {"float32": torch.float32, "float64": torch.float64}[precision]
  model = transformers.AutoModelForPreTraining.from_pretrained(
      pretraining, attn_implementation="eager").to(dtype).eval()
  ids = _padded()
  types = np.zeros_like(ids)
  types[:, 5:] = 1  # the second segment
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(ids != 0).long(),
                token_type_ids=torch.tensor(types), output_hidden_states=True)
  with jax.enable_x64(precision == "float64"):
    config, variables = load_hf(pretraining, dtype=precision, param_dtype=precision)
    assert (config.embedding_size, config.d_model, config.n_layers) == (16, 32, 3)
    assert config.shared_layers and config.activation == "gelu_tanh"  # gelu_new
    hidden = np.asarray(Encoder(config).apply({"params": variables["params"]}, ids,
                                              token_types=types))
    heads = variables["heads"]
    logits = MaskedLMHead(config).apply({"params": heads["masked_lm"]}, hidden,
                                        variables["params"]["embedding"]["embedding"])
    pooled = Pooler(config).apply({"params": heads["pooler"]}, hidden)
  assert hidden.dtype == np.dtype(precision)
  atol = TOLERANCE[precision]
  np.testing.assert_allclose(hidden, out.hidden_states[-1].numpy(), rtol=0, atol=atol)
  np.testing.assert_allclose(np.asarray(logits), out.prediction_logits.numpy(), rtol=0,
                             atol=10 * atol)
  pooled_theirs = model.albert(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(types),
                               attention_mask=torch.tensor(ids != 0).long()).pooler_output
  np.testing.assert_allclose(np.asarray(pooled), pooled_theirs.detach().numpy(), rtol=0,
                             atol=atol)
  # One layer's parameters: the run holds them once, not once per depth.
  assert "shared_layer" in variables["params"] and "layers_0" not in variables["params"]
  assert set(heads) == {"masked_lm", "pooler"}  # the sentence-order head is not read


def test_packed_rows_encode_each_sequence_as_transformers_does_alone(pretraining):
  config, variables = load_hf(pretraining)
  model = transformers.AutoModel.from_pretrained(pretraining, attn_implementation="eager").eval()
  rng = np.random.default_rng(1)
  a, b = rng.integers(5, 100, 6), rng.integers(5, 100, 4)
  row = np.zeros((1, 12), np.int64)
  row[0, :6], row[0, 6:10] = a, b
  segments = np.array([[1] * 6 + [2] * 4 + [0] * 2])
  packed = np.asarray(Encoder(config).apply(variables, row, segment_ids=segments,
                                            positions=np.asarray(segment_positions(segments))))
  for ids, at in ((a, slice(0, 6)), (b, slice(6, 10))):
    with torch.no_grad():
      alone = model(input_ids=torch.tensor(ids[None])).last_hidden_state.numpy()[0]
    np.testing.assert_allclose(packed[0, at], alone, rtol=0, atol=1e-5)


def test_remat_and_another_attention_implementation_give_the_same_encoder(pretraining):
  ids = _padded()
  config, variables = load_hf(pretraining)
  want = Encoder(config).apply(variables, ids)
  for settings in (dict(remat="full"), dict(attention_impl="xla")):
    other, _ = load_hf(pretraining, **settings)
    np.testing.assert_allclose(Encoder(other).apply(variables, ids), want, rtol=0, atol=1e-5)


def test_the_parity_report_compares_the_embeddings_their_projection_and_every_depth(
    pretraining, capsys):
  from flax_encoder.pytorch.parity import main
  for flags in ([], ["--float64"]):
    assert main(["--hf", pretraining, *flags]) == 0
    out = capsys.readouterr().out
    stages = [line.split()[0] for line in out.splitlines()
              if line.startswith(("embeddings", "encoder.", "albert_layers", "last_hidden"))]
    assert stages == ["embeddings", "encoder.embedding_hidden_mapping_in",
                      *[f"albert_layers.0[{i}]" for i in range(3)], "last_hidden_state"]
    assert "PASS" in out


def test_every_parameter_has_logical_axes_the_rules_map(pretraining):
  config, _ = load_hf(pretraining)
  encoder = jax.eval_shape(Encoder(config).init, jax.random.key(0), jnp.ones((1, 4), jnp.int32))
  head = jax.eval_shape(MaskedLMHead(config).init, jax.random.key(0),
                        jnp.ones((1, config.d_model)),
                        jnp.ones((config.vocab_size, config.embedding_size)))
  specs = jax.tree.leaves(nn.get_partition_spec({"encoder": encoder, "head": head}),
                          is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  shapes = jax.tree.leaves(nn.unbox({"encoder": encoder, "head": head}))
  rules = dict(sharding.RULES)
  assert len(specs) == len(shapes)
  for spec, shape in zip(specs, shapes):
    names = tuple(spec)
    # None: replicated (the learned positions' rows, as BERT's)
    assert len(names) == len(shape.shape) and all(n is None or n in rules for n in names), names
    named = [n for n in names if n is not None]
    assert len(set(named)) == len(named), names  # no mesh axis twice in one array
  projection = nn.get_partition_spec(encoder)["params"]["embedding_projection"]["kernel"]
  assert tuple(projection) == ("embed_factor", "embed")


# ---------------------------------------------------------------------------------------------
# What is refused, and what older records still are.


@pytest.mark.parametrize("field", ["num_hidden_groups", "inner_group_num"])
def test_more_than_one_layer_of_parameters_is_refused_naming_the_field(pretraining, field,
                                                                        tmp_path):
  hf = json.load(open(os.path.join(pretraining, "config.json")))
  (tmp_path / "config.json").write_text(json.dumps({**hf, field: 2}))
  os.symlink(os.path.join(pretraining, "model.safetensors"), tmp_path / "model.safetensors")
  with pytest.raises(HFError) as e:
    load_hf(tmp_path)
  assert f"{field}=2 is not supported (expected 1: one layer's parameters at every depth)" in (
      str(e.value)) and "\n" not in str(e.value)


def test_every_tensor_of_another_shape_is_refused_naming_it(pretraining):
  hf = read_hf_config(pretraining)
  config, state = config_from_hf(hf), read_hf_weights(pretraining)
  checked = [k for k in state if not k.startswith("sop_classifier.")]
  assert len(checked) == 30  # the embeddings at 16, the projection, one layer, the heads
  for key in checked:
    value = state[key]
    wrong = np.zeros((*value.shape[:-1], value.shape[-1] + 1), value.dtype)
    with pytest.raises(HFError) as e:
      from_hf_state_dict({**state, key: wrong}, hf, config)
    assert str(e.value) == (f"{key!r} has shape {wrong.shape}, expected {value.shape} from "
                            f"config.json")


def test_switches_that_cannot_go_together_are_refused(pretraining):
  with pytest.raises(HFError) as e:
    load_hf(pretraining, scan_layers=True)
  assert "EncoderConfig.scan_layers: True, expected False with shared_layers=True" in (
      str(e.value)) and "\n" not in str(e.value)
  with pytest.raises(ConfigError) as e:
    modernbert.preset(64, pad_id=0, shared_layers=True)
  assert e.value.field == "shared_layers" and "first_attention_norm=False" in str(e.value)
  with pytest.raises(ConfigError) as e:
    EncoderConfig(64, d_model=16, n_heads=2, embedding_size=7)  # sinusoids at width 7
  assert e.value.field == "embedding_size" and "an even number" in str(e.value)
  with pytest.raises(ConfigError, match=r"^EncoderConfig.embedding_size: -1, expected an "
                                        r"integer >= 0$"):
    EncoderConfig(64, d_model=16, n_heads=2, embedding_size=-1)


def test_a_model_another_family_cannot_hold_is_refused_naming_the_field():
  factorised = bert.preset(64, d_model=16, n_heads=2, d_ff=24, n_layers=2, embedding_size=8)
  with pytest.raises(HFError, match=r"^this model is not a bert model: it has "
                                    r"embedding_size=8, a bert model embedding_size=0$"):
    hf_config(factorised, "bert")
  unfactorised = albert.preset(64, d_model=16, n_heads=2, d_ff=24, n_layers=2,
                               embedding_size=0)
  with pytest.raises(HFError, match=r"^this model is not an albert model: it has "
                                    r"embedding_size=0, an albert model a factorised "):
    hf_config(unfactorised, "albert")


def test_the_masked_lm_head_refuses_a_table_of_another_width():
  config = albert.preset(64, d_model=16, n_heads=2, d_ff=24, n_layers=2, embedding_size=8)
  with pytest.raises(ValueError) as e:
    MaskedLMHead(config).init(jax.random.PRNGKey(0), jnp.ones((1, 16)), jnp.ones((64, 16)))
  assert str(e.value) == ("embedding: shape (64, 16), expected the encoder's table "
                          "[vocab_size, embedding_width] = [64, 8]")


def test_a_record_written_before_albert_loads_as_the_model_it_was():
  config = bert.preset(64, d_model=16, n_heads=2, d_ff=24, n_layers=2)
  record = {k: v for k, v in config.record().items()
            if k not in ("embedding_size", "shared_layers")}
  assert EncoderConfig.from_record(record, dropout=0.1) == config
  assert (config.embedding_size, config.shared_layers) == (0, False)


# ---------------------------------------------------------------------------------------------
# Fine-tuning, further pretraining and the export back.


def _finetune_config(task, data, directory):
  config = {"classify": classify_config, "tag": tag_config}[task].get_config()
  config.data.train, config.data.eval = data[task]
  config.init.hf = directory
  config.train.update(seq_len=SEQ_LEN, batch_size=8)
  return config


@pytest.mark.parametrize("task", ["classify", "tag"])
def test_fine_tuning_starts_from_the_checkpoint_and_computes_what_transformers_does(
    task, pretraining, data, tmp_path):
  setup = {"classify": classify, "tag": tag}[task].setup(
      _finetune_config(task, data, pretraining), str(tmp_path), Resume())
  model = setup.task.model
  auto = {"classify": transformers.AutoModelForSequenceClassification,
          "tag": transformers.AutoModelForTokenClassification}[task]
  theirs = auto.from_pretrained(pretraining, num_labels=model.num_labels,
                                attn_implementation="eager").eval()
  _, variables = load_hf(pretraining)
  if task == "classify":  # by the checkpoint's pooler, as AlbertForSequenceClassification
    assert model.pooling == "pooler" and set(setup.start_params) == {"encoder", "pooler"}
    np.testing.assert_array_equal(setup.start_params["pooler"]["dense"]["kernel"].T,
                                  theirs.albert.pooler.weight.detach())
  else:
    assert set(setup.start_params) == {"encoder"}
  params = nn.unbox(model.init(jax.random.PRNGKey(0), jnp.ones((1, SEQ_LEN), jnp.int32)))
  params = {**params["params"], **setup.start_params}
  with torch.no_grad():  # the classifier starts afresh on both sides: the run's in theirs
    theirs.classifier.weight.copy_(torch.tensor(np.asarray(params["classifier"]["kernel"]).T))
    theirs.classifier.bias.copy_(torch.tensor(np.asarray(params["classifier"]["bias"])))
  tokens = np.asarray(setup.eval["tokens"], np.int64)
  real = tokens != 0
  assert real.sum(1).min() < tokens.shape[1] and (tokens == SEP).sum(1).min() == (
      2 if task == "classify" else 1)
  ours = np.asarray(model.apply({"params": params}, tokens))
  with torch.no_grad():
    logits = theirs(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(real).long(),
                    token_type_ids=torch.tensor(_types(tokens))).logits.numpy()
  if task == "classify":
    np.testing.assert_allclose(jax.nn.softmax(ours), torch.softmax(torch.tensor(logits), -1),
                               rtol=0, atol=1e-5)
  else:
    np.testing.assert_allclose(ours[real], logits[real], rtol=0, atol=1e-5)


def test_further_pretraining_starts_at_the_loss_transformers_computes(tmp_path):
  directory = _albert(tmp_path / "model", "masked_lm")
  corpus = tmp_path / "corpus.jsonl"
  documents = [" ".join(WORDS[i % 7:] + WORDS[:i % 5]) for i in range(24)]
  corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
  prepared = str(tmp_path / "prepared")
  prepare.prepare([str(corpus)], prepared, directory, seq_len=32, eval_fraction=0.25,
                  workers=1, progress=False)
  config = default.get_config()
  config.init.hf, config.data.prepared = directory, prepared
  config.train.update({"seq_len": 32, "batch_size": 4})
  config.optim.label_smoothing = 0.0  # transformers' loss has none
  config.task.cross_document_attention = True  # a window as one sequence, as run_mlm.py has it
  setup = masked_lm.setup(config, str(tmp_path / "run"), Resume())
  assert setup.record["family"] == "albert"
  task = setup.task
  rows = np.asarray(setup.train[:4])
  batch = jax.jit(task.batch)(rows, jax.random.PRNGKey(3))
  ours = float(task.loss_sum(setup.start_params, batch, jax.random.PRNGKey(0)) /
               task.loss_count(batch))
  inputs = np.asarray(batch["inputs"])
  labels = np.full(inputs.shape, -100)
  for i, (at, target, weight) in enumerate(zip(*(np.asarray(batch[k]) for k in (
      "predict_at", "targets", "weights")))):
    labels[i, at[weight > 0]] = target[weight > 0]
  assert (labels != -100).sum() > 0
  model = transformers.AlbertForMaskedLM.from_pretrained(directory,
                                                        attn_implementation="eager").eval()
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(inputs), labels=torch.tensor(labels),
                   attention_mask=torch.tensor(inputs != 0).long()).loss.item()
  assert ours == pytest.approx(theirs, rel=1e-5)


def test_a_fine_tuned_run_exports_what_transformers_loads_as_itself(pretraining, data,
                                                                     tmp_path):
  train, eval_ = data["classify"]
  workdir = str(tmp_path / "run")
  runs.train(workdir, f"--config={os.path.join(runs.ROOT, 'configs', 'classify.py')}",
             f"--config.data.train={train}", f"--config.data.eval={eval_}",
             f"--config.init.hf={pretraining}", "--config.train.num_steps=2",
             "--config.train.batch_size=8", f"--config.train.seq_len={SEQ_LEN}",
             "--config.train.log_every=2", "--config.train.eval_every=2",
             "--config.train.checkpoint_every=2", "--config.optim.warmup_steps=1",
             config=None)
  from train.outputs.export import main as export
  out = str(tmp_path / "exported")
  assert export(["--workdir", workdir, "--layout", "hf", "--out", out]) == 0
  written = json.load(open(os.path.join(out, "config.json")))
  assert written["architectures"] == ["AlbertForSequenceClassification"]
  assert (written["embedding_size"], written["num_hidden_groups"]) == (16, 1)
  start = json.load(open(os.path.join(pretraining, "config.json")))
  assert (written["bos_token_id"], written["eos_token_id"]) == (start["bos_token_id"],
                                                                start["eos_token_id"])
  model = transformers.AutoModelForSequenceClassification.from_pretrained(
      out, attn_implementation="eager").eval()
  assert type(model).__name__ == "AlbertForSequenceClassification"
  assert model.config.id2label == {0: "long", 1: "short"}
  rows = [json.loads(line) for line in open(eval_)]
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  batch = tokenizer([r["text"] for r in rows], [r["text_pair"] for r in rows], padding=True,
                    return_token_type_ids=True, return_tensors="pt")
  with torch.no_grad():
    theirs = torch.softmax(model(**batch).logits, -1).numpy()
  from train.tasks.classify import Predictor
  ours = Predictor(workdir).probabilities([r["text"] for r in rows],
                                          [r["text_pair"] for r in rows])
  np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
  # It is the run's model, not the checkpoint it started from.
  again, variables = load_hf(out)
  _, before = load_hf(pretraining)
  assert again.shared_layers and not np.array_equal(
      variables["params"]["shared_layer"]["norm2"]["scale"],
      before["params"]["shared_layer"]["norm2"]["scale"])
