"""The documentation says what the code has. README.md and docs/*.md name modules, commands,
flags, config fields and files; each of those names is checked against the checkout, so a
rename or a removal fails here instead of leaving the docs wrong:

- a module (`flax_encoder.x.y`, `train.embed`, `python -m benchmarks.retrieval`) is a file of
  the checkout, and a name after it (`flax_encoder.weights.load_weights`) is defined at the top
  level of that file; `from flax_encoder.x import y` in a code block alike;
- each `python -m X` of this repository in a code block answers `X --help`, and every `--flag`
  of a command (in a code block or inline) is one X's help lists;
- each `--config.a.b=` of a `python -m train` command is a field of the config file it runs
  (`--config=configs/X.py`, else train/__main__.py's default), and each `config.a.b` or
  `--config.a.b` the prose names is a field of some configs/*.py;
- each file path (links, `configs/x.py`, `tests/test_x.py`, `families/bert.py`) exists, and a
  link's `#anchor` is a heading of the file it points to;
- docs/library.md's table of EncoderConfig's fields by role lists each field once, under its
  role;
- every Hugging Face family and every task is named wherever the families or the tasks are
  listed: docs/huggingface.md's table of model types, docs/architecture.md, the docstrings of
  flax_encoder.families, train.task and train.outputs.predict, and the parity report's --help.

Placeholders are values, not names: DIR, FILE, runs/…, `<name>` and globs are not looked up.
The functions below take the texts, so the tests after them hold each check to a wrong name.
"""

import ast
import concurrent.futures
import dataclasses
import functools
import glob
import importlib
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from flax_encoder import EncoderConfig
from flax_encoder.config import ROLES
from tests import runs

ROOT = runs.ROOT
DOCS = ["README.md"] + sorted(os.path.relpath(p, ROOT)
                              for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
# The repository's own top-level packages, whose modules the docs name.
PACKAGES = ("flax_encoder", "train", "benchmarks", "configs", "tests")
# Top-level folders and files of the checkout that a path in the docs may start with.
TOP = PACKAGES + ("docs", ".ci", "BENCHMARKS.md", "README.md", "pyproject.toml")
# Names that look like the checkout's paths but are not: another project's file, and the
# TensorBoard tags of a run's metrics.
NOT_PATHS = {"run_mlm.py",  # transformers' masked-LM example
             "train/loss"}
# What a dotted name ends with when it is a data file (`train.bin`), not a module.
DATA_SUFFIXES = {"bin", "json", "jsonl", "txt", "npy", "parquet", "msgpack", "safetensors",
                 "pt", "gz", "zst", "model", "md", "py", "png", "jaxexport"}


def _read(doc: str) -> str:
  with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
    return f.read()


# -- reading a document --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Block:
  """A fenced code block: the line of its opening fence, its language and its text."""
  line: int
  lang: str
  text: str

  def lines(self) -> list[tuple[int, str]]:
    """(line in the document, text) of each line, a line ending in a backslash joined with
    the next."""
    out, pending = [], None
    for n, line in enumerate(self.text.splitlines(), self.line + 1):
      if pending:
        pending = (pending[0], pending[1] + " " + line.strip())
      else:
        pending = (n, line)
      if pending[1].endswith("\\"):
        pending = (pending[0], pending[1][:-1].rstrip())
      else:
        out.append(pending)
        pending = None
    return out + ([pending] if pending else [])


def blocks(text: str) -> list[Block]:
  return [Block(text.count("\n", 0, m.start()) + 1, m.group(2), m.group(3))
          for m in re.finditer(r"^( *)```(\w*)\n(.*?)^\1```", text, re.S | re.M)]


def prose(text: str) -> str:
  """The text without its fenced blocks (each replaced by as many newlines, so lines count)."""
  return re.sub(r"^( *)```.*?^\1```", lambda m: "\n" * m.group(0).count("\n"), text,
                flags=re.S | re.M)


def spans(text: str) -> list[tuple[int, str]]:
  """The inline code of the prose, (line, code), its whitespace runs made one space (a span
  may cross a line break)."""
  text = prose(text)
  return [(text.count("\n", 0, m.start()) + 1, re.sub(r"\s+", " ", m.group(1)).strip())
          for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text)]


