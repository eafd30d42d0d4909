"""Hugging Face checkpoints as they are published, not as transformers 5 saves them: LayerNorms
named gamma and beta, BertForPreTraining with its next-sentence head, float16 and bfloat16
weights, sentence-transformers folders; each built here from a tiny transformers model by
rewriting what save_pretrained wrote, and loaded as transformers computes the original model.
A safetensors directory loads without torch; what load_hf cannot read is one line saying what
to do."""

import json
import os
import subprocess
import sys
import warnings

import jax
import numpy as np
import pytest

from flax_encoder import Encoder, families
from flax_encoder.families import HFError, bert, load_hf, model_directory, read_hf
from flax_encoder.heads import MaskedLMHead
from tests.runs import ROOT

pytestmark = pytest.mark.library

NEEDS = "builds its checkpoints with transformers' PyTorch models"
BERT = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=64)
ATOL = 1e-5  # as tests/test_hf.py's float32
# BERT's sizes, for the tests that write their checkpoint without torch
TINY = bert.preset(99, d_model=32, n_heads=4, d_ff=37, n_layers=2, max_len=64)


def _hf():
  """torch and transformers, or the test is skipped (a CI lane has neither)."""
  return (pytest.importorskip("torch", reason=NEEDS),
          pytest.importorskip("transformers", reason=NEEDS))


def _model(family: str = "bert", head: str = "base"):
  """A tiny random transformers model of `family` (seeded), eager attention, in eval mode."""
  torch, transformers = _hf()
  torch.manual_seed(0)
  config = {"bert": lambda: transformers.BertConfig(**BERT),
            "roberta": lambda: transformers.RobertaConfig(pad_token_id=1, **BERT),
            "distilbert": lambda: transformers.DistilBertConfig(
                vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                max_position_embeddings=64),
            "albert": lambda: transformers.AlbertConfig(embedding_size=16, **BERT)}[family]()
  config._attn_implementation = "eager"
  auto = {"base": transformers.AutoModel, "masked_lm": transformers.AutoModelForMaskedLM,
          "pretraining": transformers.AutoModelForPreTraining}[head]
  return auto.from_config(config).eval()


def _ids(model) -> np.ndarray:
  ids = np.random.default_rng(0).integers(3, model.config.vocab_size, (2, 9))
  ids[-1, 5:] = model.config.pad_token_id
  return ids


def _run(model, ids):
  torch, _ = _hf()
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), output_hidden_states=True,
                 attention_mask=torch.tensor(ids != model.config.pad_token_id).long())


def _assert_encodes_as(model, directory, head_logits=None) -> dict:
  """load_hf(directory)'s encoder computes `model`'s last hidden state (and its masked-LM head
  `head_logits`, where given); returns the variables."""
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no weight left unread
    config, variables = load_hf(directory)
  ids = _ids(model)
  out = _run(model, ids)
  hidden = np.asarray(Encoder(config).apply(variables, ids))
  np.testing.assert_allclose(hidden, out.hidden_states[-1].numpy(), rtol=0, atol=ATOL)
  if head_logits is not None:
    logits = MaskedLMHead(config).apply({"params": variables["heads"]["masked_lm"]}, hidden,
                                        variables["params"]["embedding"]["embedding"])
    np.testing.assert_allclose(np.asarray(logits), head_logits(out).numpy(), rtol=0,
                               atol=10 * ATOL)
  return variables


def _rewrite(directory, rename=lambda k: k, to_bin=False) -> dict:
  """Rewrites the model.safetensors that save_pretrained wrote into `directory`: each name as
  `rename` gives it, as pytorch_model.bin (torch.save) where `to_bin`; returns what it wrote."""
  torch, _ = _hf()
  import safetensors.torch
  file = os.path.join(directory, "model.safetensors")
  state = {rename(k): v for k, v in safetensors.torch.load_file(file).items()}
  os.remove(file)
  if to_bin:
    torch.save(state, os.path.join(directory, "pytorch_model.bin"))
  else:
    safetensors.torch.save_file(state, file, metadata={"format": "pt"})
  return state


def _legacy(name: str) -> str:
  return name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                     "LayerNorm.beta")


def _tiny_state(prefix: str = "") -> dict:
  """A random `TINY` encoder's transformers state dict, its names under `prefix`."""
  params = Encoder(TINY).init(jax.random.key(0), np.ones((1, 4), np.int32))
  return families.to_hf_state_dict(params, TINY, "bert", prefix=prefix)


