import dataclasses
import pickle

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch bridge needs the torch extra")
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


# Checkpoints as users have them: the encoder nested in a model, wrapped, compiled, in a
# torch.nn.TransformerEncoder container, inside a training checkpoint.

from flax_encoder.pytorch import config_from_torch_state_dict  # noqa: E402
from tests.torch_models import Classifier, TorchNNModel  # noqa: E402

pytestmark = pytest.mark.library  # the library's own: run on accelerators too

TOKENS = np.array([[1, 2, 3, 4, 5], [6, 7, 8, 0, 0]])


def _encoder_state(model):
  """The encoder's own state dict, in the plain names of its layout."""
  if isinstance(model, Classifier):
    return model.encoder.state_dict()
  state = {"embedding.weight": model.embedding.weight, "pos_encoder.pe": model.pos_encoder.pe}
  state.update(model.encoder.state_dict())  # layers.{i}…, norm…
  return state


def _hidden(model, tokens):
  model.eval()
  t = torch.tensor(tokens)
  out = model.encoder(t) if isinstance(model, Classifier) else model.hidden(t)
  return out.detach().numpy()


@pytest.mark.parametrize("case", ["nested", "ddp", "compiled", "container", "container+ddp"])
def test_auto_prefix_finds_the_encoder_in_real_checkpoints(case, caplog):
  torch.manual_seed(0)
  model = TorchNNModel() if case.startswith("container") else Classifier()
  state = model.state_dict()
  if case.endswith("ddp"):
    state = {f"module.{k}": v for k, v in state.items()}  # DistributedDataParallel(model)
  if case == "compiled":
    state = torch.compile(model).state_dict()
    assert all(k.startswith("_orig_mod.") for k in state)
  with caplog.at_level("INFO", logger="flax_encoder"):
    config = config_from_torch_state_dict(state, n_heads=2, prefix="auto")
    variables = from_torch_state_dict(state, config, prefix="auto")
  assert config == CONFIG  # every size read off the shapes, max_len off pos_encoder.pe
  layout = "torch_nn" if case.startswith("container") else "tutorial"
  expected = from_torch_state_dict(_encoder_state(model), CONFIG, layout=layout)
  jax.tree.map(np.testing.assert_array_equal, variables, expected)
  log = caplog.text
  assert f"layout '{layout}'" in log
  assert "ignored 2 keys outside the encoder" in log and "head.weight" in log
  with jax.default_matmul_precision("highest"):
    np.testing.assert_allclose(Encoder(config).apply(variables, TOKENS), _hidden(model, TOKENS),
                               atol=1e-5)


def test_explicit_prefix_and_what_auto_cannot_decide():
  torch.manual_seed(0)
  state = Classifier().state_dict()
  variables = from_torch_state_dict(state, CONFIG, prefix="encoder.")
  expected = from_torch_state_dict(state, CONFIG, prefix="auto")
  jax.tree.map(np.testing.assert_array_equal, variables, expected)
  with pytest.raises(ValueError, match="expected the layers at head.layers"):
    from_torch_state_dict(state, CONFIG, prefix="head.")
  two = {**{f"a.{k}": v for k, v in state.items()}, **{f"b.{k}": v for k, v in state.items()}}
  with pytest.raises(ValueError, match=r"holds 2 encoders: prefix 'a.encoder.'.*'b.encoder.'"):
    from_torch_state_dict(two, CONFIG, prefix="auto")
  with pytest.raises(ValueError, match="found no encoder"):
    from_torch_state_dict({"head.weight": torch.zeros(2, 2)}, CONFIG, prefix="auto")
  # Inside the encoder nothing is skipped: a layer the config does not have is an error.
  state = dict(state)
  state["encoder.layers.2.norm1.weight"] = torch.zeros(8)
  with pytest.raises(ValueError, match=r"unexpected keys \(1\): layers.2.norm1.weight"):
    from_torch_state_dict(state, CONFIG, prefix="auto")


