"""A run from a Hugging Face directory (config.init.hf) and its exports, against a hostile or
changing start: a file of the directory linked to a private file outside it is refused when
the run starts; the exports read what the run took into WORKDIR/start when it started, so a
directory changed (or linked out) after training changes nothing they write; an older run
without that copy exports from its directory, checked the same way; a --layout the export has
none of, or that its --out does not take, and a workdir that lost its dataset.json are each
one line naming what is wrong."""

import contextlib
import json
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from configs import embed as embed_config  # noqa: E402
from tests import hf_models, runs  # noqa: E402
from tests.test_contrastive import TOPICS, _write_pairs  # noqa: E402
from train.errors import RunError  # noqa: E402
from train.outputs.export import main as export  # noqa: E402
from train.tasks import start as start_lib  # noqa: E402

SECRET = "hunter2-private"  # what a file outside the start directory holds


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
  return hf_models.write(tmp_path_factory.mktemp("bert") / "bert", "bert")


@pytest.fixture(scope="module")
def secret(tmp_path_factory):
  """A private JSON file (0600) outside every start directory."""
  path = tmp_path_factory.mktemp("private") / "secret.json"
  path.write_text(json.dumps({"secret_key": SECRET, "model_max_length": 7}))
  os.chmod(path, 0o600)
  return str(path)


def _files(directory) -> dict:
  """{relative path: bytes} of every file under `directory`."""
  found = {}
  for folder, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(folder, name)
      with open(path, "rb") as f:
        found[os.path.relpath(path, directory)] = f.read()
  return found


def _export(workdir, layout, out, capsys) -> tuple[int, str]:
  capsys.readouterr()
  code = export(["--workdir", workdir, "--layout", layout, "--out", str(out)])
  return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def run(bert, tmp_path_factory):
  """(start directory, workdir, {layout: its export right after training}) of a few steps of
  contrastive fine-tuning from a copy of the tiny BERT (with its pooler)."""
  base = tmp_path_factory.mktemp("run")
  start = str(base / "start")
  shutil.copytree(bert, start)
  rng = np.random.default_rng(0)
  train = _write_pairs(base / "train.jsonl", rng.choice(TOPICS, 32), rng)
  eval_ = _write_pairs(base / "eval.jsonl", rng.choice(TOPICS, 8, replace=False), rng)
  workdir = str(base / "workdir")
  runs.train(workdir, f"--config.data.train={train}", f"--config.data.eval={eval_}",
             f"--config.init.hf={start}", "--config.train.seq_len=16",
             "--config.train.batch_size=8", "--config.train.num_steps=2",
             "--config.train.eval_every=2", "--config.train.checkpoint_every=2",
             "--config.train.log_every=1", "--config.optim.warmup_steps=1",
             config=os.path.join(runs.ROOT, "configs", "embed.py"))
  exports = {}
  for layout in ("hf", "sentence-transformers"):
    out = base / f"reference-{layout}"
    assert export(["--workdir", workdir, "--layout", layout, "--out", str(out)]) == 0
    exports[layout] = _files(out)
  return start, workdir, exports


@contextlib.contextmanager
def _changed(start, tmp_path, change):
  """The start directory as `change(start)` leaves it, put back as it was afterwards."""
  saved = str(tmp_path / "saved-start")
  shutil.copytree(start, saved, symlinks=True)
  try:
    change(start)
    yield
  finally:
    shutil.rmtree(start)
    shutil.copytree(saved, start, symlinks=True)


def _link(start, name, target) -> None:
  path = os.path.join(start, name)
  if os.path.lexists(path):
    os.remove(path)
  os.symlink(target, path)


# ---------------------------------------------------------------------------------------------
# Case 1: a start directory's file linked out of it.


def _start(directory, tmp_path):
  config = embed_config.get_config()
  config.init.hf = str(directory)
  return start_lib.start_of(config, str(tmp_path / "workdir"))