def _bert_config_json(directory) -> None:
  (directory / "config.json").write_text(json.dumps(families.hf_config(TINY, "bert")))


@pytest.mark.parametrize("family, head", [("bert", "base"), ("roberta", "masked_lm"),
                                          ("distilbert", "masked_lm"), ("albert", "masked_lm")])
def test_layer_norms_named_gamma_and_beta_load_as_transformers_reads_them(family, head,
                                                                          tmp_path):
  model = _model(family, head)
  model.save_pretrained(tmp_path)
  state = _rewrite(tmp_path, _legacy)
  assert any(k.endswith("LayerNorm.gamma") for k in state)
  assert any(k.startswith(families.get(family).prefix) for k in state) == (head != "base")
  _assert_encodes_as(model, tmp_path, (lambda out: out.logits) if head != "base" else None)


def test_a_layer_norm_under_both_names_is_refused_naming_both():
  state = _tiny_state()
  state["embeddings.LayerNorm.gamma"] = state["embeddings.LayerNorm.weight"] + 1
  with pytest.raises(HFError) as e:
    families.from_hf_state_dict(state, families.hf_config(TINY, "bert"), TINY)
  assert str(e.value) == ("the weights hold both 'embeddings.LayerNorm.gamma' and "
                          "'embeddings.LayerNorm.weight', expected one of them")


def test_a_bert_for_pretraining_checkpoint_as_published_loads_its_encoder_and_masked_lm_head(
    tmp_path):
  # bert-base-uncased's pytorch_model.bin: gamma and beta, the tied decoder and the
  # position_ids buffer saved, and the next-sentence head, which nothing here reads.
  torch, transformers = _hf()
  model = _model("bert", "pretraining")
  model.save_pretrained(tmp_path)
  state = {_legacy(k): v for k, v in model.state_dict().items()}
  state["bert.embeddings.position_ids"] = torch.arange(64)[None]
  torch.save(state, tmp_path / "pytorch_model.bin")
  (tmp_path / "model.safetensors").unlink()
  assert {"cls.seq_relationship.weight", "cls.predictions.decoder.weight",
          "bert.embeddings.LayerNorm.gamma"} <= set(state)
  variables = _assert_encodes_as(model, tmp_path, lambda out: out.prediction_logits)
  assert set(variables["heads"]) == {"pooler", "masked_lm"}
  # the layout is one transformers reads as this model
  again = transformers.BertForPreTraining.from_pretrained(tmp_path, attn_implementation="eager")
  ids = _ids(model)
  np.testing.assert_array_equal(_run(again, ids).seq_relationship_logits.numpy(),
                                _run(model, ids).seq_relationship_logits.numpy())


@pytest.mark.parametrize("dtype, to_bin", [("float16", False), ("bfloat16", False),
                                           ("float16", True), ("bfloat16", True)])
