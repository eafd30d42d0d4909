import dataclasses
import os
import re

import jax.numpy as jnp
import pytest

from flax_encoder import EncoderConfig

pytestmark = pytest.mark.library  # the library's own: run on accelerators too


def test_defaults_are_the_paper_base_model():
  cfg = EncoderConfig.base(1000)
  assert (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_layers, cfg.dropout) == (512, 8, 2048, 6, 0.1)
  assert cfg.layer_norm_eps == 1e-5 and cfg.norm_position == "post" and cfg.final_norm
  assert cfg.dtype == jnp.float32 and cfg.head_dim == 64


def test_big_preset_and_overrides():
  cfg = EncoderConfig.big(1000, dropout=0.1)
  assert (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout) == (1024, 16, 4096, 0.1)


def test_dtype_strings_are_canonicalised_and_config_is_hashable():
  cfg = EncoderConfig(10, d_model=8, n_heads=2, dtype="bfloat16")
  assert cfg.dtype == jnp.bfloat16
  assert hash(cfg) == hash(dataclasses.replace(cfg))


@pytest.mark.parametrize("overrides, words", [
    (dict(d_model=10, n_heads=4), ["d_model", "n_heads", "10", "4"]),
    (dict(d_model=9, n_heads=3), ["d_model", "even", "9"]),
    (dict(n_layers=0), ["n_layers", "positive", "0"]),
    (dict(vocab_size=-3), ["vocab_size", "-3"]),
    (dict(dropout=1.0), ["dropout", "[0, 1)", "1.0"]),
    (dict(attention_dropout=-0.1), ["attention_dropout", "-0.1"]),
    (dict(norm_position="middle"), ["norm_position", "'middle'", "'post'", "'pre'"]),
    (dict(activation="swish"), ["activation", "'swish'", "'gelu'"]),
    (dict(attention_impl="flash"), ["attention_impl", "'flash'", "'cudnn'"]),
    (dict(dtype="int32"), ["dtype", "int32", "bfloat16"]),
    (dict(pad_id=50), ["pad_id", "50"]),
    (dict(remat="some"), ["remat", "'some'", "'save_dots'"]),
    (dict(attention_impl="cudnn"), ["cudnn", "bfloat16", "float32"]),
    (dict(attention_impl="xla", attention_dropout=0.1), ["attention_dropout", "reference"]),
])
def test_invalid_fields_raise_naming_field_value_and_allowed(overrides, words):
  fields = dict(vocab_size=20, d_model=8, n_heads=2, d_ff=16, n_layers=1)
  with pytest.raises(ValueError) as e:
    EncoderConfig(**{**fields, **overrides})
  for word in words:
    assert word in str(e.value)


def test_every_field_has_one_role_and_a_record_rebuilds_the_model():
  from flax_encoder.config import ROLES
  by_role = {role: EncoderConfig.fields(role) for role in ROLES}
  names = [n for fields in by_role.values() for n in fields]
  assert sorted(names) == sorted(f.name for f in dataclasses.fields(EncoderConfig))
  assert len(names) == len(set(names))
  assert set(by_role["execution"]) == {"dtype", "attention_impl", "remat"}
  cfg = EncoderConfig(50, d_model=8, n_heads=2, d_ff=16, n_layers=1, dtype="bfloat16",
                      attention_impl="xla", scan_layers=True, param_dtype="float16",
                      dropout=0.2)
  record = cfg.record()
  assert set(record) == set(by_role["architecture"] + by_role["parameters"])
  assert record["param_dtype"] == "float16"  # JSON-able
  assert EncoderConfig.from_record(record, dtype="bfloat16", attention_impl="xla",
                                   dropout=0.2) == cfg
  plain = EncoderConfig.from_record(record)
  assert plain.dtype == jnp.float32 and plain.attention_impl == "reference"
  assert plain.scan_layers and plain.param_dtype == jnp.float16


def test_a_reader_may_not_change_what_the_model_is():
  from flax_encoder import ConfigError
  record = EncoderConfig(50, d_model=8, n_heads=2, d_ff=16, n_layers=1).record()
  with pytest.raises(ConfigError) as e:
    EncoderConfig.from_record(record, d_model=16)
  assert e.value.field == "d_model" and "what the model is comes from its record" in str(e.value)
  with pytest.raises(ConfigError, match="^EncoderConfig.remat: 'full', expected a record"):
    EncoderConfig.from_record({**record, "remat": "full"})


