"""NomicBERT, GTE and Jina v3 directories: BERT's Post-LN encoder with rotary positions (and,
NomicBERT's and GTE's, a gated feed-forward layer and biases of their own). load_hf against
transformers' NomicBertModel, GteModel and JinaEmbeddingsV3Model built from tiny random
configs (float32 and float64, padded and packed rows), their
masked-LM heads and poolers, the parity report, the state dict and config.json back, the
refusals; and through the program, fine-tuning, further pretraining and exports transformers
loads as the run's own model."""

import json
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax_encoder import Encoder  # noqa: E402
from flax_encoder import families  # noqa: E402
from flax_encoder.families import HFError, hf_config, load_hf, to_hf_state_dict  # noqa: E402
from flax_encoder.heads import MaskedLMHead, Pooler  # noqa: E402
from tests import hf_models, runs  # noqa: E402

pytestmark = pytest.mark.library

TOLERANCE = {"float32": 1e-5, "float64": 1e-10}
VOCAB = 99
FAMILIES = ("nomic_bert", "gte", "jina_embeddings_v3")
CONFIGS = {"nomic_bert": "NomicBertConfig", "gte": "GteConfig",
           "jina_embeddings_v3": "JinaEmbeddingsV3Config"}
# type_vocab_size 2 for both, so token types are read and written too.
SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=40, max_position_embeddings=160, type_vocab_size=2,
             pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
PAD = 0


def _model(path, family: str, head: str, **changes):
  """A tiny random model of `family` ('base' with its pooler, 'masked_lm' or
  'sequence_classification'), every parameter moved off transformers' initial values (the
  LayerNorms and biases too), saved into `path`."""
  torch.manual_seed(0)
  config = getattr(transformers, CONFIGS[family])(**{**SIZES, **changes})
  if head == "base":
    model = transformers.AutoModel.from_config(config, add_pooling_layer=True)
  else:
    model = {"masked_lm": transformers.AutoModelForMaskedLM,
             "sequence_classification": transformers.AutoModelForSequenceClassification}[
                 head].from_config(config)
  with torch.no_grad():
    for param in model.parameters():
      param.add_(0.1 * torch.randn_like(param))
  model.eval().save_pretrained(path)
  return str(path)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
  return request.param


@pytest.fixture(scope="module")
def base(family, tmp_path_factory):
  return _model(tmp_path_factory.mktemp(f"{family}-base"), family, "base")


@pytest.fixture(scope="module")
def masked_lm(family, tmp_path_factory):
  return _model(tmp_path_factory.mktemp(f"{family}-masked-lm"), family, "masked_lm")


def _padded(batch=3, seq=40, seed=0):
  ids = np.random.default_rng(seed).integers(PAD + 1, VOCAB, (batch, seq))
  ids[1, 30:] = PAD
  ids[2, 9:] = PAD
  types = np.zeros_like(ids)
  types[0, 20:] = 1
  return ids, types


def _theirs(directory, precision="float32", head="base"):
  if head == "base":
    model = transformers.AutoModel.from_pretrained(directory, attn_implementation="eager",
                                                   add_pooling_layer=True)
  else:
    model = transformers.AutoModelForMaskedLM.from_pretrained(directory,
                                                              attn_implementation="eager")
  model.eval()
  return model.to({"float32": torch.float32, "float64": torch.float64}[precision])


