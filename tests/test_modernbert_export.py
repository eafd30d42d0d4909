"""ModernBERT's way back to transformers and its own classifiers: fine-tuning from a ModernBERT
directory pools through its prediction head (the checkpoint's, as transformers loads it) and
computes what ModernBertForSequenceClassification and ModernBertForTokenClassification compute;
hf_config and to_hf_state_dict write what transformers writes; `--layout hf` exports
classifiers, taggers, masked-LM and bare models that transformers loads as themselves and
load_hf reads back as they were; what does not map is refused in one line."""

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

from configs import classify as classify_config  # noqa: E402
from configs import modern, regress as regress_config, tag as tag_config  # noqa: E402
from flax_encoder import Encoder, EncoderConfig  # noqa: E402
from flax_encoder.families import (HFError, hf_config, load_hf,  # noqa: E402
                                   to_hf_state_dict)
from flax_encoder.heads import MaskedLMHead  # noqa: E402
from flax_encoder.masked_lm import MaskedLM  # noqa: E402
from tests import hf_models, runs  # noqa: E402
from train.task import Resume  # noqa: E402
from train.tasks import classify, regress, tag  # noqa: E402

WINDOW = 16  # tests/hf_models.py's local_attention: a token sees 8 positions either way
SEQ_LEN = 48  # longer than the window: the local layers matter
LONG = "the quick brown fox jumps over the lazy dog 0123 4567 89 abcd efgh ij"


