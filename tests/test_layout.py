"""The layers of the project, each importing only those below it: benchmarks -> train -> configs
-> flax_encoder; and the library imports no torch (the PyTorch bridge is flax_encoder.pytorch,
behind the `torch` extra) and reads safetensors files only there and in flax_encoder.families
(the `hf` extra), on first use."""

import ast
import os
import pkgutil
import subprocess
import sys

import flax_encoder
from tests.runs import ROOT

LAYERS = ("configs", "train", "benchmarks", "flax_encoder")


def _imports(path):
  """Top-level package names imported anywhere in the file at `path`."""
  names = set()
  for node in ast.walk(ast.parse(open(path).read(), path)):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
      names.add(node.module)
  return {name.split(".")[0] for name in names}


def _sources(package):
  for directory, _, files in os.walk(os.path.join(ROOT, package)):
    for name in files:
      if name.endswith(".py"):
        yield os.path.join(directory, name)


def test_imports_point_only_downward():
  allowed = {"configs": {"configs", "flax_encoder"}, "train": {"configs", "train", "flax_encoder"},
             "benchmarks": {"configs", "benchmarks", "train", "flax_encoder"},
             "flax_encoder": {"flax_encoder"}}
  for package in LAYERS:
    for path in _sources(package):
      ours = _imports(path) & set(LAYERS)
      assert ours <= allowed[package], f"{os.path.relpath(path, ROOT)} imports {ours}"


def test_only_the_pytorch_bridge_imports_torch_and_only_the_readers_safetensors():
  # package -> the folders of flax_encoder whose modules may import it (their extra's)
  allowed = {"torch": {"pytorch"}, "safetensors": {"pytorch", "families"}}
  for path in _sources("flax_encoder"):
    folder = os.path.relpath(path, os.path.join(ROOT, "flax_encoder")).split(os.sep)[0]
    for package in _imports(path) & set(allowed):
      assert folder in allowed[package], f"{os.path.relpath(path, ROOT)} imports {package}"


def test_importing_the_library_imports_no_torch_and_no_program():
  modules = [m.name for m in pkgutil.walk_packages(flax_encoder.__path__, "flax_encoder.")
             if not m.name.startswith("flax_encoder.pytorch")]
  code = ("import importlib, sys\n"
          f"for name in {modules!r}: importlib.import_module(name)\n"
          "import flax_encoder\n"
          "loaded = sorted({m.split('.')[0] for m in sys.modules} & "
          "{'torch', 'safetensors', 'train', 'configs', 'benchmarks'})\n"
          "assert not loaded, loaded\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert len(modules) >= 10  # every library module was imported, not an empty list
