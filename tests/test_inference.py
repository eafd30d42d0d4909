"""jit inference: bucketed encoding (one compile per bucket) and jax.export to a file."""

import subprocess
import sys
import textwrap

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_encoder import Encoder
from flax_encoder.inference import BucketedEncoder, export_encoder
from flax_encoder.weights import load_weights, save_weights
from tests import runs

pytestmark = pytest.mark.library  # the library's own: run on accelerators too


@pytest.fixture
def variables(tiny_config):
  return nn.unbox(Encoder(tiny_config).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32)))


def _random_tokens(rng, batch, seq, vocab_size):
  tokens = rng.integers(1, vocab_size, (batch, seq))
  # One right-padded row. Not all padding: a row without a real token averages over all its
  # (masked) positions, so its meaningless output depends on how far it was padded.
  tokens[0, max(1, seq // 2):] = 0
  return tokens


def test_variable_lengths_compile_once_per_bucket_and_match_the_encoder(tiny_config, variables):
  encode = BucketedEncoder(tiny_config, variables, buckets=(8, 16, 24))
  encode._jitted = jax.jit(chex.assert_max_traces(encode._forward, n=3))
  rng = np.random.default_rng(0)
  # The encoder on each unpadded length, compiled whole: op by op, each new length compiled
  # every one of its operations again.
  model = jax.jit(Encoder(tiny_config).apply)
  for seq in (3, 8, 5, 12, 24, 1, 17, 9, 16, 20, 2, 24):
    tokens = _random_tokens(rng, 3, seq, tiny_config.vocab_size)
    out = encode(tokens)
    chex.assert_shape(out, (3, seq, tiny_config.d_model))
    np.testing.assert_allclose(out, model(variables, tokens), atol=2e-6)
  assert encode.bucket(9) == 16


def test_bucketed_encoder_checks_its_inputs(tiny_config, variables):
  encode = BucketedEncoder(tiny_config, variables, buckets=(8, 16))
  with pytest.raises(ValueError, match=r"vocab_size=37\).*got 37 at index \(0, 1\)"):
    encode(np.array([[3, 37, 4]]))
  with pytest.raises(ValueError, match="longer than the largest bucket 16"):
    encode(np.ones((1, 20), np.int32))
  with pytest.raises(ValueError, match=r"buckets must lie in \[1, max_len=24\], got 32"):
    BucketedEncoder(tiny_config, variables, buckets=(8, 32))


LOAD_AND_RUN = textwrap.dedent("""
    import sys
    import jax
    import numpy as np
    exported = jax.export.deserialize(open(sys.argv[1], "rb").read())
    np.save(sys.argv[3], np.asarray(exported.call(np.load(sys.argv[2]))))
    assert not any(m.split(".")[0] in ("flax", "flax_encoder") for m in sys.modules), "imported"
""")


def test_exported_encoder_runs_in_a_fresh_process_without_the_model_code(
    tiny_config, variables, tmp_path):
  path = str(tmp_path / "encoder.jaxexport")
  exported = export_encoder(tiny_config, variables, path, seq_len=16)
  assert exported.platforms == ("cpu", "cuda")
  rng = np.random.default_rng(1)
  tokens = _random_tokens(rng, 5, 16, tiny_config.vocab_size).astype(np.int32)
  tokens[3, 2] = tiny_config.vocab_size  # a bad id: that row must come back NaN
  np.save(tmp_path / "tokens.npy", tokens)
  subprocess.run([sys.executable, "-c", LOAD_AND_RUN, path, str(tmp_path / "tokens.npy"),
                  str(tmp_path / "out.npy")], cwd=tmp_path, check=True, timeout=runs.limit(300))
  out = np.load(tmp_path / "out.npy")
  chex.assert_shape(out, (5, 16, tiny_config.d_model))
  good = [0, 1, 2, 4]
  np.testing.assert_allclose(out[good], Encoder(tiny_config).apply(variables, tokens[good]),
                             atol=2e-6)
  assert np.isnan(out[3]).all() and not np.isnan(out[good]).any()


def test_weights_file_round_trips_the_model_and_the_reader_picks_how_it_runs(
    tiny_config, variables, tmp_path):
  import dataclasses
  cfg = dataclasses.replace(tiny_config, dtype="bfloat16", attention_impl="xla",
                            norm_position="pre", dropout=0.0)
  save_weights(tmp_path / "encoder.msgpack", cfg, variables)
  loaded_cfg, loaded = load_weights(tmp_path / "encoder.msgpack", dtype="bfloat16",
                                    attention_impl="xla", dropout=0.0)
  assert loaded_cfg == cfg
  chex.assert_trees_all_equal(loaded, jax.device_get(variables))
  # What the model is travels with it; how it ran does not: a reader on a CPU gets float32.
  on_cpu, _ = load_weights(tmp_path / "encoder.msgpack")
  assert on_cpu.norm_position == "pre" and on_cpu.dtype == np.float32
  assert on_cpu.attention_impl == "reference"
  with pytest.raises(ValueError, match="EncoderConfig.d_model: 32, expected one of the settings"):
    load_weights(tmp_path / "encoder.msgpack", d_model=32)
  raw = bytearray((tmp_path / "encoder.msgpack").read_bytes())
  raw[len(raw) // 2] ^= 1  # one flipped bit in the parameters
  (tmp_path / "flipped.msgpack").write_bytes(bytes(raw))
  with pytest.raises(ValueError, match=r"flipped.msgpack' is damaged: its contents' SHA-256"):
    load_weights(tmp_path / "flipped.msgpack")
  (tmp_path / "other.msgpack").write_bytes(b"not msgpack at all")
  with pytest.raises(ValueError, match="other.msgpack' is not an encoder weights file"):
    load_weights(tmp_path / "other.msgpack")
