"""The attention registry (`flax_encoder.kernels.KERNELS`): what each implementation declares is
what the config, the Encoder and bucketed inference act on, and what docs/library.md says."""

import dataclasses
import os
import warnings

import jax
import jax.numpy as jnp
import pytest

from flax_encoder import ConfigError, Encoder, EncoderConfig, MultiHeadAttention
from flax_encoder.inference import default_buckets
from flax_encoder import kernels
from flax_encoder.kernels import KERNELS, interpret_kernels
from tests import runs
from tests.runs import ROOT


def _documented_rows() -> dict[str, list[str]]:
  """docs/library.md's table of attention implementations: {name: its other cells}."""
  lines = open(os.path.join(ROOT, "docs", "library.md")).read().splitlines()
  start = lines.index("| `attention_impl` | backend | attends by | local window | dropout | "
                      "dtypes | lengths | status |")
  rows = {}
  for line in lines[start + 2:]:
    if not line.startswith("|"):
      break
    name, *cells = [cell.strip() for cell in line.strip("|").split("|")]
    rows[name.strip('`"')] = cells
  return rows


def test_the_documented_table_is_what_the_registry_declares():
  yes = lambda flag: "yes" if flag else "no"
  expected = {}
  for kernel in KERNELS.values():
    attends = ("segment ids" if kernel.takes_segment_ids else
               "mask, or windows of segment ids in local layers" if kernel.windowed_locals else
               "mask")
    lengths = "any"
    if kernel.block:
      lengths = f"multiple of {kernel.block}" + (
          ", or a power of two below" if kernel.short_powers_of_two else "")
    expected[kernel.name] = [
        (kernel.backend or "any") + (" (Pallas)" if kernel.pallas else ""), attends,
        yes(kernel.takes_window), yes(kernel.has_dropout),
        ", ".join(kernel.dtypes) if kernel.dtypes else "any", lengths,
        "deprecated" if kernel.deprecated else ""]
  rows = _documented_rows()
  assert list(rows) == list(KERNELS)
  for name, cells in expected.items():
    assert rows[name] == cells, name


def test_triton_alone_is_deprecated_and_says_what_replaces_it():
  assert [k.name for k in KERNELS.values() if k.deprecated] == ["triton"]
  message = KERNELS["triton"].deprecated
  assert "Triton" in message and "'cudnn'" in message and "Mosaic GPU" in message
  assert "\n" not in message


@runs.NEEDS_TRITON
def test_a_model_of_triton_attention_warns_once_of_the_deprecation():
  cfg = EncoderConfig(vocab_size=20, d_model=8, n_heads=2, d_ff=16, n_layers=1, max_len=16,
                      dropout=0.0, attention_impl="triton")
  ids = jnp.ones((1, 16), jnp.int32)
  kernels._warn_once.cache_clear()  # as in a new process, whatever ran triton before
  with interpret_kernels(), warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
      MultiHeadAttention(cfg).init(jax.random.key(0), jnp.ones((1, 16, 8)), mask=ids)
  deprecations = [w for w in caught if issubclass(w.category, FutureWarning)]
  assert len(deprecations) == 1, [str(w.message) for w in caught]
  assert str(deprecations[0].message).startswith(
      "attention_impl='triton' is deprecated: JAX deprecates the Pallas Triton backend")


@pytest.fixture
def xla_declared_otherwise(monkeypatch):
  """The "xla" entry declaring what the cuDNN and Pallas entries declare: the callers must
  follow what it says, not its name."""
  monkeypatch.setitem(KERNELS, "xla", dataclasses.replace(
      KERNELS["xla"], dtypes=("bfloat16",), takes_window=False, takes_segment_ids=True,
      windowed_locals=False, block=32, fallback="reference"))


def test_the_config_refuses_what_the_declared_properties_rule_out(xla_declared_otherwise):
  with pytest.raises(ConfigError, match=r"^EncoderConfig.attention_impl: 'xla', expected "
                     r"'reference' for dtype float32: XLA's attention \('xla'\) needs dtype "
                     r"bfloat16$"):
    EncoderConfig(vocab_size=20, attention_impl="xla")
  with pytest.raises(ConfigError, match=r"expected 'reference' with local_attention: XLA's "
                     r"attention takes no window$"):
    EncoderConfig(vocab_size=20, attention_impl="xla", dtype="bfloat16", local_attention=4)


def test_the_encoder_and_the_buckets_follow_the_declared_properties(xla_declared_otherwise):
  cfg = EncoderConfig(vocab_size=20, d_model=8, n_heads=2, d_ff=16, n_layers=1, max_len=256,
                      attention_impl="xla", dtype="bfloat16")
  assert default_buckets(cfg, 256) == [32, 64, 128, 256]
  with pytest.raises(ValueError, match="^attention_impl='xla' attends by segment ids, not by "
                     "a mask: pass segment_ids"):
    Encoder(cfg).init(jax.random.key(0), jnp.ones((1, 32), jnp.int32),
                      jnp.ones((1, 1, 1, 32), bool))


def test_global_layers_lists_which_layers_attend_to_the_whole_sequence():
  local = EncoderConfig(vocab_size=20, n_layers=5, local_attention=8, global_attention_every=3)
  assert local.global_layers == (True, False, False, True, False)
  assert EncoderConfig(vocab_size=20, n_layers=3, global_attention_every=3).global_layers == (
      True, True, True)


@pytest.mark.skipif(runs.TRITON_MISSING is None, reason="this JAX has the Triton kernel")
def test_triton_where_this_jax_has_no_kernel_is_refused_in_one_line():
  # JAX 0.12 removed the Pallas GPU attention it calls: an ImportError at the first call it was
  with pytest.raises(ConfigError) as e:
    EncoderConfig(vocab_size=20, d_model=8, n_heads=2, d_ff=16, n_layers=1, max_len=16,
                  dropout=0.0, attention_impl="triton")
  assert str(e.value).startswith("EncoderConfig.attention_impl: 'triton', expected 'xla' here: "
                                 "this JAX (")
  assert "which JAX 0.12 removed" in str(e.value) and "\n" not in str(e.value)