def test_half_precision_weights_load_in_float32_as_transformers_loads_them(dtype, to_bin,
                                                                          tmp_path):
  torch, transformers = _hf()
  _model("bert", "masked_lm").to(getattr(torch, dtype)).save_pretrained(tmp_path)
  assert json.loads((tmp_path / "config.json").read_text())["dtype"] == dtype
  _rewrite(tmp_path, to_bin=to_bin)
  theirs = transformers.AutoModelForMaskedLM.from_pretrained(
      tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
  variables = _assert_encodes_as(theirs, tmp_path, lambda out: out.logits)
  table = variables["params"]["embedding"]["embedding"]
  assert table.dtype == np.float32
  np.testing.assert_array_equal(
      table, theirs.bert.embeddings.word_embeddings.weight.detach().numpy())


def _sentence_transformers(root, at: str) -> None:
  """`root` as sentence-transformers saves a model whose Transformer is saved in `at`."""
  (root / "1_Pooling").mkdir()
  (root / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
  (root / "modules.json").write_text(json.dumps([
      {"idx": 0, "name": "0", "path": at, "type": "sentence_transformers.models.Transformer"},
      {"idx": 1, "name": "1", "path": "1_Pooling",
       "type": "sentence_transformers.models.Pooling"}]))


@pytest.mark.parametrize("at", ["", "0_Transformer"])
def test_a_sentence_transformers_folder_loads_its_transformer(at, tmp_path):
  model = _model("bert", "base")
  model.save_pretrained(tmp_path / at)
  _sentence_transformers(tmp_path, at)
  assert model_directory(tmp_path) == str(tmp_path / at if at else tmp_path)
  assert read_hf(tmp_path).family == "bert"
  _assert_encodes_as(model, tmp_path)


@pytest.mark.parametrize("modules, named", [
    ("[{", "modules.json: not readable JSON"),
    ({"path": ""}, 'modules.json: holds {"path": ""}, expected a list of modules'),
    ([], "modules.json: holds [], expected a list of modules"),
    ([{"idx": 0, "type": "sentence_transformers.models.Transformer"}], "expected a list"),
    ([{"idx": 0, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}],
     "modules.json: the first module is of type 'sentence_transformers.models.Pooling', "
     "expected 'sentence_transformers.models.Transformer'"),
    ([{"idx": 0, "path": "../other", "type": "sentence_transformers.models.Transformer"}],
     "modules.json: the Transformer's path '../other' leads out of "),
    ([{"idx": 0, "path": "/", "type": "sentence_transformers.models.Transformer"}],
     "modules.json: the Transformer's path '/' leads out of "),
    ([{"idx": 0, "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"}],
     "modules.json: the Transformer's path '0_Transformer' is no folder of "),
    # a module after it that would read another folder's files (a Dense's weights, say)
    ([{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
      {"idx": 1, "path": "../other", "type": "sentence_transformers.models.Pooling"}],
     "modules.json: module 1's path '../other' leads out of "),
])
def test_a_modules_json_it_cannot_follow_is_one_line_naming_it(modules, named, tmp_path):
  (tmp_path / "other").mkdir()
  _bert_config_json(tmp_path / "other")  # a model beside the folder, which it must not load
  folder = tmp_path / "st"
  folder.mkdir()
  _bert_config_json(folder)
  (folder / "modules.json").write_text(modules if isinstance(modules, str) else
                                       json.dumps(modules))
  for read in (load_hf, families.read_hf_config, families.read_hf_weights):
    with pytest.raises(HFError) as e:
      read(folder)
    assert str(e.value).startswith(str(folder / "modules.json"))
    assert named in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("file, framework, package, flag", [
    ("tf_model.h5", "TensorFlow", "tensorflow", "from_tf=True"),
    ("flax_model.msgpack", "Flax", "flax", "from_flax=True")])
def test_weights_of_another_framework_are_one_line_saying_how_to_convert_them(
    file, framework, package, flag, tmp_path):
  _bert_config_json(tmp_path)
  (tmp_path / file).write_bytes(b"\0" * 8)
  with pytest.raises(HFError) as e:
    load_hf(tmp_path)
  assert str(e.value) == (
      f"{tmp_path}: holds only {file} ({framework} weights, which load_hf does not read): "
      f"convert it with transformers 4 (pip install 'transformers<5' {package}; "
      f"AutoModel.from_pretrained(DIR, {flag})"
      f".save_pretrained(OUT)) and load OUT")


@pytest.mark.parametrize("file, package, extra", [("model.safetensors", "safetensors", "hf")])
def test_weights_whose_reader_is_not_installed_are_one_line_naming_the_extra(
    file, package, extra, tmp_path, monkeypatch):
  """(pytorch_model.bin takes no package: tests/test_torch_zip.py)"""
  _bert_config_json(tmp_path)
  (tmp_path / file).write_bytes(b"PK\x03\x04")
  monkeypatch.setitem(sys.modules, package, None)  # as where it is not installed
  with pytest.raises(HFError) as e:
    load_hf(tmp_path)
  assert str(e.value) == (f"{tmp_path / file}: reading it needs {package}, which is not "
                          f"installed: pip install 'flax-encoder[{extra}]'")


def test_a_safetensors_directory_loads_without_torch_or_the_pytorch_bridge(tmp_path):
  safetensors = pytest.importorskip("safetensors.numpy", reason="comes with the hf extra")
  safetensors.save_file(_tiny_state("bert."), str(tmp_path / "model.safetensors"))
  _bert_config_json(tmp_path)
  code = ("import sys\nfrom flax_encoder.families import read_hf\n"
          f"print(read_hf({str(tmp_path)!r}).family)\n"
          "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'\n"
          "             or m.startswith('flax_encoder.pytorch')))\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split("\n")[:2] == ["bert", "[]"]