@dataclasses.dataclass(frozen=True)
class Command:
  """A `python -m MODULE ...` command: where it is, the module, its arguments' text, and
  whether it sits in a code block."""
  where: str
  module: str
  args: str
  fenced: bool

  def flags(self) -> list[tuple[str, str | None]]:
    """(--flag, its value) for each flag (`--x=v` or `--x v`); for `train.launch`, the flags
    before `--` only."""
    args = self.args.split(" -- ")[0] if self.module == "train.launch" else self.args
    return _flags(args)

  def program(self) -> "Command | None":
    """What `train.launch` starts with the arguments after `--`."""
    if self.module != "train.launch" or " -- " not in self.args:
      return None
    before, after = self.args.split(" -- ", 1)
    program = dict(_flags(before)).get("--program") or "train"
    return Command(self.where, "train" if program == "train" else f"train.{program}", after,
                   self.fenced)


def _flags(args: str) -> list[tuple[str, str | None]]:
  tokens = re.findall(r"""(?:'[^']*'|"[^"]*"|[^\s\[\]|])+""", args)
  found = []
  for i, token in enumerate(tokens):
    m = re.fullmatch(r"(--[A-Za-z][\w.-]*)(?:=(.*))?", token)
    if m:
      value = m.group(2)
      if value is None and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
        value = tokens[i + 1]
      found.append((m.group(1), value.strip("'\"") if value else value))
  return found


def _command(where: str, line: str, start: int, fenced: bool) -> Command | None:
  m = re.compile(r"python -m ([\w.]+)").match(line, start)
  rest = line[m.end():]
  if line.count('"', 0, start) % 2:  # inside --command="...": it ends at the quote
    rest = rest.split('"')[0]
  rest = re.split(r"\s#|&&|;|\|\s", rest)[0]
  return Command(where, m.group(1), rest.strip(), fenced)


def commands(doc: str, text: str) -> list[Command]:
  found = []
  for block in blocks(text):
    for n, line in block.lines():
      for m in re.finditer(r"python -m [\w.]+", line):
        found.append(_command(f"{doc}:{n}", line, m.start(), True))
  for line, code in spans(text):
    for m in re.finditer(r"python -m [\w.]+", code):
      found.append(_command(f"{doc}:{line}", code, m.start(), False))
  return found


# -- what the checkout has -----------------------------------------------------------------

def module_file(name: str) -> str | None:
  """The file of module `name` in the checkout (a package's __init__.py), or None."""
  base = os.path.join(ROOT, *name.split("."))
  for path in (base + ".py", os.path.join(base, "__init__.py")):
    if os.path.isfile(path):
      return path
  return None


@functools.cache
def top_level_names(path: str) -> frozenset[str]:
  """What a module defines or imports at its top level (inside if / try too)."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  names = set()

  def visit(body):
    for node in body:
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names.add(node.name)
      elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
          names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
      elif isinstance(node, (ast.Import, ast.ImportFrom)):
        names.update((a.asname or a.name).split(".")[0] for a in node.names)
      elif isinstance(node, (ast.If, ast.Try)):
        visit(node.body + node.orelse + getattr(node, "finalbody", [])
              + [n for h in getattr(node, "handlers", []) for n in h.body])
  visit(tree.body)
  if "__getattr__" in names:  # a package whose names load lazily, listed in a dict literal
    for node in tree.body:
      if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
        names.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
  return frozenset(names)


def config_of(path: str):
  """configs/X.py's get_config(), or None where `path` is no config file of the checkout."""
  if not re.fullmatch(r"configs/\w+\.py", path) or not os.path.isfile(os.path.join(ROOT, path)):
    return None
  return importlib.import_module(path[:-3].replace("/", ".")).get_config()


def default_config() -> str:
  """The config file `python -m train` runs without --config, as train/__main__.py says."""
  with open(os.path.join(ROOT, "train", "__main__.py"), encoding="utf-8") as f:
    m = re.search(r'os\.path\.dirname\(configs\.__file__\), "(\w+\.py)"', f.read())
  assert m, "train/__main__.py: its default --config is no longer found where it was"
  return f"configs/{m.group(1)}"


def has_field(config, path: str) -> bool:
  node = config
  for part in path.split("."):
    if not hasattr(node, "keys") or part not in node.keys():
      return False
    node = node[part]
  return True


@functools.cache
def all_configs() -> tuple:
  return tuple(config_of(os.path.relpath(p, ROOT))
               for p in sorted(glob.glob(os.path.join(ROOT, "configs", "*.py")))
               if not p.endswith("__init__.py"))