def _mask(ids):
  return torch.tensor(ids != PAD).long()


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_the_encoder_and_pooler_compute_what_transformers_computes(base, family, precision):
  from flax_encoder.pytorch.hf_parity import FLOAT64
  ids, types = _padded()
  with torch.no_grad(), FLOAT64[family]():  # transformers' angles in float64 too
    out = _theirs(base, precision)(input_ids=torch.tensor(ids), attention_mask=_mask(ids),
                                   token_type_ids=torch.tensor(types))
  with jax.enable_x64(precision == "float64"):
    config, variables = load_hf(base, dtype=precision, param_dtype=precision)
    assert (config.position_embedding, config.rope_theta, config.glu) == (
        "rotary", 500.0, family != "jina_embeddings_v3")
    hidden = np.asarray(Encoder(config).apply({"params": variables["params"]}, ids,
                                              token_types=types))
    pooled = np.asarray(Pooler(config).apply({"params": variables["heads"]["pooler"]}, hidden))
    xla, _ = load_hf(base, dtype=precision, param_dtype=precision, attention_impl="xla")
    fused = np.asarray(Encoder(xla).apply({"params": variables["params"]}, ids,
                                          token_types=types))
  real = ids != PAD  # transformers' padded positions are not compared by any user
  atol = TOLERANCE[precision]
  np.testing.assert_allclose(hidden[real], out.last_hidden_state.numpy()[real], rtol=0,
                             atol=atol)
  np.testing.assert_allclose(pooled, out.pooler_output.numpy(), rtol=0, atol=atol)
  np.testing.assert_allclose(fused[real], hidden[real], rtol=0, atol=atol)


def test_the_biases_are_the_familys(base, family):
  _, variables = load_hf(base)
  layer = variables["params"]["layers_0"]
  biased = {name for block in ("self_attn", "feed_forward") for name in layer[block]
            if "bias" in layer[block][name]}
  assert biased == {"nomic_bert": set(), "gte": {"w_q", "w_k", "w_v", "w_o", "w_2"},
                    "jina_embeddings_v3": {"w_q", "w_k", "w_v", "w_o", "w_1", "w_2"}}[family]
  assert "bias" in variables["heads"]["pooler"]["dense"]


def test_the_masked_lm_head_computes_transformers_logits(masked_lm):
  ids, types = _padded()
  with torch.no_grad():
    theirs = _theirs(masked_lm, head="masked_lm")(
        input_ids=torch.tensor(ids), attention_mask=_mask(ids),
        token_type_ids=torch.tensor(types)).logits.numpy()
  config, variables = load_hf(masked_lm)
  hidden = Encoder(config).apply({"params": variables["params"]}, ids, token_types=types)
  logits = MaskedLMHead(config).apply({"params": variables["heads"]["masked_lm"]}, hidden,
                                      variables["params"]["embedding"]["embedding"])
  real = ids != PAD
  np.testing.assert_allclose(np.asarray(logits)[real], theirs[real], rtol=0, atol=1e-5)


def test_packed_rows_encode_each_sequence_as_transformers_does_alone(base):
  config, variables = load_hf(base)
  hf_models.assert_packed_rows_as_alone(_theirs(base), config, variables, PAD + 1)


def test_the_parity_report_compares_the_embeddings_and_every_layer(base, capsys):
  stages = hf_models.parity_report_stages(base, capsys, ("embeddings", "layers.", "last_hidden"))
  assert stages == ["embeddings", "layers.0.self_attn", "layers.0", "layers.1.self_attn",
                    "layers.1", "last_hidden_state"]


