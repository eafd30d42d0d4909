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
