"""What load_hf takes from a Hugging Face directory, checked against what transformers makes of
the same files: every config.json field read as transformers reads it or refused in one line
naming it, every tensor's shape, shards that stay in the directory, the weights config.json
does not name, and the parity report's own refusals."""

import json
import os
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import safetensors.torch  # noqa: E402

from flax_encoder import Encoder  # noqa: E402
from flax_encoder.pytorch import parity  # noqa: E402
from flax_encoder.families import (HFError, config_from_hf, from_hf_state_dict,  # noqa: E402
                                   load_hf, read_hf_config, read_hf_weights)
from tests import runs  # noqa: E402
from tests.hf_models import write  # noqa: E402
from tests.test_hf import SIZES, hf_model, saved  # noqa: E402
from tests.test_modernbert import modernbert, run  # noqa: E402

pytestmark = pytest.mark.library

MODERNBERT = dict(vocab_size=99, hidden_size=32, intermediate_size=40, num_hidden_layers=4,
                  num_attention_heads=4, local_attention=16, global_attn_every_n_layers=3,
                  pad_token_id=0)


def written(config) -> dict:
  """The config.json transformers writes for `config`."""
  return json.loads(config.to_json_string())


def base(family: str) -> dict:
  if family == "modernbert":
    return written(transformers.ModernBertConfig(**MODERNBERT))
  if family == "distilbert":
    return written(transformers.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4,
                                                 hidden_dim=37, max_position_embeddings=64))
  name = {"bert": "BertConfig", "roberta": "RobertaConfig", "electra": "ElectraConfig"}[family]
  return written(getattr(transformers, name)(**SIZES, **(
      {"embedding_size": 32} if family == "electra" else {})))


def _rewrite(directory, drop=(), **changes):
  file = os.path.join(directory, "config.json")
  with open(file) as f:
    config = json.load(f)
  config = {k: v for k, v in {**config, **changes}.items() if k not in drop}
  with open(file, "w") as f:
    json.dump(config, f)


# -- config.json, field by field -----------------------------------------------------------

@pytest.mark.parametrize("window", [0, 1, 2, 3])
def test_a_modernbert_window_of_any_width_computes_what_transformers_computes(window, tmp_path):
  # transformers' window is local_attention // 2 either way: 0 and 1 each see themselves alone.
  model = modernbert(tmp_path, local_attention=window)
  ids = np.random.default_rng(0).integers(3, 99, (2, 12))
  ids[-1, 10:] = 0
  want = run(model, ids).hidden_states[-1].numpy()
  real = ids != 0
  for impl in ("reference", "xla"):
    config, variables = load_hf(tmp_path, attention_impl=impl)
    assert [config.is_global(i) for i in range(4)] == [True, False, False, True]
    got = np.asarray(Encoder(config).apply(variables, ids))
    np.testing.assert_allclose(got[real], want[real], rtol=0, atol=1e-5, err_msg=impl)


@pytest.mark.parametrize("change, drop", [
    ({}, ()),
    ({}, ("layer_types",)),  # global every global_attn_every_n_layers
    ({}, ("layer_types", "global_attn_every_n_layers")),  # transformers' default: every 3
    (dict(layer_types=["full_attention", "sliding_attention"] * 2),
     ("global_attn_every_n_layers",)),
    (dict(layer_types=["full_attention"] + ["sliding_attention"] * 3),
     ("global_attn_every_n_layers",)),
    ({}, ("rope_parameters",)),  # transformers' bases: 160000 global, 10000 local
    (dict(global_rope_theta=5000.0, local_rope_theta=50.0), ("rope_parameters",)),
    (dict(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 7.0}}), ()),
    (dict(local_attention=0), ()),
    (dict(local_attention=5), ()),
])
def test_modernbert_fields_are_read_as_transformers_reads_them(change, drop):
  hf = {k: v for k, v in {**base("modernbert"), **change}.items() if k not in drop}
  ours = config_from_hf(hf)
  theirs = transformers.ModernBertConfig.from_dict(hf)
  assert [ours.is_global(i) for i in range(4)] == [
      kind == "full_attention" for kind in theirs.layer_types]
  assert ours.rope_theta == theirs.rope_parameters["full_attention"]["rope_theta"]
  assert ours.local_rope_theta == theirs.rope_parameters["sliding_attention"]["rope_theta"]
  assert ours.local_attention // 2 == theirs.sliding_window
  assert ours.pad_id == theirs.pad_token_id