def _write(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def _modernbert(path, **sizes) -> str:
  """tests/hf_models.py's tiny ModernBertForMaskedLM with its tokenizer, its LayerNorm weights
  drawn too (not left at 1), saved into `path`."""
  directory = hf_models.write(path, "modernbert", **sizes)
  model = transformers.AutoModelForMaskedLM.from_pretrained(directory)
  torch.manual_seed(1)
  with torch.no_grad():
    for name, param in model.named_parameters():
      if "norm" in name:
        param.add_(0.1 * torch.randn_like(param))
  model.save_pretrained(directory)
  return directory


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """{task: (train.jsonl, eval.jsonl)}: texts (and pairs) with classes, with numbers, and
  words with BIO tags; some longer than the window."""
  directory = tmp_path_factory.mktemp("data")
  rng = np.random.default_rng(0)
  words = LONG.split()

  def text():
    return " ".join(rng.choice(words, int(rng.integers(2, 14))))

  def rows(n):
    out = []
    for i in range(n):
      a, b = text(), text()
      tokens = f"{a} {b}".split()
      out.append({"text": a, "text_pair": b, "label": ("short", "long")[len(a) > 30],
                  "score": len(a) / 10, "tokens": tokens,
                  "tags": ["B-X" if w == "fox" else "O" for w in tokens]})
    return out

  train, eval_ = rows(24), rows(8)
  files = {}
  for task in ("classify", "regress", "tag"):
    files[task] = tuple(_write(directory / f"{task}.{split}.jsonl", r)
                        for split, r in (("train", train), ("eval", eval_)))
  return files


@pytest.fixture(scope="module", params=["cls", "mean"])
def checkpoint(request, tmp_path_factory):
  """(classifier_pooling, a ModernBERT directory that pools so)."""
  path = tmp_path_factory.mktemp(f"modernbert-{request.param}")
  return request.param, _modernbert(path, classifier_pooling=request.param)


def _config(task, files, directory):
  config = {"classify": classify_config, "regress": regress_config, "tag": tag_config}[
      task].get_config()
  config.data.train, config.data.eval = files[task]
  if task == "regress":
    config.data.label_field = "score"
  config.init.hf = directory
  config.train.update(seq_len=SEQ_LEN, batch_size=8)
  return config


# ---------------------------------------------------------------------------------------------
# ModernBERT's own classification head, from the checkpoint.


@pytest.mark.parametrize("task", ["classify", "regress", "tag"])
def test_fine_tuning_starts_with_the_checkpoint_s_head_and_computes_what_transformers_does(
    task, checkpoint, data, tmp_path):
  pooling, directory = checkpoint
  setup = {"classify": classify, "regress": regress, "tag": tag}[task].setup(
      _config(task, data, directory), str(tmp_path), Resume())
  model = setup.task.model
  if task == "tag":
    assert model.head
    auto = transformers.AutoModelForTokenClassification
  else:
    assert model.pooling == {"cls": "first_head", "mean": "mean_head"}[pooling]
    auto = transformers.AutoModelForSequenceClassification
  outputs = model.num_labels
  theirs = auto.from_pretrained(directory, num_labels=outputs,
                                attn_implementation="eager").eval()
  # transformers' classifier reads the masked-LM checkpoint's head.dense and head.norm: so
  # does the run (the classifier after it starts afresh on both sides).
  head = setup.start_params["head"]
  np.testing.assert_array_equal(head["dense"]["kernel"].T, theirs.head.dense.weight.detach())
  np.testing.assert_array_equal(head["norm"]["scale"], theirs.head.norm.weight.detach())
  assert set(setup.start_params) == {"encoder", "head"}
  params = nn.unbox(model.init(jax.random.PRNGKey(0), jnp.ones((1, SEQ_LEN), jnp.int32)))
  params = {**params["params"], **setup.start_params}
  assert set(params["classifier"]) == {"kernel", "bias"}  # ModernBERT's classifier has a bias
  with torch.no_grad():
    theirs.classifier.weight.copy_(torch.tensor(np.asarray(params["classifier"]["kernel"]).T))
    theirs.classifier.bias.copy_(torch.tensor(np.asarray(params["classifier"]["bias"])))
  tokens = np.asarray(setup.eval["tokens"], np.int64)
  pad = setup.encoder.pad_id
  real = tokens != pad
  assert real.sum(1).max() > WINDOW and real.sum(1).min() < real.shape[1]  # past it, padded
  ours = np.asarray(model.apply({"params": params}, tokens))
  with torch.no_grad():
    logits = theirs(input_ids=torch.tensor(tokens),
                    attention_mask=torch.tensor(real).long()).logits.numpy()
  if task == "classify":  # probabilities
    np.testing.assert_allclose(jax.nn.softmax(ours), torch.softmax(torch.tensor(logits), -1),
                               rtol=0, atol=1e-5)
  elif task == "tag":  # each real token's logits
    np.testing.assert_allclose(ours[real], logits[real], rtol=0, atol=1e-5)
  else:
    np.testing.assert_allclose(ours, logits, rtol=0, atol=1e-5)


def test_a_checkpoint_without_a_head_starts_one_afresh(data, tmp_path):
  directory = hf_models.write(tmp_path / "base", "modernbert", head="base")
  _, variables = load_hf(directory)
  assert "prediction_head" not in variables.get("heads", {})
  setup = classify.setup(_config("classify", data, directory), str(tmp_path / "run"), Resume())
  assert setup.task.model.pooling == "first_head" and set(setup.start_params) == {"encoder"}
  params = setup.task.init(jax.random.PRNGKey(0), SEQ_LEN)
  assert set(params) == {"encoder", "head", "classifier"}


# ---------------------------------------------------------------------------------------------
# hf_config and to_hf_state_dict.


def _saved_modernbert(path, **overrides):
  """A tiny random ModernBertForMaskedLM, every parameter drawn, saved into `path`."""
  torch.manual_seed(0)
  config = transformers.ModernBertConfig(**{
      "vocab_size": 99, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 4,
      "num_attention_heads": 4, "max_position_embeddings": 128, "local_attention": WINDOW,
      "global_attn_every_n_layers": 3, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
      "cls_token_id": 1, "sep_token_id": 2, **overrides})
  model = transformers.ModernBertForMaskedLM(config).eval()
  with torch.no_grad():
    for param in model.parameters():
      param.add_(0.1 * torch.randn_like(param))
  model.save_pretrained(path)
  return model


def _export(path, variables, config, architecture, prefix="", **extra) -> str:
  import safetensors.numpy
  os.makedirs(path)
  safetensors.numpy.save_file(to_hf_state_dict(variables, config, "modernbert", prefix),
                              os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_config(config, "modernbert", architectures=[architecture], **extra), f)
  return str(path)


def _padded(seq=60, vocab=99, seed=0):
  ids = np.random.default_rng(seed).integers(3, vocab, (2, seq))
  ids[1, seq - 11:] = 0
  return ids


def _same(a, b) -> bool:
  return jax.tree.structure(a) == jax.tree.structure(b) and all(
      np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("bias", [False, True], ids=["bias-free", "biases"])
def test_the_state_dict_and_config_are_transformers_own_and_load_back_as_they_were(
    bias, tmp_path):
  model = _saved_modernbert(tmp_path / "hf", attention_bias=bias, mlp_bias=bias,
                            classifier_bias=bias, norm_bias=bias, classifier_pooling="mean")
  config, variables = load_hf(tmp_path / "hf")
  assert sorted(variables["heads"]) == ["masked_lm", "prediction_head"]
  state = to_hf_state_dict(variables, config, "modernbert", prefix="model.")
  theirs = {k: v.numpy() for k, v in model.state_dict().items()}
  assert sorted(state) == sorted(theirs)  # Wqkv whole, no bias key where there is no bias
  for key, value in theirs.items():
    np.testing.assert_array_equal(state[key], value, err_msg=key)
  written = hf_config(config, "modernbert")
  own = model.config.to_dict()
  for key, value in written.items():
    if not key.endswith("token_id"):  # the caller's to give (train.outputs.hf_export: the start's)
      assert own[key] == value, key

  out = _export(tmp_path / "out", variables, config, "ModernBertForMaskedLM", "model.",
                classifier_pooling="mean", cls_token_id=1, sep_token_id=2)
  again = transformers.AutoModelForMaskedLM.from_pretrained(
      out, attn_implementation="eager").eval()
  assert type(again).__name__ == "ModernBertForMaskedLM"
  ids = _padded()
  with torch.no_grad():
    logits = again(input_ids=torch.tensor(ids),
                   attention_mask=torch.tensor(ids != 0).long()).logits.numpy()
  hidden = Encoder(config).apply(variables, ids)
  ours = MaskedLMHead(config).apply({"params": variables["heads"]["masked_lm"]}, hidden,
                                    variables["params"]["embedding"]["embedding"])
  np.testing.assert_allclose(np.asarray(ours)[ids != 0], logits[ids != 0], rtol=0, atol=1e-5)
  back, variables_back = load_hf(out)
  assert back == config and _same(variables_back, variables)


def _modern_config(**overrides) -> EncoderConfig:
  """configs/modern.py's architecture at a tiny size, its window 8 (4 either way)."""
  fields = {k: v for k, v in modern.get_config().model.to_dict().items() if v is not None}
  fields.update(d_model=16, n_heads=2, d_ff=24, n_layers=3, max_len=64, local_attention=8,
                dropout=0.0, **overrides)
  fields.pop("vocab_size", None)
  return EncoderConfig(vocab_size=50, **{k: v for k, v in fields.items()
                                         if k in EncoderConfig.__dataclass_fields__})


def test_a_modern_architecture_from_scratch_is_a_modernbert_model_to_transformers(tmp_path):
  config = _modern_config()
  assert [config.is_global(i) for i in range(3)] == [True, False, False]
  ids = _padded(seq=40, vocab=50)
  variables = nn.unbox(Encoder(config).init(jax.random.PRNGKey(0), jnp.asarray(ids)))
  out = _export(tmp_path / "out", variables, config, "ModernBertModel")
  theirs = transformers.AutoModel.from_pretrained(out, attn_implementation="eager").eval()
  assert type(theirs).__name__ == "ModernBertModel"
  assert theirs.config.layer_types == ["full_attention", "sliding_attention",
                                       "sliding_attention"]
  with torch.no_grad():
    hidden = theirs(input_ids=torch.tensor(ids),
                    attention_mask=torch.tensor(ids != 0).long()).last_hidden_state.numpy()
  ours = np.asarray(Encoder(config).apply(variables, ids))
  np.testing.assert_allclose(ours[ids != 0], hidden[ids != 0], rtol=0, atol=1e-5)
  # The window matters at this length: without it the local layers see everything.
  whole = np.asarray(Encoder(dataclasses.replace(config, local_attention=0)).apply(variables,
                                                                                   ids))
  assert np.abs(whole - ours)[ids != 0].max() > 1e-3
  back, variables_back = load_hf(out, dropout=0.0)
  assert back == config and _same(variables_back, variables)


@pytest.mark.parametrize("change, named", [
    (dict(first_attention_norm=True), "first_attention_norm=True, a modernbert model "
                                      "first_attention_norm=False"),
    (dict(glu=False), "glu=False"),
    # Post-LN with layer 0's attention norm: without it, EncoderConfig refuses the model itself.
    (dict(norm_position="post", first_attention_norm=True), "norm_position='post'"),
    (dict(final_norm=False), "final_norm=False"),
    (dict(position_embedding="learned"), "position_embedding='learned'"),
])
def test_what_does_not_map_onto_modernbert_is_refused_naming_it(change, named):
  with pytest.raises(HFError, match="^this model is not a modernbert model: it has .*"
                     + named.replace("(", r"\(")) as e:
    hf_config(_modern_config(**change), "modernbert")
  assert "\n" not in str(e.value)
  with pytest.raises(HFError, match="this model is not a distilbert model: it has "
                                    "position_embedding='rotary'"):
    hf_config(_modern_config(), "distilbert")


@pytest.mark.parametrize("task, model, named", [
    ("classify", dict(pooling="mean"), "the run pools by 'mean'; transformers' "
     "ModernBertForSequenceClassification pools through its prediction head "
     "(config.task.pooling='first_head' or 'mean_head')"),
    ("tag", dict(head=False), "the run tags without ModernBERT's prediction head"),
])
def test_a_modernbert_classifier_without_its_prediction_head_is_not_exported(task, model, named):
  from types import SimpleNamespace

  from flax_encoder import families
  from train.tasks.supervised import sequence_classifier
  from train.tasks.tag import token_classifier
  run = SimpleNamespace(task=task, model=SimpleNamespace(config=_modern_config(), **model),
                        params={}, labels=["a", "b"])
  with pytest.raises(HFError) as e:  # each task's export as the family's *For… model
    {"classify": sequence_classifier, "tag": token_classifier}[task](
        run, families.get("modernbert"))
  assert str(e.value).startswith(named) and "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------
# python -m train.export --layout hf, through transformers.


def _train(workdir, config, *overrides):
  return runs.train(workdir, f"--config={os.path.join(runs.ROOT, 'configs', config)}",
                    "--config.train.num_steps=4", "--config.train.batch_size=8",
                    "--config.train.log_every=2", "--config.train.eval_every=4",
                    "--config.train.checkpoint_every=4", "--config.optim.warmup_steps=2",
                    *overrides, config=None)


def _exported(workdir, out) -> str:
  from train.outputs.export import main as export
  assert export(["--workdir", workdir, "--layout", "hf", "--out", str(out)]) == 0
  return str(out)


@pytest.fixture(scope="module")
def mean_pooling(tmp_path_factory):
  """A ModernBERT directory whose classifier pools by the mean."""
  return _modernbert(tmp_path_factory.mktemp("modernbert-mean"), classifier_pooling="mean")


@pytest.mark.parametrize("task", [*(pytest.param(t, marks=pytest.mark.slow)
                                    for t in ("classify", "regress")), "tag"])
def test_a_fine_tuning_run_exports_modernbert_s_classifier_that_transformers_loads_as_itself(
    task, mean_pooling, data, tmp_path):
  from train.outputs.predict import read_run
  train, eval_ = data[task]
  workdir = str(tmp_path / "run")
  _train(workdir, f"{task}.py", f"--config.data.train={train}", f"--config.data.eval={eval_}",
         f"--config.init.hf={mean_pooling}", f"--config.train.seq_len={SEQ_LEN}",
         *(["--config.data.label_field=score"] if task == "regress" else []))
  out = _exported(workdir, tmp_path / "exported")
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json",
                                     "tokenizer_config.json"]
  run = read_run(workdir)
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  rows = [json.loads(line) for line in open(eval_)]
  if task == "tag":
    model = transformers.AutoModelForTokenClassification.from_pretrained(
        out, attn_implementation="eager").eval()
    assert type(model).__name__ == "ModernBertForTokenClassification"
    assert list(model.config.id2label.values()) == ["B-X", "O"]
    batch = tokenizer([r["tokens"] for r in rows], is_split_into_words=True, padding=True,
                      return_tensors="np")
  else:
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        out, attn_implementation="eager").eval()
    assert type(model).__name__ == "ModernBertForSequenceClassification"
    assert model.config.classifier_pooling == "mean" and run.model.pooling == "mean_head"
    assert model.config.problem_type == ("regression" if task == "regress" else None)
    batch = tokenizer([r["text"] for r in rows], [r["text_pair"] for r in rows], padding=True,
                      return_tensors="np")
  # The directory's special ids come along, not ModernBertConfig's defaults.
  assert (model.config.cls_token_id, model.config.sep_token_id) == (
      tokenizer.cls_token_id, tokenizer.sep_token_id)
  ids, real = batch["input_ids"], batch["attention_mask"].astype(bool)
  assert real.sum(1).max() > WINDOW and not real.all()
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(real).long()).logits
  ours = np.asarray(run.model.apply({"params": run.params}, ids.astype(np.int32)))
  if task == "tag":
    np.testing.assert_allclose(ours[real], theirs.numpy()[real], rtol=0, atol=1e-5)
  elif task == "regress":  # what predict computes from the texts
    from train.tasks.regress import Regressor
    numbers = Regressor(workdir).numbers([r["text"] for r in rows],
                                         [r["text_pair"] for r in rows])
    np.testing.assert_allclose(numbers, theirs.numpy()[:, 0], rtol=0, atol=1e-5)
  else:
    from train.tasks.classify import Predictor
    probabilities = Predictor(workdir).probabilities([r["text"] for r in rows],
                                                     [r["text_pair"] for r in rows])
    np.testing.assert_allclose(probabilities, torch.softmax(theirs, -1).numpy(), rtol=0,
                               atol=1e-5)
  # load_hf reads back the run's encoder and head.
  _, variables = load_hf(out)
  assert _same(variables["params"], nn.unbox(run.params["encoder"]))
  assert _same(variables["heads"]["prediction_head"], nn.unbox(run.params["head"]))