@pytest.mark.parametrize("name, make, said", [
    ("special_tokens_map.json", "link", "a link to {secret}, outside {start}, expected a file "
                                        "of the directory"),
    ("tokenizer_config.json", "link", "a link to {secret}, outside {start}, expected a file of "
                                      "the directory"),
    ("tokenizer_config.json", "directory", "a directory, expected a regular file"),
    # case 2, at the start: the settings the export merges must be a JSON object
    ("tokenizer_config.json", "[1, 2]", "holds a list, expected a JSON object"),
    ("special_tokens_map.json", "{", "not readable JSON"),
])
def test_a_start_file_that_is_no_file_of_the_directory_is_one_line(bert, secret, tmp_path, name,
                                                                    make, said):
  start = str(tmp_path / "start")
  shutil.copytree(bert, start)
  path = os.path.join(start, name)
  if make == "link":
    _link(start, name, secret)
  elif make == "directory":
    os.remove(path)
    os.makedirs(path)
  else:
    with open(path, "w") as f:
      f.write(make)
  with pytest.raises(RunError) as raised:
    _start(start, tmp_path)
  message = str(raised.value)
  assert message.startswith(f"config.init.hf: {path}: "), message
  assert said.format(secret=secret, start=start) in message and "\n" not in message
  assert not os.path.exists(tmp_path / "workdir" / "start" / name)


def test_links_within_the_directory_or_into_the_hub_cache_are_read_and_copied(bert, tmp_path):
  # huggingface_hub's cache: snapshots/REV/NAME -> ../../blobs/HASH; and a link within.
  cache = tmp_path / "models--tiny--bert"
  snapshot = cache / "snapshots" / "0123abc"
  os.makedirs(cache / "blobs")
  os.makedirs(snapshot)
  for i, name in enumerate(sorted(os.listdir(bert))):
    shutil.copyfile(os.path.join(bert, name), cache / "blobs" / f"blob{i}")
    os.symlink(f"../../blobs/blob{i}", snapshot / name)
  os.rename(snapshot / "tokenizer_config.json", snapshot / "settings.json")
  os.symlink("settings.json", snapshot / "tokenizer_config.json")
  start = _start(snapshot, tmp_path)
  assert start.hf["family"] == "bert"
  kept = tmp_path / "workdir" / "start"
  names = sorted(os.listdir(kept))
  assert names == ["config.json", "pooler.msgpack", "tokenizer_config.json"]
  assert not any(os.path.islink(kept / n) for n in names)
  for name in ("config.json", "tokenizer_config.json"):
    assert (kept / name).read_bytes() == open(os.path.join(bert, name), "rb").read()


def test_the_exports_read_the_runs_copy_not_a_start_directory_linked_out_since(
    run, secret, tmp_path, capsys):
  start, workdir, reference = run

  def link_out(directory):
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
      _link(directory, name, secret)

  with _changed(start, tmp_path, link_out):
    for layout in ("hf", "sentence-transformers"):
      out = tmp_path / layout
      code, err = _export(workdir, layout, out, capsys)
      assert code == 0, err
      files = _files(out)
      assert not any(SECRET.encode() in data for data in files.values()), layout
      assert files == reference[layout]  # as exported right after training, byte for byte
      assert json.loads(files["tokenizer_config.json"])["model_max_length"] == 16


# ---------------------------------------------------------------------------------------------
# Case 2: a start directory changed after training.


def test_a_start_directory_changed_after_training_changes_no_export(run, tmp_path, capsys):
  start, workdir, reference = run

  def change(directory):
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
      f.write("[1, 2]")
    config = json.load(open(os.path.join(directory, "config.json")))
    with open(os.path.join(directory, "config.json"), "w") as f:
      json.dump({**config, "hidden_dropout_prob": 0.5, "attention_probs_dropout_prob": 0.5}, f)
    os.remove(os.path.join(directory, "model.safetensors"))  # the pooler's weights gone

  with _changed(start, tmp_path, change):
    for layout in ("hf", "sentence-transformers"):
      out = tmp_path / layout
      code, err = _export(workdir, layout, out, capsys)
      assert code == 0, err
      assert _files(out) == reference[layout], layout