def test_a_roberta_config_without_pad_token_id_pads_with_transformers_default():
  hf = {k: v for k, v in base("roberta").items() if k != "pad_token_id"}
  config = config_from_hf(hf)
  assert config.pad_id == transformers.RobertaConfig.from_dict(hf).pad_token_id == 1
  assert (config.position_offset, config.max_len) == (2, 62)


@pytest.mark.parametrize("family, change, named", [
    ("modernbert", dict(local_attention=-2), "local_attention=-2, expected an integer >= 0"),
    ("modernbert", dict(local_attention=True), "local_attention=True"),
    ("modernbert", dict(global_attn_every_n_layers=0), "global_attn_every_n_layers=0"),
    ("modernbert", dict(rope_parameters=[1]), "rope_parameters=[1]"),
    ("modernbert", dict(rope_parameters={"full_attention": {"rope_theta": "big"}}),
     "rope_parameters.full_attention.rope_theta='big', expected a number > 0"),
    ("modernbert", dict(rope_parameters={"global": {}}), "rope_parameters="),
    ("modernbert", dict(rope_parameters={"full_attention": None}),
     "rope_parameters.full_attention=None, expected an object"),
    ("modernbert", dict(rope_parameters=None, global_rope_theta="big"),
     "global_rope_theta='big'"),
    ("modernbert", dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_scaling="),
    ("modernbert", dict(num_hidden_layers="three"), "num_hidden_layers='three'"),
    ("modernbert", dict(num_hidden_layers=5), "layer_types=["),
    ("modernbert", dict(layer_types="full_attention"), "layer_types='full_attention'"),
    ("modernbert", dict(hidden_activation=["gelu"]), "hidden_activation=['gelu']"),
    ("modernbert", dict(head_dim=16), "head_dim=16"),
    ("modernbert", dict(norm_eps=0), "norm_eps=0"),
    ("modernbert", dict(norm_bias="no"), "norm_bias='no', expected true or false"),
    ("modernbert", dict(attention_dropout=1.5), "attention_dropout=1.5"),
    ("modernbert", dict(classifier_pooling="max"), "classifier_pooling='max'"),
    ("modernbert", dict(pad_token_id=500),
     "pad_token_id=500, expected an id in [0, vocab_size=99)"),
    ("bert", dict(model_type=["bert"]), "model_type=['bert']"),
    ("bert", dict(hidden_act=["gelu"]), "hidden_act=['gelu']"),
    ("bert", dict(hidden_size=30), "hidden_size=30, expected a multiple of num_attention_heads=4"),
    ("bert", dict(vocab_size=99.0), "vocab_size=99.0, expected an integer"),
    ("bert", dict(num_hidden_layers=True), "num_hidden_layers=True"),
    ("bert", dict(type_vocab_size=0), "type_vocab_size=0"),
    ("bert", dict(layer_norm_eps="small"), "layer_norm_eps='small'"),
    ("bert", dict(layer_norm_eps=float("nan")), "layer_norm_eps=nan"),
    ("bert", dict(layer_norm_eps=10**400), "layer_norm_eps=1000"),
    ("bert", dict(hidden_dropout_prob=1.0), "hidden_dropout_prob=1.0, expected a number in [0, 1)"),
    ("bert", dict(is_decoder="yes"), "is_decoder='yes'"),
    ("bert", dict(tie_word_embeddings="no"), "tie_word_embeddings='no'"),
    ("bert", dict(max_position_embeddings=None), "max_position_embeddings=None"),
    ("roberta", dict(vocab_size=300, pad_token_id=200),
     "max_position_embeddings=64, expected an integer > pad_token_id + 1 = 201"),
    ("roberta", dict(pad_token_id=None), "pad_token_id=None"),
    ("distilbert", dict(dim="32"), "dim='32'"),
    ("distilbert", dict(activation=3), "activation=3"),
    ("electra", dict(embedding_size=None), "embedding_size=None"),
])
def test_a_field_transformers_would_read_otherwise_is_one_line_naming_it(family, change, named):
  with pytest.raises(HFError) as e:
    config_from_hf({**base(family), **change}, file="d/config.json")
  message = str(e.value)
  assert message.startswith("d/config.json") and named in message and "\n" not in message


def test_fields_left_out_take_transformers_defaults_or_are_refused():
  hf = {k: v for k, v in base("electra").items() if k != "embedding_size"}  # ELECTRA's is 128
  with pytest.raises(HFError, match="embedding_size=128 is not supported"):
    config_from_hf(hf)
  hf = {k: v for k, v in base("bert").items() if k != "hidden_size"}
  with pytest.raises(HFError, match="hidden_size missing, expected an integer >= 1"):
    config_from_hf(hf)


def test_a_model_type_json_cannot_hash_is_one_line(tmp_path):
  saved(hf_model("bert"), tmp_path)
  _rewrite(tmp_path, model_type=["bert"])
  with pytest.raises(HFError, match=r"config.json: model_type \['bert'\] is not one"):
    read_hf_config(tmp_path)


# -- sizes against the weights --------------------------------------------------------------

@pytest.mark.parametrize("family, change, drop, named", [
    ("bert", dict(num_hidden_layers=10**8), (), "num_hidden_layers=100000000, but the weights "
                                                "hold 2 layers"),
    ("modernbert", dict(num_hidden_layers=10**8), ("layer_types",),
     "num_hidden_layers=100000000, but the weights hold 3 layers"),
    ("modernbert", dict(num_hidden_layers=10**8), (), "layer_types=["),
    ("bert", dict(vocab_size=10**9), (), "word_embeddings.weight' has shape (119, 32), "
                                          "expected (1000000000, 32)"),
    ("bert", dict(hidden_size=2**20, num_attention_heads=1), (),
     "word_embeddings.weight' has shape (119, 32), expected (119, 1048576)"),
])
def test_a_config_larger_than_its_weights_fails_at_once(family, change, drop, named, tmp_path):
  write(tmp_path, family=family)
  _rewrite(tmp_path, drop, **change)
  start = time.perf_counter()
  with pytest.raises(HFError) as e:
    load_hf(tmp_path)
  assert time.perf_counter() - start < runs.limit(1.0)
  assert named in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert", "modernbert"])
def test_every_tensor_of_another_shape_is_refused_naming_it(family, tmp_path):
  directory = write(tmp_path, family=family)
  hf = read_hf_config(directory)
  config = config_from_hf(hf)
  state = read_hf_weights(directory)
  checked = [k for k in state if not k.startswith("cls.seq_relationship.")]
  assert len(checked) > 20
  for key in checked:
    value = state[key]
    wrong = np.zeros((*value.shape[:-1], value.shape[-1] + 1), value.dtype)
    with pytest.raises(HFError) as e:
      from_hf_state_dict({**state, key: wrong}, hf, config)
    assert str(e.value) == (f"{key!r} has shape {wrong.shape}, expected {value.shape} from "
                            f"config.json")
  with pytest.raises(HFError, match="has shape \\(1, 32\\), expected \\(32,\\)"):
    key = next(k for k in state if k.endswith("norm.weight") or k.endswith("LayerNorm.weight"))
    from_hf_state_dict({**state, key: state[key][None]}, hf, config)


# -- shards -------------------------------------------------------------------------------

def _shard(directory, outside, how: str) -> str:
  """Splits the directory's model.safetensors into two shards and an index; the second shard
  is named `how` ('inside', 'absolute', 'dotdot', 'link'), `outside` a folder beside it."""
  state = safetensors.torch.load_file(os.path.join(directory, "model.safetensors"))
  os.remove(os.path.join(directory, "model.safetensors"))
  keys = sorted(state)
  first, second = keys[: len(keys) // 2], keys[len(keys) // 2:]
  safetensors.torch.save_file({k: state[k] for k in first},
                              os.path.join(directory, "a.safetensors"))
  outside.mkdir(exist_ok=True)
  where = outside if how in ("absolute", "dotdot", "link") else directory
  safetensors.torch.save_file({k: state[k] for k in second}, os.path.join(where, "b.safetensors"))
  name = {"inside": "b.safetensors", "absolute": str(outside / "b.safetensors"),
          "dotdot": f"../{outside.name}/b.safetensors", "link": "link.safetensors"}[how]
  if how == "link":
    os.symlink(outside / "b.safetensors", os.path.join(directory, name))
  weight_map = {**{k: "a.safetensors" for k in first}, **{k: name for k in second}}
  with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)
  return name


@pytest.mark.parametrize("how", ["absolute", "dotdot", "link"])
def test_a_shard_outside_the_directory_is_refused(how, tmp_path):
  directory = write(tmp_path / "model", family="bert")
  name = _shard(directory, tmp_path / "elsewhere", how)
  with pytest.raises(HFError) as e:
    load_hf(directory)
  message = str(e.value)
  assert message.startswith(os.path.join(directory, "model.safetensors.index.json"))
  assert f"shard {name!r} leads out of {directory}" in message and "\n" not in message


def test_shards_in_the_directory_or_in_huggingface_hub_s_cache_load(tmp_path):
  directory = write(tmp_path / "model", family="bert")
  want = load_hf(directory)[1]
  _shard(directory, tmp_path / "elsewhere", "inside")
  np.testing.assert_array_equal(load_hf(directory)[1]["params"]["layers_1"]["norm2"]["scale"],
                                want["params"]["layers_1"]["norm2"]["scale"])
  # huggingface_hub's cache: repo/snapshots/<revision>/<file> -> ../../blobs/<hash>
  repo = tmp_path / "models--tiny"
  snapshot, blobs = repo / "snapshots" / "abc", repo / "blobs"
  snapshot.mkdir(parents=True)
  blobs.mkdir()
  for name in os.listdir(directory):
    os.rename(os.path.join(directory, name), blobs / name)
    os.symlink(f"../../blobs/{name}", snapshot / name)
  np.testing.assert_array_equal(load_hf(snapshot)[1]["params"]["layers_1"]["norm2"]["scale"],
                                want["params"]["layers_1"]["norm2"]["scale"])


# -- weights config.json does not name ----------------------------------------------------

def test_weights_config_json_does_not_name_are_left_out_with_a_warning(tmp_path):
  model = hf_model("bert", num_hidden_layers=3)
  saved(model, tmp_path)
  _rewrite(tmp_path, num_hidden_layers=2)
  with pytest.warns(UserWarning) as caught:
    config, _ = load_hf(tmp_path)
  assert config.n_layers == 2 and len(caught) == 1
  message = str(caught[0].message)
  assert message.startswith("load_hf left out 16 of the encoder's weights, which its "
                            "config.json does not name: bert.encoder.layer.2.")
  assert "\n" not in message


def test_a_weight_no_module_of_the_config_reads_is_warned_of(tmp_path):
  directory = write(tmp_path, family="modernbert")
  hf, state = read_hf_config(directory), read_hf_weights(directory)
  state["model.layers.0.attn_norm.weight"] = np.ones(32, np.float32)  # layer 0 has none
  with pytest.warns(UserWarning, match=r"^load_hf left out 1 of the encoder's weights, which its "
                                       r"config.json does not name: "
                                       r"model.layers.0.attn_norm.weight$"):
    from_hf_state_dict(state, hf, config_from_hf(hf))


def test_heads_and_index_buffers_it_does_not_read_are_not_warned_of(tmp_path):
  directory = write(tmp_path / "pretraining", family="bert")  # with the NSP head
  # A published BERT's pytorch_model.bin: int64 position and token-type ids beside the weights.
  state = safetensors.torch.load_file(os.path.join(directory, "model.safetensors"))
  os.remove(os.path.join(directory, "model.safetensors"))
  state["bert.embeddings.position_ids"] = torch.arange(66)[None]
  state["bert.embeddings.token_type_ids"] = torch.zeros(1, 66, dtype=torch.int64)
  torch.save(state, os.path.join(directory, "pytorch_model.bin"))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    config, variables = load_hf(directory)
  assert set(variables["heads"]) == {"pooler", "masked_lm"}


def test_a_weight_that_is_not_floating_point_is_one_line_naming_it(tmp_path):
  directory = write(tmp_path, family="bert")
  state = safetensors.torch.load_file(os.path.join(directory, "model.safetensors"))
  state["bert.embeddings.LayerNorm.weight"] = torch.ones(32, dtype=torch.int32)
  safetensors.torch.save_file(state, os.path.join(directory, "model.safetensors"))
  with pytest.raises(ValueError) as e:
    load_hf(directory)
  assert "'bert.embeddings.LayerNorm.weight' holds torch.int32 values, expected floating-point" \
      in str(e.value) and "model.safetensors" in str(e.value) and "\n" not in str(e.value)


# -- the parity report --------------------------------------------------------------------

def test_the_report_on_a_checkpoint_with_integer_tensors(tmp_path, capsys):
  from flax_encoder import EncoderConfig
  from flax_encoder.pytorch import reference
  config = EncoderConfig(vocab_size=20, d_model=8, n_heads=2, d_ff=16, n_layers=1, max_len=16)
  state = reference.Encoder(config, "tutorial").state_dict()
  path = tmp_path / "model.pt"
  torch.save({**state, "embedding.position_ids": torch.arange(16)}, path)
  assert parity.main(["--checkpoint", str(path), "--n-heads", "2", "--seq-len", "8"]) == 0
  assert "PASS" in capsys.readouterr().out
  torch.save({**state, "layers.0.steps": torch.tensor(3)}, path)
  assert parity.main(["--checkpoint", str(path), "--n-heads", "2"]) == 2
  err = capsys.readouterr().err
  assert err == (f"parity: error: checkpoint {str(path)!r}: 'layers.0.steps' holds torch.int64 "
                 f"values, expected floating-point weights\n")


@pytest.mark.parametrize("flag", ["--seq-len", "--batch"])
@pytest.mark.parametrize("value", ["0", "-1", "x"])
def test_the_report_refuses_an_empty_batch_in_one_line(flag, value, capsys):
  with pytest.raises(SystemExit) as e:
    parity.main(["--vocab-size", "20", "--d-model", "8", "--n-heads", "2", flag, value])
  assert e.value.code == 2
  assert capsys.readouterr().err.splitlines()[-1].endswith(
      f"error: argument {flag}: {value!r}, expected an integer >= 1")


@pytest.mark.parametrize("tokens", ["[]", "[[]]", "[[1.5]]", "[[1, 2], [3]]", "x", "[[true]]"])
def test_the_report_refuses_tokens_it_cannot_run_in_one_line(tokens, capsys):
  assert parity.main(["--vocab-size", "20", "--d-model", "8", "--n-heads", "2",
                      "--tokens", tokens]) == 2
  assert capsys.readouterr().err == (
      f"parity: error: --tokens {tokens!r}: expected a JSON list of rows of integer ids, all of "
      f"one length, e.g. '[[5, 6, 7, 0]]'\n")
