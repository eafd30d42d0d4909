"""The parity report: against the reference tutorial port, and against the user's own module,
where it must name the first stage at which that module computes something else."""

import dataclasses
import json

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch bridge needs the torch extra")

from flax_encoder import EncoderConfig
from flax_encoder.pytorch import parity, reference
from tests import torch_models

pytestmark = pytest.mark.library  # the library's own: run on accelerators too

SIZES = ["--vocab-size", "20", "--d-model", "8", "--n-heads", "2", "--d-ff", "16",
         "--n-layers", "2", "--max-len", "16"]
STAGES = ["embedding", "embedded", "layers.0.self_attn", "layers.1.norm1", "layers.1.feed_forward",
          "layers.1.norm2", "norm", "output"]


@pytest.mark.parametrize("layout", ["tutorial", "torch_nn"])
def test_report_on_a_checkpoint_passes_and_lists_every_stage(tmp_path, capsys, layout):
  config = EncoderConfig(vocab_size=20, d_model=8, n_heads=2, d_ff=16, n_layers=2, max_len=16)
  path = tmp_path / "model.pt"
  torch.save(reference.Encoder(config, layout).state_dict(), path)
  code = parity.main(["--checkpoint", str(path), "--layout", layout, *SIZES, "--seq-len", "8"])
  out = capsys.readouterr().out
  assert code == 0 and "PASS" in out
  for stage in STAGES:
    assert f"\n{stage} " in out


def test_sizes_come_from_the_checkpoint_and_the_report_says_what_it_assumed(tmp_path, capsys):
  torch.manual_seed(0)
  model = torch_models.Classifier()  # the tutorial port nested under `encoder.`
  path = tmp_path / "model.pt"
  torch.save({"model": model.state_dict(), "epoch": 1}, path)
  code = parity.main(["--checkpoint", str(path), "--n-heads", "2", "--seq-len", "8"])
  out = capsys.readouterr().out
  assert code == 0 and "PASS" in out
  assert "encoder found at prefix 'encoder.'" in out and "ignored 2 keys" in out
  assert "reference PyTorch tutorial port" in out and "norm_position=post" in out
  assert "2 layers, d_model=8, n_heads=2, d_ff=12, vocab_size=11" in out


def test_report_fails_above_atol_and_reads_sizes_from_json(tmp_path, capsys):
  sizes = tmp_path / "sizes.json"
  sizes.write_text(json.dumps(dict(vocab_size=20, d_model=8, n_heads=2, d_ff=16, n_layers=1)))
  # float32 rounding differs between the ports by ~1e-7, never by exactly 0 everywhere.
  code = parity.main(["--config", str(sizes), "--atol", "1e-12", "--rtol", "0",
                      "--tokens", "[[3, 4, 5, 0]]"])
  out = capsys.readouterr().out
  assert code == 1 and "FAIL" in out and "> tolerance" in out


def test_report_in_float64():
  code = parity.main([*SIZES, "--float64", "--batch", "3", "--seq-len", "6"])
  assert code == 0
  assert jax.numpy.asarray(1.0).dtype == np.float32  # x64 was scoped to the report


def test_the_users_own_module_passes():
  model = torch_models.build()
  tokens = parity.random_tokens(torch_models.CONFIG, 3, 8, seed=0)
  rows, absent = parity.compare_module(model, torch_models.CONFIG, tokens,
                                       call=torch_models.run)
  assert not absent
  assert [r.name for r in rows][:3] == ["embedding", "embedded", "layers.0.self_attn"]
  assert rows[-2].name == "norm" and rows[-1].name == "output"
  assert all(r.passes(1e-5, 1e-4) for r in rows)


def test_a_pre_ln_module_fails_at_the_first_attention(capsys):
  code = parity.main(["--module", "tests.torch_models:build_pre_ln",
                      "--call", "tests.torch_models:run", "--n-heads", "2", "--seq-len", "8"])
  out = capsys.readouterr().out
  assert code == 1
  assert "your module tests.torch_models:build_pre_ln" in out
  assert "the first is layers.0.self_attn" in out
  lines = {line.split()[0]: line for line in out.splitlines() if line.startswith(("emb", "lay"))}
  assert "> tolerance" not in lines["embedded"] and "> tolerance" in lines["layers.0.self_attn"]


