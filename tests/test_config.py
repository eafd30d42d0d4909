import dataclasses

import jax.numpy as jnp
import pytest

from flax_encoder import EncoderConfig


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
