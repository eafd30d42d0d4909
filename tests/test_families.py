"""The registry of Hugging Face families (flax_encoder.families): each family reads what it
writes, its preset is what its config.json means, its tensor names go both ways, and a model
from scratch derives the family whose preset it has; and EncoderConfig's cross-field rules."""

import json
import subprocess
import sys

import chex
import flax.linen as nn
import jax
import numpy as np
import pytest

from flax_encoder import ConfigError, Encoder, EncoderConfig, families
from flax_encoder.families import HFError
from tests.runs import ROOT

pytestmark = pytest.mark.library

NAMES = list(families.FAMILIES)
TODAYS = ("bert", "roberta", "distilbert", "modernbert")
# Tiny sizes every preset takes (ModernBERT's pad id 50283 is the base model's: a small
# vocabulary needs its own).
TINY = dict(d_model=16, n_heads=2, d_ff=24, n_layers=2, max_len=32, pad_id=1)


def _tiny(name: str, **changes) -> EncoderConfig:
  return families.get(name).preset(64, **{**TINY, **changes})


def _params(config: EncoderConfig) -> dict:
  return nn.unbox(Encoder(config).init(jax.random.PRNGKey(0), np.ones((1, 4), np.int32))[
      "params"])


def test_every_model_type_reads_as_the_family_that_lists_it():
  read = {t: f.name for t, f in families.MODEL_TYPES.items()}
  assert read.items() >= {"bert": "bert", "electra": "bert", "roberta": "roberta",
                          "xlm-roberta": "roberta", "camembert": "roberta",
                          "distilbert": "distilbert", "modernbert": "modernbert"}.items()
  for name in NAMES:  # each writes its own model_type, and reads it
    assert read[name] == name and families.get(name).name == name
  assert [families.get(n).prefix for n in TODAYS] == ["bert.", "roberta.", "distilbert.",
                                                      "model."]
  with pytest.raises(HFError) as e:
    families.get("gpt2")
  assert str(e.value) == ("family 'gpt2': expected one of ('bert', 'roberta', 'distilbert', "
                          "'modernbert', 'albert', 'mpnet', 'nomic_bert', 'gte', "
                          "'jina_embeddings_v3', 'eurobert', 'deberta-v2')")


@pytest.mark.parametrize("name", NAMES)
def test_a_family_reads_back_its_preset_from_the_config_json_it_writes(name):
  family = families.get(name)
  preset = family.preset(128256)  # the base model's sizes and ids (EuroBERT's pad 128001)
  written = json.loads(json.dumps(families.hf_config(preset, name)))
  assert written["model_type"] == name
  assert families.config_from_hf(written) == preset
  assert families.of_architecture(preset) is family  # a run from scratch exports as it


@pytest.mark.parametrize("name", NAMES)
def test_a_model_is_refused_as_every_other_family_naming_a_field(name):
  for other in NAMES:
    if other == name:
      continue
    with pytest.raises(HFError, match=f"^this model is not a {other} model: it has ") as e:
      families.hf_config(_tiny(name), other)
    assert "\n" not in str(e.value)


def test_the_presets_are_the_base_models():
  preset = {name: families.get(name).preset for name in families.FAMILIES}
  base, learned = preset["bert"](30522), preset["roberta"](50265)
  assert (base.d_model, base.n_layers, base.max_len, base.type_vocab_size) == (768, 12, 512, 2)
  assert (learned.pad_id, learned.position_offset, learned.type_vocab_size) == (1, 2, 1)
  assert preset["roberta"](100, pad_id=0).position_offset == 1
  assert (preset["distilbert"](30522).n_layers,
          preset["distilbert"](30522).type_vocab_size) == (6, 0)
  modern = preset["modernbert"](50368)
  assert (modern.n_layers, modern.d_ff, modern.local_attention, modern.global_attention_every,
          modern.first_attention_norm, modern.norm_position) == (22, 1152, 128, 3, False, "pre")
  assert preset["bert"](100, d_model=64, n_heads=4).d_model == 64  # overrides win


@pytest.mark.parametrize("name", NAMES)
def test_tensor_names_go_both_ways(name):
  config, family = _tiny(name), families.get(name)
  params = _params(config)
  state = families.to_hf_state_dict({"params": params}, config, name, prefix=family.prefix)
  assert all(k.startswith(family.prefix) for k in state)
  hf = families.hf_config(config, name)
  back = families.from_hf_state_dict(state, hf, config)["params"]
  chex.assert_trees_all_equal(back, jax.tree.map(np.asarray, params))


def test_a_safetensors_directory_loads_without_torch(tmp_path):
  pytest.importorskip("safetensors", reason="safetensors is installed with the torch extra")
  import safetensors.numpy
  config = _tiny("roberta")
  params = _params(config)
  safetensors.numpy.save_file(families.to_hf_state_dict({"params": params}, config, "roberta"),
                              str(tmp_path / "model.safetensors"))
  (tmp_path / "config.json").write_text(json.dumps(families.hf_config(config, "roberta")))
  code = ("import sys\nfrom flax_encoder.families import read_hf\n"
          f"model = read_hf({str(tmp_path)!r})\n"
          "assert 'torch' not in sys.modules, 'torch was imported'\n"
          "print(model.family, model.config.position_offset)\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split() == ["roberta", "2"]


def test_the_fine_tuning_defaults_are_the_familys():
  assert [families.get(n).pooling({}) for n in TODAYS] == ["pooler", "pooler", "pre_classifier",
                                                           "first_head"]
  assert families.get("modernbert").pooling({"classifier_pooling": "mean"}) == "mean_head"
  assert [families.get(n).tags_through_head for n in TODAYS] == [False, False, False, True]
  with pytest.raises(HFError, match=r"^the run pools by 'mean'; transformers' "
                                    r"DistilBertForSequenceClassification pools by "
                                    r"'pre_classifier' \(config.task.pooling='pre_classifier'\)$"):
    families.get("distilbert").classifier.check("mean", "DistilBert")


@pytest.mark.parametrize("name", NAMES)
def test_the_parity_stages_name_each_layer(name):
  stages = families.get(name).stages(3)
  assert stages[0][0] == "embeddings"  # after their norm, EuroBERT's (none) the table's rows
  assert [flax for _, flax, _ in stages if flax.startswith("layers_2")][-1] == "layers_2"


# -- EncoderConfig's cross-field rules ------------------------------------------------------

@pytest.mark.parametrize("family, changes, field, named", [
    ("modernbert", dict(scan_layers=True), "scan_layers", "first_attention_norm=False"),
    ("roberta", dict(position_embedding="sinusoidal"), "position_offset", "position_embedding"),
    ("modernbert", dict(norm_position="post"), "first_attention_norm", "norm_position='post'"),
])
def test_switches_that_cannot_go_together_are_refused_when_the_config_is_made(family, changes,
                                                                               field, named):
  with pytest.raises(ConfigError) as e:
    _tiny(family, **changes)
  assert e.value.field == field and named in str(e.value) and "\n" not in str(e.value)