def test_a_different_layer_norm_eps_shows_in_float64():
  model = torch_models.TorchNNModel(eps=1e-6)
  tokens = parity.random_tokens(torch_models.CONFIG, 2, 6, seed=1)
  with jax.enable_x64(True):
    config64 = dataclasses.replace(torch_models.CONFIG, dtype="float64", param_dtype="float64")
    rows, _ = parity.compare_module(model, config64, tokens, call=torch_models.run)
  failed = [r.name for r in rows if not r.passes(1e-10, 1e-12)]
  assert failed and failed[0] == "layers.0.norm1"


def test_a_module_without_call_that_returns_logits_is_told_what_to_pass():
  with pytest.raises(ValueError, match=r"output has shape \[2, 4, 11\].*pass call="):
    parity.compare_module(torch_models.build(), torch_models.CONFIG,
                          np.array([[1, 2, 3, 4], [5, 6, 0, 0]]))


def test_an_encoder_only_module_takes_the_encoder_of_a_nested_training_checkpoint(tmp_path,
                                                                                 capsys):
  torch.manual_seed(0)
  trained = torch_models.Classifier()  # the encoder under `encoder.`, an output layer beside
  state = {f"module.{k}": v for k, v in trained.state_dict().items()}  # DistributedDataParallel
  path = tmp_path / "checkpoint.pt"
  torch.save({"model_state_dict": state, "optimizer": {}, "epoch": 3}, path)
  code = parity.main(["--module", "tests.torch_models:build_encoder", "--checkpoint", str(path),
                      "--n-heads", "2", "--seq-len", "8"])
  out = capsys.readouterr().out
  loaded = torch_models.BUILT[-1].state_dict()
  assert code == 0 and "PASS" in out, out
  assert "its encoder at prefix 'encoder.' into the module's encoder at prefix ''" in out
  for name, value in trained.encoder.state_dict().items():  # the checkpoint's, not build()'s
    torch.testing.assert_close(loaded[name].float(), value, rtol=0, atol=0)


class _RunsCode:
  def __reduce__(self):
    return (print, ("this must never run",))


def test_files_the_report_cannot_use_are_one_line(tmp_path, capsys):
  torch.save({"weights": _RunsCode()}, tmp_path / "pickle.pt")
  decoder = torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(8, 2, 16), 1)
  torch.save(decoder.state_dict(), tmp_path / "decoder.pt")
  for name, words in (("pickle.pt", "refused"), ("decoder.pt", "found no encoder"),
                      ("missing.pt", "does not exist")):
    assert parity.main(["--checkpoint", str(tmp_path / name)]) == 2
    out, err = capsys.readouterr()
    assert "this must never run" not in out
    assert err.startswith("parity: error: ") and name in err and words in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
  """Tiny random bert, roberta (pad id 1) and distilbert directories, as save_pretrained
  writes them."""
  transformers = pytest.importorskip("transformers", reason="--hf compares against transformers")
  sizes = dict(vocab_size=99, max_position_embeddings=64)
  bert = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
  configs = {"bert": transformers.BertConfig(**sizes, **bert),
             "roberta": transformers.RobertaConfig(**sizes, **bert, pad_token_id=1),
             "distilbert": transformers.DistilBertConfig(**sizes, dim=32, n_layers=2, n_heads=4,
                                                         hidden_dim=37)}
  root = tmp_path_factory.mktemp("hf")
  for seed, (name, config) in enumerate(configs.items()):
    torch.manual_seed(seed)
    transformers.AutoModel.from_config(config).save_pretrained(root / name)
  return {name: str(root / name) for name in configs}