def test_a_further_pretraining_run_exports_modernbert_for_masked_lm(mean_pooling, tmp_path):
  from train.data import prepare
  from train.tasks import masked_lm
  corpus = tmp_path / "corpus.jsonl"
  corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in hf_models.TEXTS))
  prepared = str(tmp_path / "prepared")
  prepare.prepare([str(corpus)], prepared, mean_pooling, seq_len=32, eval_fraction=0.25,
                  workers=1, progress=False)
  workdir = str(tmp_path / "run")
  _train(workdir, "default.py", f"--config.init.hf={mean_pooling}",
         f"--config.data.prepared={prepared}", "--config.train.seq_len=32",
         "--config.train.batch_size=4")
  out = _exported(workdir, tmp_path / "exported")
  again = transformers.AutoModelForMaskedLM.from_pretrained(
      out, attn_implementation="eager").eval()
  assert type(again).__name__ == "ModernBertForMaskedLM"
  assert again.config.classifier_pooling == "mean"  # the directory's, kept
  cfg, variables, _ = masked_lm.trained_with_head(workdir)
  ids = _padded(seq=40, vocab=cfg.vocab_size)
  with torch.no_grad():
    theirs = again(input_ids=torch.tensor(ids),
                   attention_mask=torch.tensor(ids != 0).long()).logits.numpy()
  ours = MaskedLM(cfg, checkpoint_head=True).apply(
      {"params": {"encoder": variables["params"], "masked_lm": variables["heads"]["masked_lm"]}},
      ids)
  np.testing.assert_allclose(np.asarray(ours)[ids != 0], theirs[ids != 0], rtol=0, atol=1e-5)
  _, back = load_hf(out)
  assert _same(back["params"], nn.unbox(variables["params"]))
  assert _same(back["heads"]["masked_lm"], nn.unbox(variables["heads"]["masked_lm"]))