def test_config_errors_carry_the_field_the_value_and_what_was_expected():
  from flax_encoder import ConfigError
  with pytest.raises(ConfigError) as e:
    EncoderConfig(20, d_model=10, n_heads=4)
  assert (e.value.field, e.value.value) == ("d_model", 10)
  assert e.value.expected == "a number divisible by n_heads (4)"
  assert str(e.value) == "EncoderConfig.d_model: 10, expected a number divisible by n_heads (4)"


@pytest.mark.parametrize("name", ["default", "base", "big", "small", "subword", "modern",
                                  "classify", "regress", "tag", "embed"])
def test_every_field_of_the_encoder_reaches_each_programs_config(name):
  import importlib
  config = importlib.import_module(f"configs.{name}").get_config()
  fields = {f.name for f in dataclasses.fields(EncoderConfig)}
  assert set(config.model) == fields - {"pad_id"}  # pad_id is the data's


def test_the_default_configs_model_is_the_librarys_but_for_its_sizes():
  from configs import default
  model = default.get_config().model
  differ = {name for name, value in EncoderConfig.defaults().items()
            if name != "pad_id" and model[name] != value}
  assert differ == {"d_model", "n_heads", "d_ff", "n_layers", "dropout", "max_len"}
  assert model.vocab_size is None  # the data's


def test_a_record_of_a_former_field_loads_as_todays_fields_say_it():
  # MPNet's bias was relative_attention_buckets before it was a relative attention part: a
  # run saved then holds it beside an empty relative_attention.
  from flax_encoder import ConfigError
  from flax_encoder.config import FORMER_FIELDS
  now = EncoderConfig(64, d_model=8, n_heads=2, relative_attention="t5_bias,buckets=32")
  record = {**now.record(), "relative_attention": "", "relative_attention_buckets": 32}
  assert EncoderConfig.from_record(record, dropout=0.1) == now
  assert set(FORMER_FIELDS).isdisjoint(now.record())
  none = {**record, "relative_attention_buckets": 0}
  assert EncoderConfig.from_record(none).relative_attention == ""
  with pytest.raises(ConfigError) as e:
    EncoderConfig.from_record({**record, "relative_attention_buckets": 7})
  assert (e.value.field, e.value.value) == ("relative_attention_buckets", 7)
  assert "N even from 4 to 510" in str(e.value)
  with pytest.raises(ConfigError, match="^EncoderConfig.relative_attention: 'disentangled', "
                                        "expected '' with relative_attention_buckets > 0"):
    EncoderConfig.from_record({**record, "relative_attention": "disentangled"})
  # dataclasses.replace does not carry the former field back in beside a new spec
  assert dataclasses.replace(now, relative_attention="").relative_attention == ""


# The fields of the paper's encoder ("Attention Is All You Need", section 3): every model has
# them, whichever families set them.
PAPER_FIELDS = ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len", "pad_id",
                "position_embedding", "embedding_scale", "norm_position", "final_norm",
                "layer_norm_eps", "activation")
DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                    "huggingface.md")
TABLE = "| field | set by | why a switch of the shared encoder |"


def _justified_fields() -> list[str]:
  """The fields of docs/huggingface.md's table of fields one family sets."""
  text = open(DOCS, encoding="utf-8").read()
  assert TABLE in text, f"{DOCS}: no table headed {TABLE!r}"
  rows = []
  for line in text[text.index(TABLE):].splitlines()[2:]:
    if not line.startswith("|"):
      break
    rows.append(re.match(r"\| `(\w+)` \|", line).group(1))
  return rows


def test_a_field_one_family_sets_is_a_switch_the_docs_justify():
  # A family's own machinery is a part it registers (flax_encoder.relative) in its module; a
  # field of the shared encoder that one family alone sets says why in the docs.
  from flax_encoder import families
  defaults = EncoderConfig.defaults()
  presets = [family.preset(64, pad_id=0) for family in families.FAMILIES.values()]
  set_by = {name: sum(getattr(p, name) != defaults.get(name) for p in presets)
            for name in EncoderConfig.fields("architecture")}
  justified = _justified_fields()
  assert set(justified) <= set(set_by), "a row of a field EncoderConfig does not have"
  unexplained = sorted(name for name, n in set_by.items()
                       if n < 2 and name not in PAPER_FIELDS and name not in justified)
  assert not unexplained, (f"architecture fields one family sets, with no row in {DOCS}'s "
                           f"table: {unexplained}")
