"""Shared test settings: float32 matmuls at full precision, so that the parity bounds also hold
on GPUs, where JAX otherwise computes them in TF32."""

import jax
import pytest

jax.config.update("jax_default_matmul_precision", "highest")

from flax_encoder import EncoderConfig


@pytest.fixture
def tiny_config():
  return EncoderConfig(vocab_size=37, d_model=16, n_heads=4, d_ff=24, n_layers=2, max_len=24,
                       dropout=0.1)


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory):
  """The workdir of one uninterrupted run of tests/tiny.py's config on one device."""
  from tests import runs
  workdir = str(tmp_path_factory.mktemp("reference"))
  runs.train(workdir)
  return workdir
