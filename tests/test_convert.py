import dataclasses
import pickle

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from flax_encoder import Encoder, EncoderConfig, stack_layers
from flax_encoder.pytorch import reference
from flax_encoder.pytorch.convert import (
  from_torch_state_dict,
  load_torch_checkpoint,
  to_torch_state_dict,
)

CONFIG = EncoderConfig(vocab_size=11, d_model=8, n_heads=2, d_ff=12, n_layers=2, max_len=10)


def _flax_variables(config=CONFIG):
  return nn.unbox(Encoder(config).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32)))


@pytest.mark.parametrize("layout", ["tutorial", "torch_nn"])
@pytest.mark.parametrize("scan_layers", [False, True])
def test_round_trip_is_bitwise_and_loads_into_torch(layout, scan_layers):
  config = dataclasses.replace(CONFIG, scan_layers=scan_layers)
  variables = _flax_variables(config)
  state = to_torch_state_dict(variables, config, layout)
  reference.Encoder(config, layout).load_state_dict(state, strict=True)
  back = from_torch_state_dict(state, config, layout)
  jax.tree.map(np.testing.assert_array_equal, back, jax.tree.map(np.asarray, variables))


def test_parameters_come_out_in_param_dtype():
  state = reference.Encoder(CONFIG).state_dict()
  bf16 = dataclasses.replace(CONFIG, param_dtype="bfloat16", dtype="bfloat16")
  leaves = jax.tree.leaves(from_torch_state_dict(state, bf16))
  assert {x.dtype for x in leaves} == {jnp.dtype(jnp.bfloat16)}
  state_bf16 = {k: v.to(torch.bfloat16) for k, v in state.items()}
  leaves = jax.tree.leaves(from_torch_state_dict(state_bf16, CONFIG))
  assert {x.dtype for x in leaves} == {np.dtype(np.float32)}


def test_linear_weights_are_transposed():
  state = reference.Encoder(CONFIG).state_dict()
  params = from_torch_state_dict(state, CONFIG)["params"]
  np.testing.assert_array_equal(params["layers_1"]["feed_forward"]["w_1"]["kernel"],
                                state["layers.1.feed_forward.w_1.weight"].numpy().T)


def test_bad_state_dicts_name_every_problem():
  state = dict(reference.Encoder(CONFIG).state_dict())
  del state["layers.0.norm1.bias"], state["norm.weight"]
  state["layers.2.norm1.weight"] = torch.zeros(8)
  state["layers.1.self_attn.w_q.weight"] = torch.zeros(8, 9)
  with pytest.raises(ValueError) as e:
    from_torch_state_dict(state, CONFIG)
  message = str(e.value)
  for part in ["missing keys (2)", "layers.0.norm1.bias", "norm.weight", "unexpected keys (1)",
               "layers.2.norm1.weight", "wrong shapes (1)",
               "layers.1.self_attn.w_q.weight: got (8, 9), expected (8, 8)"]:
    assert part in message


def test_layout_mismatch_and_unknown_layout():
  state = reference.Encoder(CONFIG, "torch_nn").state_dict()
  with pytest.raises(ValueError, match="in_proj_weight"):
    from_torch_state_dict(state, CONFIG, layout="tutorial")
  with pytest.raises(ValueError,
                     match=r"layout must be one of \('tutorial', 'torch_nn'\), got 'hf'"):
    from_torch_state_dict(state, CONFIG, layout="hf")
  with pytest.raises(TypeError, match="state_dict must be a mapping"):
    from_torch_state_dict([1, 2], CONFIG)


def test_positional_table_is_checked():
  state = dict(reference.Encoder(CONFIG).state_dict())
  pe = state["pos_encoder.pe"].clone()
  half = CONFIG.d_model // 2  # the sin-halves-then-cos-halves layout of some ports
  state["pos_encoder.pe"] = torch.cat([pe[..., 0::2], pe[..., 1::2]], dim=-1)
  assert half == 4
  with pytest.raises(ValueError, match="pos_encoder.pe.*interleaved"):
    from_torch_state_dict(state, CONFIG)


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_load_checkpoint_files(tmp_path, suffix):
  state = reference.Encoder(CONFIG).state_dict()
  path = tmp_path / f"model{suffix}"
  if suffix == ".pt":
    torch.save({"state_dict": state, "epoch": 3}, path)
  else:
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
  loaded = load_torch_checkpoint(path)
  assert set(loaded) == set(state)
  np.testing.assert_array_equal(loaded["norm.weight"], state["norm.weight"].numpy())
  from_torch_state_dict(loaded, CONFIG)


EXPLOITS_RUN = []


def _exploit(marker):
  EXPLOITS_RUN.append(marker)
  return torch.zeros(1)


class _Exploit:
  def __reduce__(self):  # unpickling calls _exploit: what a malicious checkpoint would do
    return (_exploit, ("ran",))


def test_malicious_pickle_is_refused_never_run(tmp_path):
  path = tmp_path / "evil.pt"
  with open(path, "wb") as f:
    pickle.dump({"embedding.weight": _Exploit()}, f)
  with open(path, "rb") as f:  # the file does run code under a plain unpickler
    pickle.load(f)
  assert EXPLOITS_RUN == ["ran"]
  with pytest.raises(ValueError, match="refused"):
    load_torch_checkpoint(path)
  assert EXPLOITS_RUN == ["ran"]


def test_missing_truncated_and_unknown_files(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.pt"):
    load_torch_checkpoint(tmp_path / "nope.pt")
  state = reference.Encoder(CONFIG).state_dict()
  for suffix in (".pt", ".safetensors"):
    path = tmp_path / f"model{suffix}"
    if suffix == ".pt":
      torch.save(state, path)
    else:
      save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupt"):
      load_torch_checkpoint(path)
  other = tmp_path / "model.ckpt"
  other.write_bytes(b"")
  with pytest.raises(ValueError, match=r"suffix '.ckpt'; expected .safetensors"):
    load_torch_checkpoint(other)
  not_dict = tmp_path / "list.pt"
  torch.save([torch.zeros(2)], not_dict)
  with pytest.raises(ValueError, match="holds a list"):
    load_torch_checkpoint(not_dict)


def test_converted_weights_run_in_flax():
  model = reference.Encoder(CONFIG).eval()
  tokens = np.array([[1, 2, 3, 0]])
  expected = model(torch.tensor(tokens)).detach().numpy()
  variables = from_torch_state_dict(model.state_dict(), CONFIG)
  with jax.default_matmul_precision("highest"):
    np.testing.assert_allclose(Encoder(CONFIG).apply(variables, tokens), expected, atol=1e-5)
  scanned = dataclasses.replace(CONFIG, scan_layers=True)
  assert "layers" in from_torch_state_dict(model.state_dict(), scanned)["params"]
  np.testing.assert_array_equal(
      stack_layers(variables["params"], 2)["layers"]["norm1"]["scale"],
      from_torch_state_dict(model.state_dict(), scanned)["params"]["layers"]["norm1"]["scale"])