def _any_config_has(path: str) -> bool:
  return any(has_field(c, path) for c in all_configs())


@functools.cache
def repo_files() -> frozenset[str]:
  """Every file and folder of the checkout, relative to its root ('/'-separated)."""
  out = set()
  for top in TOP:
    full = os.path.join(ROOT, top)
    out.add(top)
    for dirpath, dirnames, filenames in os.walk(full):
      dirnames[:] = [d for d in dirnames if d != "__pycache__"]
      rel = os.path.relpath(dirpath, ROOT).replace(os.sep, "/")
      out.update([rel] + [f"{rel}/{n}" for n in filenames])
  return frozenset(out)


def _slug(heading: str) -> str:
  """A heading's anchor, as GitHub makes it."""
  heading = re.sub(r"[`*]|\[([^]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
  return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def anchors(path: str) -> set[str]:
  with open(path, encoding="utf-8") as f:
    return {_slug(h) for h in re.findall(r"^#+ (.*)$", prose(f.read()), re.M)}


# -- the checks: each returns its problems, one line each ----------------------------------

NAME = re.compile(r"(?<![\w./=@-])((?:%s)(?:\.[A-Za-z_]\w*)+)" % "|".join(PACKAGES))


def name_problem(name: str) -> str | None:
  """Why the dotted name `name` (a module, maybe an attribute after it) is not in the
  checkout; None where it is."""
  parts = name.split(".")
  if parts[-1] in DATA_SUFFIXES:
    return None
  for n in range(len(parts), 0, -1):
    path = module_file(".".join(parts[:n]))
    if path:
      break
  else:
    return f"{name}: no such module"
  if n == len(parts):
    return None
  if parts[n] in top_level_names(path):
    return None
  if n == 1 and parts[0] == "train" and _any_config_has(name):  # `train.seq_len`: a field
    return None
  return (f"{name}: {'.'.join(parts[:n])} ({os.path.relpath(path, ROOT)}) has no module or "
          f"name {parts[n]!r}")


def module_problems(doc: str, text: str) -> list[str]:
  problems = []
  for line, code in spans(text):
    run = set(re.findall(r"python -m ([\w.]+)", code))  # the command's own check names it
    problems += [f"{doc}:{line}: {p}" for p in map(name_problem, NAME.findall(code))
                 if p and p.split(":")[0] not in run]
  for block in blocks(text):
    for m in re.finditer(r"^[ \t]*from ([\w.]+) import (\([^)]*\)|[\w, ]+)", block.text, re.M):
      if m.group(1).split(".")[0] not in PACKAGES:
        continue
      line = block.line + 1 + block.text.count("\n", 0, m.start())
      for name in [m.group(1)] + [f"{m.group(1)}.{n.split()[0]}"
                                  for n in m.group(2).strip("()").split(",") if n.strip()]:
        problem = name_problem(name)
        if problem:
          problems.append(f"{doc}:{line}: {problem}")
  for command in commands(doc, text):
    if command.module.split(".")[0] in PACKAGES and not module_file(command.module):
      problems.append(f"{command.where}: python -m {command.module}: no such module")
  return problems


def _path_problem(doc: str, path: str) -> str | None:
  """A repo path named in `doc`: one that starts at the root (configs/x.py) or, ending in
  .py or .md, one that some file of the checkout ends with (families/bert.py, config.py)."""
  path = path.rstrip("/")
  if re.search(r"[<>*{}$…]|\.\.\.", path) or path in NOT_PATHS:
    return None
  if path.split("/")[0] in TOP:
    return None if path in repo_files() else f"{path}: no such file or folder"
  if re.fullmatch(r"[\w./-]+\.(py|md)", path):
    if any(f == path or f.endswith("/" + path) for f in repo_files()):
      return None
    return f"{path}: no file of the checkout ends so"
  return None


def path_problems(doc: str, text: str) -> list[str]:
  problems = []
  body = prose(text)
  here = os.path.dirname(os.path.join(ROOT, doc))
  for m in re.finditer(r"\]\(([^)\s]+)\)", body):
    line = body.count("\n", 0, m.start()) + 1
    target, _, anchor = m.group(1).partition("#")
    if re.match(r"\w+:", target):  # https:, mailto:
      continue
    full = os.path.normpath(os.path.join(here, target)) if target else os.path.join(ROOT, doc)
    if not os.path.exists(full):
      problems.append(f"{doc}:{line}: link {m.group(1)}: no such file")
    elif anchor and full.endswith(".md") and anchor not in anchors(full):
      problems.append(f"{doc}:{line}: link {m.group(1)}: no heading #{anchor} in "
                      f"{os.path.relpath(full, ROOT)}")
  for line, code in spans(text):
    for word in code.split():
      word = word.strip(".,;:()")
      if re.fullmatch(r"[\w.-]+(/[\w.*<>{}$…-]*)+|[\w-]+\.(py|md)", word):
        problem = _path_problem(doc, word)
        if problem:
          problems.append(f"{doc}:{line}: {problem}")
  paths = r"(?<![\w/.-])(?<!\]\()((?:%s)/[\w/.-]*\w)" % "|".join(re.escape(t) for t in TOP)
  for m in re.finditer(paths, body):
    problem = _path_problem(doc, m.group(1))
    if problem:
      problems.append(f"{doc}:{body.count(chr(10), 0, m.start()) + 1}: {problem}")
  for block in blocks(text):
    for m in re.finditer(paths, block.text):
      problem = _path_problem(doc, m.group(1))
      if problem:
        problems.append(f"{doc}:{block.line + 1 + block.text.count(chr(10), 0, m.start())}: "
                        f"{problem}")
  return sorted(set(problems))


def declared_flags(help_text: str) -> set[str]:
  """The flags a --help lists in its options (argparse) or flags (absl) section."""
  m = re.search(r"^(?:options|optional arguments|flags):\s*$", help_text, re.M)
  section = help_text[m.end():] if m else ""
  found = set()
  for flag in re.findall(r"^ {2}(?:-\w, )?--(\[no\])?([A-Za-z][\w.-]*)", section, re.M):
    found.add("--" + flag[1])
    if flag[0]:
      found.add("--no" + flag[1])
  return found


def _config_file(command: Command) -> str:
  flags = dict(command.flags())
  return flags.get("--config") or default_config()


def flag_problems(cmds: list[Command], helps: dict[str, str]) -> list[str]:
  """Each command's flags against its module's help, and its --config.a.b against its config
  file. A module whose help is not in `helps` has its flags unchecked."""
  problems = []
  for command in cmds:
    for c in filter(None, (command, command.program())):
      if c.module not in helps:
        continue
      known = declared_flags(helps[c.module])
      for flag, value in c.flags():
        if c.module == "train" and flag.startswith("--config."):
          config = config_of(_config_file(c))
          if config is None:
            problems.append(f"{c.where}: --config {_config_file(c)}: no such config file")
          elif not has_field(config, flag[len("--config."):]):
            problems.append(f"{c.where}: {flag}: no such field in {_config_file(c)}")
        elif flag not in known:
          problems.append(f"{c.where}: python -m {c.module} {flag}: not an option of its "
                          f"--help")
        elif flag == "--config" and c.module == "train" and config_of(value or "") is None:
          problems.append(f"{c.where}: --config {value}: no such config file")
  return problems


def prose_flag_problems(doc: str, text: str, helps: dict[str, str]) -> list[str]:
  """A `--flag` or `config.a.b` the prose names outside a command: an option of some
  command's help, or a field of some config file."""
  every = set().union(*map(declared_flags, helps.values()))
  problems = []
  for line, code in spans(text):
    if not code.startswith("--"):  # a command's flags (`tensorboard --logdir`): its own
      continue
    for flag in re.findall(r"(?<![\w=-])(--[A-Za-z][\w.-]*)", code):
      if flag.startswith("--xla_"):  # XLA's own, given in XLA_FLAGS
        continue
      if flag.startswith("--config."):
        if not _any_config_has(flag[len("--config."):]):
          problems.append(f"{doc}:{line}: {flag}: no such field in any configs/*.py")
      elif flag not in every:
        problems.append(f"{doc}:{line}: {flag}: an option of no command's --help")
  for line, code in spans(text):
    for field in re.findall(r"(?<![\w.-])config((?:\.\w+){2,})", code):
      if not _any_config_has(field[1:]):
        problems.append(f"{doc}:{line}: config{field}: no such field in any configs/*.py")
  return problems


def run_help(module: str) -> tuple[bool, str]:
  """Whether `python -m module --help` parses, and its output."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, FLAX_ENCODER_MALLOC="glibc")
  done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, env=env,
                        capture_output=True, text=True)
  out = done.stdout + done.stderr
  # argparse exits 0 after --help; absl's app.run exits 1 after printing its flags.
  parsed = done.returncode == 0 or (done.returncode == 1 and re.search(r"^flags:$", out, re.M))
  return bool(parsed) and "Traceback" not in out, f"exit {done.returncode}\n{out}"


# -- the tests -----------------------------------------------------------------------------

TEXTS = {doc: _read(doc) for doc in DOCS}
COMMANDS = [c for doc, text in TEXTS.items() for c in commands(doc, text)]


# The PyTorch bridge's commands, whose --help needs torch (the lane of the newest JAX has none).
NO_TORCH = importlib.util.find_spec("torch") is None
needs_torch = pytest.mark.skipif(NO_TORCH, reason="the parity report's --help, which the docs "
                                 "name, needs torch (the torch extra)")


def _ours(command: Command) -> bool:
  return command.module.split(".")[0] in PACKAGES and module_file(command.module) is not None


def _runs_here(module: str) -> bool:
  return not (NO_TORCH and module.startswith("flax_encoder.pytorch"))


@pytest.fixture(scope="module")
def answers() -> dict[str, tuple[bool, str]]:
  """Whether --help parses, and its output, for every module of the checkout that a code
  block runs, and those an inline command gives flags to; each run once, all at once."""
  named = ({c.module for c in COMMANDS if _ours(c) and (c.fenced or c.flags())}
           | {p.module for c in COMMANDS if (p := c.program())})
  modules = sorted(m for m in named if _runs_here(m))
  with concurrent.futures.ThreadPoolExecutor(max(1, len(modules))) as pool:
    return dict(zip(modules, pool.map(run_help, modules)))


@pytest.fixture(scope="module")
def helps(answers) -> dict[str, str]:
  """The helps that parse (the test of the commands names those that do not)."""
  return {module: out for module, (parsed, out) in answers.items() if parsed}


def test_the_docs_name_modules_that_exist():
  problems = [p for doc, text in TEXTS.items() for p in module_problems(doc, text)]
  assert not problems, "\n".join(problems)


def test_the_docs_name_files_that_exist():
  problems = [p for doc, text in TEXTS.items() for p in path_problems(doc, text)]
  assert not problems, "\n".join(problems)


def test_each_command_of_a_code_block_answers_help(answers):
  fenced = {c.module for c in COMMANDS if c.fenced and _ours(c)}
  assert {"train", "train.prepare", "flax_encoder.pytorch.parity"} <= fenced  # what it reads
  failed = [f"python -m {m} --help: {out}" for m, (parsed, out) in sorted(answers.items())
            if not parsed or not declared_flags(out)]
  assert not failed, "\n".join(failed)


def test_each_flag_of_a_command_is_in_its_help(helps):
  problems = flag_problems(COMMANDS, helps)
  assert not problems, "\n".join(problems)


@needs_torch
def test_the_prose_names_flags_and_config_fields_that_exist(helps):
  problems = [p for doc, text in TEXTS.items() for p in prose_flag_problems(doc, text, helps)]
  assert not problems, "\n".join(problems)


def _table_of_roles() -> dict[str, list[str]]:
  rows = [line.split("|")[1:3] for line in TEXTS["docs/library.md"].splitlines()
          if re.match(r"\| (\w+) \| ", line)]
  # A cell lists fields, in groups that a label ending in ':' names.
  return {role.strip(): re.findall(r"(\w+)(?=,|;|\s*$)", cell.strip())
          for role, cell in rows if role.strip() in ROLES}


def test_the_fields_table_lists_every_field_under_its_role():
  table = _table_of_roles()
  assert sorted(table) == sorted(ROLES)
  for role in ROLES:
    assert sorted(table[role]) == sorted(EncoderConfig.fields(role)), role


# -- each check fails on a wrong name ------------------------------------------------------

HELP = """usage: python -m train.embed [-h] --model MODEL

  python -m train.embed --described-only 1

options:
  -h, --help  show this help message and exit
  --model MODEL
  --out OUT
"""
ABSL = """python -m train --workdir runs/demo

flags:

train/__main__.py:
  --[no]multihost: Start with jax.distributed.initialize().
  --workdir: Run directory.
  --config: A configs/*.py file.
"""


def test_declared_flags_are_the_options_section_only():
  assert declared_flags(HELP) == {"--help", "--model", "--out"}
  assert declared_flags(ABSL) == {"--multihost", "--nomultihost", "--workdir", "--config"}


@pytest.mark.parametrize("text, wrong", [
    ("`flax_encoder.no_such_module`", "flax_encoder.no_such_module"),
    ("`flax_encoder.weights.no_such_function`", "no_such_function"),
    ("`train.tasks.no_such_task`", "train.tasks.no_such_task"),
    ("`train.no_such_field`", "no_such_field"),
    ("```python\nfrom flax_encoder.weights import load_weights, no_such_name\n```",
     "no_such_name"),
    ("```python\nfrom flax_encoder.pytorch import (load_torch_checkpoint,\n    no_such_name)\n```",
     "no_such_name"),
    ("```bash\npython -m benchmarks.no_such_benchmark --x 1\n```", "benchmarks.no_such_benchmark"),
    ("run `python -m train.no_such_command`", "train.no_such_command"),
])
def test_a_wrong_module_is_found(text, wrong):
  problems = module_problems("x.md", text)
  assert len(problems) == 1 and wrong in problems[0], problems


def test_right_modules_and_values_pass():
  text = ("`flax_encoder.weights.load_weights`, `train.seq_len`, `train.bin`, "
          "`flax_encoder.families`, `config.train.seq_len`, `python -m train.embed`\n"
          "```python\nfrom flax_encoder.families import load_hf, read_hf\n```\n")
  assert module_problems("x.md", text) == []


@pytest.mark.parametrize("text, wrong", [
    ("see [x](docs/no_such.md)", "docs/no_such.md"),
    ("see [x](docs/training.md#no-such-heading)", "no-such-heading"),
    ("`configs/no_such.py`", "configs/no_such.py"),
    ("`benchmarks/no_such.py`", "benchmarks/no_such.py"),
    ("as tests/test_no_such.py shows", "tests/test_no_such.py"),
    ("`families/no_such_family.py`", "families/no_such_family.py"),
    ("```bash\npython -m train --config=configs/no_such.py\n```", "configs/no_such.py"),
])
def test_a_wrong_path_is_found(text, wrong):
  problems = path_problems("README.md", text)
  assert len(problems) == 1 and wrong in problems[0], problems


def test_right_paths_and_placeholders_pass():
  text = ("[t](docs/training.md#regression) `configs/classify.py` `families/bert.py` "
          "`config.py` `runs/demo` `WORKDIR/data` `flax_encoder/families/<name>.py` "
          "`data/part-*` docs/huggingface.md `run_mlm.py` [BENCHMARKS.md](BENCHMARKS.md)")
  assert path_problems("README.md", text) == []


def _flag_problems_of(text: str) -> list[str]:
  return flag_problems(commands("x.md", text), {"train.embed": HELP, "train": ABSL,
                                                "train.launch": "options:\n  --program P\n"
                                                                "  --processes N\n"})


@pytest.mark.parametrize("text, wrong", [
    ("```bash\npython -m train.embed --model m --no-such-flag 3\n```", "--no-such-flag"),
    ("```bash\npython -m train.embed --model m \\\n    --described-only 1\n```",
     "--described-only"),
    ("`python -m train.embed --model m --no-such-flag`", "--no-such-flag"),
    ("```bash\npython -m train --workdir w --config.train.no_such_field=1\n```",
     "--config.train.no_such_field"),
    ("```bash\npython -m train --config=configs/classify.py --workdir w "
     "--config.task.no_such=1\n```", "no such field in configs/classify.py"),
    ("```bash\npython -m train --config configs/no_such.py --workdir w\n```", "configs/no_such.py"),
    ("```bash\npython -m train.launch --processes 2 -- --workdir w --no-such-flag\n```",
     "--no-such-flag"),
    ("```bash\npython -m train.launch --program embed --processes 2 -- --model m --workdir w\n```",
     "--workdir"),
    ('```bash\nssh h --command="python -m train --multihost --nope" --other\n```', "--nope"),
])
def test_a_wrong_flag_is_found(text, wrong):
  problems = _flag_problems_of(text)
  assert len(problems) == 1 and wrong in problems[0], problems


def test_right_flags_pass():
  text = ("```bash\npython -m train --config=configs/classify.py --workdir w \\\n"
          "    --config.init.hf=DIR --config.data.train=t.jsonl   # a comment --not-a-flag\n"
          "python -m train.embed --model m [--out x] && other --thing\n"
          "python -m train.launch --processes 2 -- --workdir w --config.train.seed=1 "
          "--nomultihost\n"
          '```\n`python -m train --multihost`')
  assert _flag_problems_of(text) == []


@pytest.mark.parametrize("text, wrong", [
    ("`--no-such-flag`", "--no-such-flag"),
    ("`--config.init.no_such=1`", "--config.init.no_such"),
    ("`config.task.no_such_field`", "config.task.no_such_field"),
])
def test_a_wrong_flag_or_field_in_prose_is_found(text, wrong):
  problems = prose_flag_problems("x.md", text, {"train.embed": HELP})
  assert len(problems) == 1 and wrong in problems[0], problems


def test_right_flags_and_fields_in_prose_pass():
  text = ("`--model DIR`, `--config.init.hf=DIR`, `config.train.seq_len`, `config.global_layers`, "
          "`--xla_cpu_use_fusion_emitters=true`")
  assert prose_flag_problems("x.md", text, {"train.embed": HELP}) == []


# -- every family and task is named where they are listed ----------------------------------

def unnamed(names, text: str) -> list[str]:
  """Those of `names` that `text` does not name as a word of its own."""
  return [n for n in names if not re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)]


def _defined_in(package: str, attribute: str, value) -> str:
  """The module of `package` whose `attribute` is `value` (its name without the package)."""
  return next(name.rsplit(".", 1)[1] for name, module in sorted(sys.modules.items())
              if name.startswith(package + ".") and getattr(module, attribute, None) is value)


@needs_torch
def test_every_family_is_named_where_the_families_are_listed(answers):
  from flax_encoder import families
  modules = {name: _defined_in("flax_encoder.families", "FAMILY", family)
             for name, family in families.FAMILIES.items()}
  table = dict(re.findall(r"^\| `([\w-]+)`[^|]* \| ([\w-]+) \|", TEXTS["docs/huggingface.md"],
                          re.M))
  table.pop("model_type")  # the header
  assert table == {t: f.name for t, f in families.MODEL_TYPES.items()}, "docs/huggingface.md"
  assert not unnamed([f"{m}.py" for m in modules.values()], TEXTS["docs/architecture.md"])
  assert not unnamed([*modules, *[f"{m}.py" for m in modules.values()]], families.__doc__)
  parity = answers["flax_encoder.pytorch.parity"][1]
  assert not unnamed(families.MODEL_TYPES, parity), "python -m flax_encoder.pytorch.parity"


def test_every_task_is_named_where_the_tasks_are_listed():
  import train.outputs.predict
  import train.task
  from train import tasks
  modules = {name: _defined_in("train.tasks", "DEFINITION", d)
             for name, d in tasks.DEFINITIONS.items()}
  assert not unnamed([f"tasks/{m}.py" for m in modules.values()], TEXTS["docs/architecture.md"])
  assert not unnamed([f"train.tasks.{m}" for m in modules.values()], train.task.__doc__)
  assert not unnamed(modules.values(), TEXTS["README.md"].split("## Map")[1])
  predicting = [n for n, d in tasks.DEFINITIONS.items() if d.predictor]
  assert not unnamed(predicting, train.outputs.predict.__doc__)


def test_unnamed_finds_a_name_left_out():
  assert unnamed(["bert", "gte", "deberta-v2"], "bert, roberta; deberta-v2s gte-like") == [
      "gte", "deberta-v2"]


@pytest.mark.parametrize("module", ["embed", "predict", "export", "prepare", "launch",
                                    "draw_attention"])
def test_every_commands_help_shows_its_defaults(module):
  # the options of train.embed and train.predict said no default
  import argparse
  import importlib
  from train.cli import HelpFormatter
  main = importlib.import_module(f"train.{module}").main
  parsers = []
  real = argparse.ArgumentParser.__init__

  def record(self, *args, **kwargs):
    real(self, *args, **kwargs)
    parsers.append(self)

  with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit):
    patch.setattr(argparse.ArgumentParser, "__init__", record)
    main(["--help"])
  parser = parsers[0]
  assert parser.formatter_class is HelpFormatter
  text = " ".join(parser.format_help().split())
  for action in parser._actions:
    if action.option_strings and not any(action.default is nothing
                                         for nothing in (None, False, argparse.SUPPRESS)):
      assert action.help, f"{action.option_strings[0]}: no help to say its default in"
      assert f"(default: {action.default})" in text or "default" in action.help, (
          action.option_strings[0])