HF_STAGES = {"bert": ["embeddings", "encoder.layer.0.attention", "encoder.layer.0",
                      "encoder.layer.1.attention", "encoder.layer.1", "last_hidden_state"],
             "distilbert": ["embeddings", "transformer.layer.0.sa_layer_norm",
                            "transformer.layer.0", "transformer.layer.1.sa_layer_norm",
                            "transformer.layer.1", "last_hidden_state"]}
HF_STAGES["roberta"] = HF_STAGES["bert"]


@pytest.mark.parametrize("float64", [False, True], ids=["float32", "float64"])
@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert"])
def test_report_on_a_hugging_face_directory_passes_at_every_stage(hf_dirs, capsys, family,
                                                                   float64):
  code = parity.main(["--hf", hf_dirs[family], "--batch", "3", "--seq-len", "8",
                      *(["--float64"] if float64 else [])])
  out = capsys.readouterr().out
  assert code == 0 and "PASS" in out, out
  rows = [line.split() for line in out.splitlines()[4:-1]]
  assert [row[0] for row in rows] == HF_STAGES[family]
  worst = max(float(row[-2]) for row in rows)  # max abs err
  assert worst <= (1e-13 if float64 else 1e-5)
  assert ("float64" if float64 else "float32") in out
  assert jax.numpy.asarray(1.0).dtype == np.float32  # x64 was scoped to the report


def test_report_on_a_hugging_face_directory_names_the_first_stage_that_differs(
    hf_dirs, capsys, monkeypatch):
  load_hf = parity.load_hf

  def misread_one_bias(path, **settings):  # a converter that gets one weight wrong
    config, variables = load_hf(path, **settings)
    variables["params"]["layers_1"]["feed_forward"]["w_2"]["bias"][3] += 1e-2
    return config, variables

  monkeypatch.setattr(parity, "load_hf", misread_one_bias)
  code = parity.main(["--hf", hf_dirs["bert"], "--batch", "3", "--seq-len", "8"])
  out = capsys.readouterr().out
  assert code == 1 and "the first is encoder.layer.1\n" in out, out
  lines = {line.split()[0]: line for line in out.splitlines()}
  assert "> tolerance" not in lines["encoder.layer.1.attention"]
  assert "> tolerance" in lines["encoder.layer.1"] and "> tolerance" in lines["last_hidden_state"]


def test_a_changed_transformers_model_fails_at_its_attention(hf_dirs):
  transformers = pytest.importorskip("transformers")
  model = transformers.AutoModel.from_pretrained(hf_dirs["distilbert"],
                                                 attn_implementation="eager")
  config, variables = parity.load_hf(hf_dirs["distilbert"])
  with torch.no_grad():
    model.transformer.layer[0].attention.out_lin.bias[0] += 1e-2
  tokens = parity.random_tokens(config, 2, 8, seed=0)
  rows = parity.compare_hf(model, config, variables, tokens)
  failed = [r.name for r in rows if not r.passes(1e-5, 1e-5)]
  assert failed[0] == "transformer.layer.0.sa_layer_norm" and rows[0].passes(1e-5, 1e-5)


def test_directories_and_flags_the_hugging_face_report_cannot_take_are_one_line(tmp_path,
                                                                               capsys):
  (tmp_path / "gpt2").mkdir()
  (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
  (tmp_path / "relative").mkdir()
  (tmp_path / "relative" / "config.json").write_text(json.dumps(
      {"model_type": "bert", "position_embedding_type": "relative_key", "vocab_size": 99}))
  for argv, words in (([str(tmp_path / "gpt2")], "model_type 'gpt2'"),
                      ([str(tmp_path / "relative")], "position_embedding_type='relative_key'"),
                      ([str(tmp_path / "missing")], "not a directory"),
                      ([str(tmp_path), "--checkpoint", "model.pt"], "takes no --checkpoint"),
                      ([str(tmp_path), "--module", "m:build"], "takes no --module")):
    assert parity.main(["--hf", *argv]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("parity: error: ") and words in err and argv[0] in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and not out
