"""The layers of the project, each importing only those below it: benchmarks -> train -> configs
-> flax_encoder; and the library imports no torch (the PyTorch bridge is flax_encoder.pytorch,
behind the `torch` extra) and reads safetensors files only there and in flax_encoder.families
(the `hf` extra), on first use; and no module of the library imports itself back, counting the
imports made in functions and those made by name (importlib.import_module, relative.PARTS)."""

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


def _module_names(root, package="flax_encoder"):
  """Dotted name -> path of every module of `package` under `root` (a package by its
  __init__.py)."""
  modules = {}
  for directory, _, files in os.walk(os.path.join(root, package)):
    for file in files:
      if file.endswith(".py"):
        parts = os.path.relpath(os.path.join(directory, file), root)[:-len(".py")].split(os.sep)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = os.path.join(
            directory, file)
  return modules


def _import_graph(root=ROOT, package="flax_encoder"):
  """Module -> the modules of `package` it may import: by an import statement anywhere in it
  (in a function too: it runs when called), and by any string that is a module's dotted name
  (what `importlib.import_module` is given, directly or from a table such as relative.PARTS)
  or, in a package's __init__, a child's name (the lazy-export tables' values).

  `from a import b` is an edge to the module a.b where there is one, else to a. The parent
  packages an import runs first are not edges: a package's __init__ importing its children is
  how a package is written, and counting them would make every package a cycle."""
  modules = _module_names(root, package)
  graph = {}
  for name, path in modules.items():
    is_package = path.endswith("__init__.py")
    parent = name if is_package else name.rpartition(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
      if isinstance(node, ast.Import):
        edges.update(alias.name for alias in node.names)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: from this package, up level - 1 more
          anchor = parent.split(".")[:len(parent.split(".")) - node.level + 1]
          base = ".".join(anchor + ([base] if base else []))
        for alias in node.names:
          edges.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
      elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        edges.update((node.value, f"{name}.{node.value}") if is_package else (node.value,))
    graph[name] = sorted(edges & set(modules) - {name})
  return graph


def _cycle(graph):
  """One cycle of `graph` as [a, b, …, a], or None: a depth-first search for an edge back to
  a module still on the path."""
  done, path = set(), []

  def visit(name):
    if name in path:
      return path[path.index(name):] + [name]
    if name in done:
      return None
    path.append(name)
    for successor in graph[name]:
      found = visit(successor)
      if found:
        return found
    path.pop()
    done.add(name)
    return None

  return next(filter(None, map(visit, sorted(graph))), None)


def test_the_circle_finder_follows_function_imports_and_module_names_in_strings(tmp_path):
  package = tmp_path / "pkg"
  (package / "sub").mkdir(parents=True)
  files = {
      "__init__.py": 'TABLE = {"Low": "low"}\n',  # a lazy export: pkg -> pkg.low
      "low.py": "def f():\n  from pkg.sub import high\n",  # at call time: -> pkg.sub.high
      "sub/__init__.py": "",
      "sub/high.py": 'import importlib\nPARTS = {"x": "pkg.mid"}\n',  # by name: -> pkg.mid
      "mid.py": "from .sub import high\nfrom . import low\n",  # -> pkg.sub.high, pkg.low
  }
  for file, text in files.items():
    (package / file).write_text(text)
  graph = _import_graph(str(tmp_path), "pkg")
  assert graph == {"pkg": ["pkg.low"], "pkg.low": ["pkg.sub.high"], "pkg.sub": [],
                   "pkg.sub.high": ["pkg.mid"], "pkg.mid": ["pkg.low", "pkg.sub.high"]}
  assert _cycle(graph) == ["pkg.low", "pkg.sub.high", "pkg.mid", "pkg.low"]
  assert _cycle({**graph, "pkg.sub.high": []}) is None


def test_the_library_imports_no_circle():
  graph = _import_graph()
  cycle = _cycle(graph)
  assert cycle is None, "an import circle: " + " -> ".join(cycle)


def _module_classes(path) -> list[str]:
  """The classes in the file at `path` that subclass a Module (nn.Module, or one of the
  library's by a name ending in Module)."""
  found = []
  for node in ast.walk(ast.parse(open(path).read(), path)):
    if isinstance(node, ast.ClassDef):
      bases = [ast.unparse(base) for base in node.bases]
      if any(base.endswith("Module") for base in bases):
        found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name}")
  return found


def test_the_program_defines_no_model_of_its_own():
  # One definition of each model kind, in the library: what training trains is what inference
  # applies to a folder's weights, by construction.
  assert _module_classes(os.path.join(ROOT, "flax_encoder", "masked_lm.py"))  # the check finds
  found = [c for path in _sources("train") for c in _module_classes(path)]
  assert not found, f"modules defined in train/: {found}"


def test_every_time_limit_of_the_tests_scales_by_the_suites_factor():
  """A limit on a subprocess or a wait is `runs.limit(seconds)`, which a slow or busy machine
  scales; a number alone failed correct code on a loaded 2-core machine."""
  fixed = []
  for name in sorted(os.listdir(os.path.join(ROOT, "tests"))):
    if not name.endswith(".py"):
      continue
    path = os.path.join(ROOT, "tests", name)
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      numbers = []
      if isinstance(node, ast.Call):  # timeout=300
        numbers = [k.value for k in node.keywords if k.arg == "timeout"]
      elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # time.time() + 60
        numbers = [node.right] if _is_clock(node.left) else []
      elif isinstance(node, ast.Compare):  # time.time() - started < 30
        numbers = node.comparators if _is_clock(getattr(node.left, "left", None)) else []
      fixed += [f"tests/{name}:{n.lineno}" for n in numbers if isinstance(n, ast.Constant)]
  assert not fixed, f"fixed time limits (use runs.limit): {fixed}"


def _is_clock(node) -> bool:
  """Whether `node` calls time.time() or time.monotonic()."""
  return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr in ("time", "monotonic", "perf_counter"))
