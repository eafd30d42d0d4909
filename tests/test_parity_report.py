import json

import pytest
import torch

from flax_encoder import EncoderConfig
from flax_encoder.pytorch import parity, reference

SIZES = ["--vocab-size", "20", "--d-model", "8", "--n-heads", "2", "--d-ff", "16",
         "--n-layers", "2", "--max-len", "16"]


@pytest.mark.parametrize("layout", ["tutorial", "torch_nn"])
def test_report_on_a_checkpoint_passes_and_lists_every_stage(tmp_path, capsys, layout):
  config = EncoderConfig(vocab_size=20, d_model=8, n_heads=2, d_ff=16, n_layers=2, max_len=16)
  path = tmp_path / "model.pt"
  torch.save(reference.Encoder(config, layout).state_dict(), path)
  code = parity.main(["--checkpoint", str(path), "--layout", layout, *SIZES, "--seq-len", "8"])
  out = capsys.readouterr().out
  assert code == 0 and "PASS" in out
  for stage in ["embedding", "embedded", "layers.0.self_attn", "layers.1.norm1",
                "layers.1.feed_forward", "layers.1.norm2", "norm", "output"]:
    assert f"\n{stage} " in out


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
  import jax.numpy as jnp
  assert jnp.asarray(1.0).dtype == jnp.float32  # x64 was scoped to the report