def test_sizes_come_from_the_shapes():
  config = dataclasses.replace(CONFIG, final_norm=False, d_ff=20, n_layers=3, max_len=7)
  state = reference.Encoder(config, "torch_nn").state_dict()  # no pe: torch_nn keeps none
  inferred = config_from_torch_state_dict(state, n_heads=2)
  assert inferred == dataclasses.replace(config, max_len=EncoderConfig.max_len)
  assert config_from_torch_state_dict(state, n_heads=4, norm_position="pre").norm_position == "pre"
  del state["layers.1.norm1.weight"], state["layers.1.norm1.bias"]
  state = {k.replace("layers.2.", "layers.5."): v for k, v in state.items()}
  with pytest.raises(ValueError, match=r"numbered 0, 1, …, got \[0, 1, 5\]"):
    config_from_torch_state_dict(state, n_heads=2)


def test_positional_table_is_accepted_and_checked_in_both_layouts():
  torch.manual_seed(0)
  state = _encoder_state(TorchNNModel())
  assert "pos_encoder.pe" in state
  from_torch_state_dict(state, CONFIG, layout="torch_nn")
  state["pos_encoder.pe"] = state["pos_encoder.pe"].flip(-1)
  with pytest.raises(ValueError, match="pos_encoder.pe.*interleaved"):
    from_torch_state_dict(state, CONFIG, layout="torch_nn")


@pytest.mark.parametrize("key", ["model", "state_dict", "model_state_dict"])
def test_training_checkpoint_dicts_are_unwrapped(tmp_path, key):
  torch.manual_seed(0)
  model = Classifier()
  optimizer = torch.optim.Adam(model.parameters())
  model(torch.tensor(TOKENS)).sum().backward()
  optimizer.step()
  path = tmp_path / "checkpoint.pt"
  torch.save({key: model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3}, path)
  state = load_torch_checkpoint(path)  # still weights_only=True
  assert set(state) == set(model.state_dict())
  config = config_from_torch_state_dict(state, n_heads=2, prefix="auto")
  variables = from_torch_state_dict(state, config, prefix="auto")
  with jax.default_matmul_precision("highest"):
    np.testing.assert_allclose(Encoder(config).apply(variables, TOKENS), _hidden(model, TOKENS),
                               atol=1e-5)


@pytest.mark.parametrize("norm_position, activation, final_norm",
                         [("post", "relu", True), ("pre", "gelu", False)])
def test_torch_nn_layout_loads_strictly_into_a_transformer_encoder(norm_position, activation,
                                                                   final_norm):
  config = dataclasses.replace(CONFIG, norm_position=norm_position, activation=activation,
                               final_norm=final_norm, dropout=0.0)
  variables = _flax_variables(config)
  state = to_torch_state_dict(variables, config, layout="torch_nn")
  model = TorchNNModel(config, norm_first=norm_position == "pre")
  model.encoder.load_state_dict({k: v for k, v in state.items() if k != "embedding.weight"},
                                strict=True)
  model.embedding.load_state_dict({"weight": state["embedding.weight"]}, strict=True)
  with jax.default_matmul_precision("highest"):
    np.testing.assert_allclose(_hidden(model, TOKENS), Encoder(config).apply(variables, TOKENS),
                               atol=1e-5)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt", ".pth", ".bin"])
def test_every_checkpoint_file_is_written_as_it_is_read(tmp_path, suffix):
  from flax_encoder.pytorch.convert import CHECKPOINT_FILES, save_torch_checkpoint
  assert suffix in CHECKPOINT_FILES
  state = to_torch_state_dict(_flax_variables(), CONFIG)
  path = tmp_path / f"model{suffix}"
  save_torch_checkpoint(state, path)
  loaded = load_torch_checkpoint(path)
  assert sorted(loaded) == sorted(state)
  for name, tensor in state.items():
    np.testing.assert_array_equal(loaded[name], tensor.numpy())
  # a name without the suffix (a temporary file): the format as given
  other = tmp_path / "blob"
  save_torch_checkpoint(state, other, suffix)
  assert other.read_bytes()[:2] == (b"PK" if suffix != ".safetensors" else path.read_bytes()[:2])
  with pytest.raises(ValueError, match=r"has suffix '.ckpt'; expected .safetensors, .pt, .pth, "
                                       r".bin$"):
    save_torch_checkpoint(state, tmp_path / "model.ckpt")


def test_the_export_command_writes_the_pytorch_files_the_bridge_reads():
  from flax_encoder.pytorch.convert import CHECKPOINT_FILES
  from train.outputs.export import FORMATS
  assert [s for s, f in FORMATS.items() if f.torch] == list(CHECKPOINT_FILES)