MODERN_TINY = ["--config.model.d_model=16", "--config.model.n_heads=2", "--config.model.d_ff=24",
               "--config.model.n_layers=3", "--config.model.max_len=32",
               "--config.model.local_attention=8", "--config.train.seq_len=32"]


@pytest.mark.slow
def test_configs_modern_from_scratch_exports_as_modernbert_model_and_other_layouts_are_refused(
    tmp_path, capsys):
  from train.run.load import load_encoder
  workdir = str(tmp_path / "run")
  _train(workdir, "modern.py", *MODERN_TINY)
  out = _exported(workdir, tmp_path / "exported")
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]  # ids with an offset
  theirs = transformers.AutoModel.from_pretrained(out, attn_implementation="eager").eval()
  assert type(theirs).__name__ == "ModernBertModel"
  cfg, variables = load_encoder(workdir)
  ids = _padded(seq=32, vocab=cfg.vocab_size)
  with torch.no_grad():
    hidden = theirs(input_ids=torch.tensor(ids),
                    attention_mask=torch.tensor(ids != cfg.pad_id).long()).last_hidden_state
  ours = np.asarray(Encoder(cfg).apply(variables, ids))
  real = ids != cfg.pad_id
  np.testing.assert_allclose(ours[real], hidden.numpy()[real], rtol=0, atol=1e-5)
  # Layer 0 normalising its input is not ModernBERT: one line naming it, nothing written.
  other = str(tmp_path / "other")
  _train(other, "modern.py", *MODERN_TINY, "--config.model.first_attention_norm=True",
         "--config.train.num_steps=2", "--config.train.eval_every=2",
         "--config.train.checkpoint_every=2")
  capsys.readouterr()
  from train.outputs.export import main as export
  assert export(["--workdir", other, "--layout", "hf", "--out", str(tmp_path / "no")]) == 2
  error = capsys.readouterr().err
  assert error == ("export: error: --layout hf: this model is not a modernbert model: it has "
                   "first_attention_norm=True, a modernbert model first_attention_norm=False\n")
  assert not (tmp_path / "no").exists()