def test_an_older_run_without_its_copy_exports_from_its_directory_checked_as_a_start(
    run, secret, tmp_path, capsys):
  start, workdir, reference = run
  older = str(tmp_path / "older")
  shutil.copytree(workdir, older, symlinks=True)
  shutil.rmtree(os.path.join(older, "start"), ignore_errors=True)  # as runs before the copy
  code, err = _export(older, "hf", tmp_path / "as-it-was", capsys)
  assert code == 0, err
  assert _files(tmp_path / "as-it-was") == reference["hf"]
  with _changed(start, tmp_path, lambda d: _link(d, "special_tokens_map.json", secret)):
    out = tmp_path / "linked"
    code, err = _export(older, "sentence-transformers", out, capsys)
  assert code == 2 and not os.path.exists(out)
  assert err == (f"export: error: config.init.hf: {start}/special_tokens_map.json: a link to "
                 f"{secret}, outside {start}, expected a file of the directory (the run and its "
                 f"exports would hold another file)\n")


# ---------------------------------------------------------------------------------------------
# Case 3: --layout.


def test_an_unknown_layout_or_one_the_out_does_not_take_is_one_line(run, tmp_path, capsys):
  workdir = run[1]
  out = tmp_path / "x.msgpack"
  code, err = _export(workdir, "bogus", out, capsys)
  assert code == 2 and not out.exists()
  assert err == ("export: error: --layout bogus: unknown, expected tutorial or torch_nn "
                 "(PyTorch weights: --out .safetensors, .pt, .pth, .bin) or hf or "
                 "sentence-transformers (--out DIR)\n")
  for layout, name in (("torch_nn", "x.msgpack"), ("tutorial", "x.jaxexport")):
    code, err = _export(workdir, layout, tmp_path / name, capsys)
    suffix = os.path.splitext(name)[1]
    assert code == 2 and not (tmp_path / name).exists()
    assert err == (f"export: error: --layout {layout}: a {suffix} file takes no layout (it "
                   f"names the parameters of PyTorch weights: .safetensors, .pt, .pth, .bin), "
                   f"expected it left out\n")
  capsys.readouterr()
  assert export(["--workdir", workdir, "--out", str(out)]) == 0 and out.stat().st_size > 0


# ---------------------------------------------------------------------------------------------
# Case 4: a workdir without its dataset.json.


def test_a_workdir_without_its_dataset_json_names_the_file(run, tmp_path, capsys):
  workdir = str(tmp_path / "workdir")
  shutil.copytree(run[1], workdir, symlinks=True)
  missing = os.path.join(workdir, "data", "dataset.json")
  os.remove(missing)
  code, err = _export(workdir, "hf", tmp_path / "out", capsys)
  assert code == 2 and not (tmp_path / "out").exists()
  assert err.startswith(f"export: error: {missing}: missing, expected ") and (
      err.count("\n") == 1), err
  assert "config.data.prepared" not in err


def test_a_new_out_format_is_one_entry_of_the_table(tmp_path, monkeypatch, capsys):
  from train.outputs import export as command

  def write(workdir, path, suffix, layout, seq_len):
    with open(path, "w") as f:
      f.write(f"{os.path.basename(workdir)} {suffix} {layout} {seq_len}")

  monkeypatch.setitem(command.FORMATS, ".txt",
                      command.FileFormat("the run's name, for this test", write))
  workdir = tmp_path / "workdir"
  workdir.mkdir()
  out = tmp_path / "x.txt"
  assert export(["--workdir", str(workdir), "--out", str(out), "--seq-len", "8"]) == 0
  assert out.read_text() == "workdir .txt None 8"
  code, err = _export(str(workdir), "torch_nn", tmp_path / "y.txt", capsys)
  assert code == 2 and err == ("export: error: --layout torch_nn: a .txt file takes no layout (it "
                               "names the parameters of PyTorch weights: .safetensors, .pt, .pth, "
                               ".bin), expected it left out\n")
  assert export(["--workdir", str(workdir), "--out", str(tmp_path / "x.csv")]) == 2
  assert capsys.readouterr().err == (
      "export: error: --out must end in .msgpack, .jaxexport, .safetensors, .pt, .pth, .bin, "
      f".txt, got {str(tmp_path / 'x.csv')!r}\n")
  with pytest.raises(SystemExit):
    export(["--help"])
  said = capsys.readouterr().out
  assert "  .txt          the run's name, for this test\n" in said
  assert "  hf                     a Hugging Face directory transformers loads\n" in said