@pytest.mark.parametrize("head", ["base", "masked_lm"])
def test_the_state_dict_and_config_are_transformers_own_and_load_back_as_they_were(
    head, base, masked_lm, family, tmp_path):
  import safetensors.numpy
  directory = {"base": base, "masked_lm": masked_lm}[head]
  model = _theirs(directory, head=head)
  config, variables = load_hf(directory)
  prefix = "" if head == "base" else families.get(family).prefix
  state = to_hf_state_dict(variables, config, family, prefix=prefix)
  # What transformers 5 saves: the published checkpoints' names, not its modules' own.
  theirs = safetensors.numpy.load_file(os.path.join(directory, "model.safetensors"))
  tied = set() if head == "base" else {
      "nomic_bert": {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"},
      "gte": {"lm_head.decoder.weight"}, "jina_embeddings_v3": {"lm_head.decoder.weight"}}[family]
  assert set(state) == set(theirs) | tied  # the tied decoder written too, as for BERT
  for key in tied:
    np.testing.assert_array_equal(state[key], state[{
        "cls.predictions.decoder.weight": prefix + "embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
        "lm_head.decoder.weight": prefix + "embeddings.word_embeddings.weight"}[key]])
  for key, value in theirs.items():
    np.testing.assert_array_equal(state[key], value, err_msg=key)
  written = hf_config(config, family, architectures=[type(model).__name__])
  for key, value in written.items():
    if not key.endswith("token_id"):
      assert getattr(model.config, key) == value, key

  out = tmp_path / "out"
  out.mkdir()
  safetensors.numpy.save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
  (out / "config.json").write_text(json.dumps(written))
  again = _theirs(out, head=head)
  ids, _ = _padded(seq=30)
  with torch.no_grad():
    want = model(input_ids=torch.tensor(ids), attention_mask=_mask(ids))[0].numpy()
    got = again(input_ids=torch.tensor(ids), attention_mask=_mask(ids))[0].numpy()
  np.testing.assert_array_equal(got, want)
  back, variables_back = load_hf(out)
  assert back == config
  assert all(jax.tree.leaves(jax.tree.map(np.array_equal, variables_back, variables)))


@pytest.mark.parametrize("family, field, value, named", [
    ("nomic_bert", "rope_parameters", {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e3},
     "rope_parameters.rope_type='linear'"),
    ("nomic_bert", "head_dim", 16, "head_dim=16"),
    ("gte", "hidden_act", "silu", "hidden_act='silu'"),
    ("jina_embeddings_v3", "hidden_act", "relu", "hidden_act='relu'"),
    ("gte", "rope_parameters", {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
     "rope_parameters.rope_type='dynamic'"),
])
def test_a_config_json_transformers_computes_otherwise_is_refused_naming_the_field(
    family, field, value, named, tmp_path):
  directory = _model(tmp_path / "m", family, "base")
  path = os.path.join(directory, "config.json")
  hf = json.load(open(path))
  hf[field] = value
  json.dump(hf, open(path, "w"))
  with pytest.raises(HFError) as e:
    load_hf(directory)
  assert named in str(e.value) and "\n" not in str(e.value)


def test_weights_holding_jina_v3s_task_adapters_are_refused_naming_one(tmp_path):
  import safetensors.numpy
  directory = _model(tmp_path / "m", "jina_embeddings_v3", "base")
  path = os.path.join(directory, "model.safetensors")
  state = safetensors.numpy.load_file(path)
  adapter = "encoder.layers.0.mixer.Wqkv.parametrizations.weight.0.lora_A"
  state[adapter] = np.zeros((5, 4, 32), np.float32)  # one low-rank pair per task
  safetensors.numpy.save_file(state, path, metadata={"format": "pt"})
  with pytest.raises(HFError, match=f"the weights hold '{adapter}', which transformers' Jina "
                                    f"embeddings v3 model has not") as e:
    load_hf(directory)
  assert "\n" not in str(e.value)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["tag", "regress"])
@pytest.mark.parametrize("family", FAMILIES)
def test_tag_and_regress_runs_export_what_transformers_computes_on_their_eval(family, task,
                                                                               tmp_path):
  """Classification runs: tests/test_hf_train.py; further pretraining: test_hf_pretrain.py."""
  tag_or_regress(family, task, tmp_path)


def tag_or_regress(family, task, tmp_path):
  """A tag or regress run from a tiny `family` directory (tests/hf_models), exported: its
  model on transformers' ids gives transformers' logits, its held-out loss transformers'."""
  from tests import test_heads as heads
  from train.outputs.export import main as export
  rng = np.random.default_rng(0)
  make = {"tag": heads._tagged, "regress": heads._scored}[task]
  files = {task: tuple(heads._write(tmp_path / f"{split}.jsonl", make(rng, n))
                       for split, n in (("train", 48), ("eval", 16)))}
  directory = hf_models.write(tmp_path / family, family)
  workdir = str(tmp_path / "run")
  runs.train(workdir, *heads._args(task, files, f"--config.init.hf={directory}"), config=None)
  final = [r for r in runs.read_metrics(os.path.join(workdir, "metrics.jsonl"))
           if r["split"] == "eval"][-1]
  out = str(tmp_path / "exported")
  assert export(["--workdir", workdir, "--layout", "hf", "--out", out]) == 0
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  rows = [json.loads(line) for line in open(files[task][1])]
  if task == "tag":
    model = transformers.AutoModelForTokenClassification.from_pretrained(out).eval()
    batch = tokenizer([r["tokens"] for r in rows], is_split_into_words=True, padding=True,
                      return_tensors="pt")
    labels = torch.full(batch["input_ids"].shape, -100)
    for i, row in enumerate(rows):  # each word's tag at its first id
      for w in range(len(row["tokens"])):
        labels[i, batch.word_ids(i).index(w)] = model.config.label2id[row["tags"][w]]
  else:
    model = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    batch = tokenizer([r["text"] for r in rows], [r["text_pair"] for r in rows], padding=True,
                      return_token_type_ids=True, return_tensors="pt")
    labels = torch.tensor([r["label"] for r in rows])
  assert type(model).__name__.startswith(families.get(family).stem)
  with torch.no_grad():
    theirs = model(**batch, labels=labels)
  if task == "tag":  # the run's model on transformers' ids gives transformers' logits
    from train.tasks.tag import Tagger
    ours = Tagger(workdir)
    mine = np.asarray(ours.run.model.apply({"params": ours.params},
                                           batch["input_ids"].numpy().astype(np.int32)))
    real = batch["attention_mask"].numpy().astype(bool)
    np.testing.assert_allclose(mine[real], theirs.logits.numpy()[real], rtol=0, atol=1e-5)
  if family != "jina_embeddings_v3" or task != "tag":
    # The run's held-out loss is transformers' on the same examples with the exported model
    # (byte-level BPE's words, split as transformers splits them without a prefix space,
    # are another tokenization than the run's).
    assert final["loss"] == pytest.approx(theirs.loss.item(), rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_a_contrastive_run_from_a_sentence_transformers_folder_exports_its_embeddings(
    family, tmp_path):
  """nomic-embed-text's and gte-base-en-v1.5's kind of folder: the Transformer module, mean
  pooling, Normalize; SentenceEncoder gives sentence-transformers' vectors at the start, and
  the run's exported folder gives the run's."""
  st = pytest.importorskip("sentence_transformers")
  from sentence_transformers.base.modules import Normalize, Transformer
  from sentence_transformers.sentence_transformer.modules import Pooling

  from flax_encoder.embeddings import SentenceEncoder
  from tests import test_mpnet
  from train.outputs.export import main as export_main
  from train.tasks.contrastive import sentence_encoder
  encoder = hf_models.write(tmp_path / family, family, head="base")
  start = str(tmp_path / "start")
  st.SentenceTransformer(modules=[Transformer(encoder, max_seq_length=16),
                                  Pooling(32, pooling_mode="mean"), Normalize()],
                         device="cpu").save(start)
  pairs = test_mpnet._topic_pairs(tmp_path)
  texts = [json.loads(line)[name] for line in open(pairs[1]) for name in ("anchor", "positive")]
  texts.append("the quick brown fox jumps over the lazy dog 0 1 2 3 4 5 6 7 8 9")  # cut at 16
  before = st.SentenceTransformer(start, device="cpu").encode(texts)
  np.testing.assert_allclose(SentenceEncoder.load(start)(texts), before, rtol=0, atol=1e-5)

  workdir = test_mpnet._program("embed", tmp_path / "run", pairs, start)
  out = str(tmp_path / "exported")
  assert export_main(["--workdir", workdir, "--layout", "sentence-transformers",
                      "--out", out]) == 0
  assert json.load(open(os.path.join(out, "config.json")))["model_type"] == family
  want = sentence_encoder(workdir)(texts)
  got = st.SentenceTransformer(out, device="cpu").encode(texts)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
  assert np.abs(got - before).max() > 1e-2  # the run's model, not the one it started from
