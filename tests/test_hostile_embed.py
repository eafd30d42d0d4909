"""`python -m train.embed` against what goes wrong around it: a full disk, what a killed embed
left, a model whose embeddings are NaN, a compressed input cut short, a run whose tokenizer is
gone or another's, a stream as --input, a Parquet file without the text column. Each is one
line naming the argument or file, and leaves no output behind."""

import bz2
import errno
import gzip
import json
import lzma
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests import runs
from tests.test_contrastive import TOPICS, _config, _write_pairs, hf_dir  # noqa: F401
from tests.test_embed_command import TEXTS, folder  # noqa: F401  (sentence-transformers)
from train.errors import RunError
from train.files import stream
from train.outputs import embed


def _texts(tmp_path, texts=TEXTS, name="texts.txt"):
  path = tmp_path / name
  path.write_text("\n".join(texts) + "\n")
  return str(path)


def _error_line(capsys) -> str:
  """The command's one error line; nothing else it printed looks like a traceback."""
  err = capsys.readouterr().err
  assert "Traceback" not in err
  return err.strip().splitlines()[-1]


# --- A full disk -----------------------------------------------------------------------------


@pytest.mark.parametrize("reserve", [True, False], ids=["reserved", "written"])
def test_a_full_disk_is_one_line_exit_1_and_leaves_nothing(folder, tmp_path, reserve):
  # A process, as the memory map this replaces died of SIGBUS where the disk had no page for a
  # row. "written": where the space cannot be reserved first (no posix_fallocate: macOS).
  texts = _texts(tmp_path, [f"text number {i}" for i in range(400)])  # 400 x 32 float32: 51 KB
  with runs.full_file_system(str(tmp_path / "disk")) as disk:
    filler = os.path.join(disk, "filler")
    os.truncate(filler, os.path.getsize(filler) - 8192)  # room for the header, not the rows
    out = os.path.join(disk, "e.npy")
    code = ("import os, runpy, sys\n"
            f"{'' if reserve else 'del os.posix_fallocate'}\n"
            f"sys.argv = ['embed', '--model', {folder!r}, '--input', {texts!r}, '--out', "
            f"{out!r}]\n"
            "runpy.run_module('train.embed', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], cwd=runs.ROOT,
                            env=runs.environment(), capture_output=True, text=True,
                            timeout=runs.limit(300))
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"embed: error: --out {out}: cannot write it ({os.strerror(errno.ENOSPC)})")
    assert os.listdir(disk) == ["filler"]


# --- What a killed embed left ----------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".npy", ".jsonl", ".parquet"])
def test_what_a_killed_embed_left_is_removed_by_the_next_and_said(folder, tmp_path, capsys,
                                                                  suffix):
  texts = _texts(tmp_path)
  host = socket.gethostname()
  left = tmp_path / f"e.tmp-{host}-999999999{suffix}"  # kill -9's: its pid runs no more
  live = tmp_path / f"e.tmp-{host}-{os.getppid()}{suffix}"  # an embed still writing
  elsewhere = tmp_path / f"e.tmp-another-host-999999999{suffix}"  # its pid is not ours to see
  for path in (left, live, elsewhere):
    path.write_bytes(b"half an output")
  assert embed.main(["--model", folder, "--input", texts, "--out",
                     str(tmp_path / f"e{suffix}")]) == 0
  assert (f"removed {left}, left by a process that was stopped before it finished"
          in capsys.readouterr().err)
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
      [f"e{suffix}", live.name, elsewhere.name, "texts.txt"])


def test_a_first_manifest_write_killed_is_removed_by_the_next_run_and_said(folder, tmp_path,
                                                                          capsys):
  # every later run refused the folder ("a directory holding 'manifest.tmp-…'") until the
  # file was removed by hand
  texts, out = _texts(tmp_path), tmp_path / "out"
  out.mkdir()
  left = out / f"manifest.tmp-{socket.gethostname()}-999999999.json"  # kill -9's
  left.write_text('{"format": "flax-encoder embeddings", "key": "hal')
  assert embed.main(["--model", folder, "--input", texts, "--out", f"{out}/"]) == 0
  assert (f"removed {left}, left by a process that was stopped before it finished"
          in capsys.readouterr().err)
  assert not left.exists() and (out / "manifest.json").is_file()


# --- Embeddings that are not finite ----------------------------------------------------------


@pytest.fixture(scope="module")
def nan_folder(folder, tmp_path_factory):
  """`folder` with one NaN in a weight of its first layer: every embedding NaN."""
  from safetensors.numpy import load_file, save_file
  path = str(tmp_path_factory.mktemp("nan") / "st")
  shutil.copytree(folder, path)
  weights = load_file(os.path.join(path, "model.safetensors"))
  weights["encoder.layer.0.attention.output.dense.weight"][3, 5] = np.nan
  save_file(weights, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  return path


def test_nan_embeddings_stop_before_anything_is_written_naming_texts_and_parameter(
    nan_folder, tmp_path, capsys):
  texts = _texts(tmp_path)
  out = tmp_path / "e.npy"
  assert embed.main(["--model", nan_folder, "--input", texts, "--out", str(out)]) == 2
  assert _error_line(capsys) == (
      f"embed: error: --model {nan_folder}: the embeddings of 8 of 8 texts (ids 1, 2, 3, 4, 5 "
      f"and 3 more) are not finite; the model's parameter "
      f"encoder/layers_0/self_attn/w_o/kernel holds NaN or inf; nothing written "
      f"(--allow-nonfinite writes them)")
  assert sorted(os.listdir(tmp_path)) == ["texts.txt"]


def test_nan_embeddings_are_checked_a_chunk_at_a_time(nan_folder, tmp_path, monkeypatch):
  monkeypatch.setattr(embed, "_CHUNK", 3)
  with pytest.raises(RunError) as e:
    embed.embed(nan_folder, _texts(tmp_path), str(tmp_path / "e.jsonl"))
  assert "the embeddings of 3 of 3 texts (ids 1, 2, 3) read so far are not finite" in str(
      e.value)


def test_allow_nonfinite_writes_them_and_warns(nan_folder, tmp_path, capsys):
  texts = _texts(tmp_path)
  out = tmp_path / "e.npy"
  assert embed.main(["--model", nan_folder, "--input", texts, "--out", str(out),
                     "--allow-nonfinite"]) == 0
  captured = capsys.readouterr()
  assert captured.out == f"{out}: 8 embeddings\n"
  assert ("embed: warning: the embeddings of 8 of 8 texts (ids 1, 2, 3, 4, 5 and 3 more) are "
          "not finite (NaN or inf); written as they came (--allow-nonfinite)") in captured.err
  assert np.load(out).shape == (8, 32) and np.isnan(np.load(out)).all()


def test_finite_parameters_whose_embeddings_overflow_are_exit_1(folder, tmp_path, monkeypatch,
                                                                capsys):
  # what bfloat16 can do to a model that is sound: the computation failed, not the request
  from flax_encoder.embeddings import SentenceEncoder
  called = SentenceEncoder.__call__
  monkeypatch.setattr(SentenceEncoder, "__call__",
                      lambda self, texts, **kw: called(self, texts, **kw) * np.float32(np.inf))
  assert embed.main(["--model", folder, "--input", _texts(tmp_path), "--out",
                     str(tmp_path / "e.npy")]) == 1
  assert _error_line(capsys).endswith(
      "are not finite; the model's parameters are finite (an overflow: try --dtype float32); "
      "nothing written (--allow-nonfinite writes them)")


# --- A compressed input cut short ------------------------------------------------------------


def _zstd(data: bytes) -> bytes:
  zstandard = pytest.importorskip("zstandard")
  return zstandard.ZstdCompressor().compress(data)


@pytest.mark.parametrize("suffix, compress", [(".gz", gzip.compress), (".bz2", bz2.compress),
                                              (".xz", lzma.compress), (".zst", _zstd)])
def test_a_truncated_compressed_input_is_one_line_naming_it(folder, tmp_path, capsys, suffix,
                                                            compress):
  data = compress(("\n".join(f"text {i} " * 20 for i in range(200)) + "\n").encode())
  source = tmp_path / f"texts.txt{suffix}"
  source.write_bytes(data[:len(data) // 2])
  assert embed.main(["--model", folder, "--input", str(source), "--out",
                     str(tmp_path / "e.npy")]) == 2
  line = _error_line(capsys)
  assert line.startswith(f"embed: error: --input {source}: truncated: it ends inside its "
                         f"compressed {suffix} stream ("), line
  assert not (tmp_path / "e.npy").exists()


# --- A contrastive run whose tokenizer is gone, broken or another's --------------------------


@pytest.fixture(scope="module")
def contrastive_run(hf_dir, tmp_path_factory):  # noqa: F811
  """A contrastive run of one step from `hf_dir` (its tokenizer.json copied to data/)."""
  from train import loop
  directory, rng = tmp_path_factory.mktemp("contrastive"), np.random.default_rng(0)
  pairs = (_write_pairs(directory / "train.jsonl", rng.choice(TOPICS, 32), rng),
           _write_pairs(directory / "eval.jsonl", rng.choice(TOPICS, 8, replace=False), rng))
  config = _config(pairs, hf_dir, **{
      "train.num_steps": 1, "train.eval_every": 1, "train.checkpoint_every": 1,
      "train.batch_size": 8, "train.eval_at_start": False})
  workdir = str(directory / "run")
  assert loop.run(config, workdir) == 0
  return workdir


def _another_vocabulary(path, more=300, the=None):
  """tokenizer.json with `more` words than the run's, or 'the' numbered `the`: another
  model's vocabulary, of another size or of the same."""
  with open(path) as f:
    tokenizer = json.load(f)
  vocab = tokenizer["model"]["vocab"]
  vocab.update({f"word{i}": len(vocab) + i for i in range(more)})
  if the is not None:
    vocab["the"] = the
  with open(path, "w") as f:
    json.dump(tokenizer, f)


_BREAK = {"missing": os.remove, "invalid": lambda p: open(p, "w").write("{not json"),
          "another": _another_vocabulary,
          "same size": lambda p: _another_vocabulary(p, more=0, the=500)}


@pytest.mark.parametrize("case, said", [
    ("missing", "no such file, expected the huggingface tokenizer the run's data was prepared "
                "with"),
    ("invalid", "not a readable huggingface tokenizer (Exception: "),
    ("another", "a vocabulary of 419 ids, expected the 119 of the tokenizer the run was trained "
                "with (another model's tokenizer)"),
    ("same size", "the tokenizer gives ids past the model's vocabulary (vocab_size=119): not "
                  "this model's tokenizer")])
def test_a_runs_tokenizer_that_is_gone_broken_or_anothers_is_one_line_naming_it(
    contrastive_run, tmp_path, capsys, case, said):
  workdir = str(tmp_path / "run")
  shutil.copytree(contrastive_run, workdir)
  tokenizer = os.path.join(workdir, "data", "tokenizer.json")
  _BREAK[case](tokenizer)
  texts = _texts(tmp_path)
  assert embed.main(["--model", workdir, "--input", texts, "--out",
                     str(tmp_path / "e.npy")]) == 2
  assert _error_line(capsys).startswith(f"embed: error: --model {workdir}: {tokenizer}: {said}")
  assert not (tmp_path / "e.npy").exists()


def test_a_folder_whose_tokenizer_gives_ids_past_its_vocabulary_is_one_line(folder, tmp_path,
                                                                           capsys):
  path = str(tmp_path / "st")
  shutil.copytree(folder, path)
  with open(os.path.join(path, "tokenizer.json")) as f:
    tokenizer = json.load(f)
  tokenizer["model"]["vocab"]["the"] = 500  # another model's id for it, past this one's 119
  with open(os.path.join(path, "tokenizer.json"), "w") as f:
    json.dump(tokenizer, f)
  assert embed.main(["--model", path, "--input", _texts(tmp_path), "--out",
                     str(tmp_path / "e.npy")]) == 2
  assert _error_line(capsys) == (f"embed: error: --model {path}: the tokenizer gives ids past "
                                 f"the model's vocabulary (vocab_size=119): not this model's "
                                 f"tokenizer")
  assert not (tmp_path / "e.npy").exists()


# --- A stream as --input ---------------------------------------------------------------------


def test_a_fifo_as_input_is_refused_in_one_line_before_the_model_is_read(tmp_path, capsys):
  fifo = tmp_path / "texts.txt"
  os.mkfifo(fifo)  # nothing writes it: a read would wait for ever
  assert embed.main(["--model", str(tmp_path / "no-model"), "--input", str(fifo), "--out",
                     str(tmp_path / "e.npy")]) == 2
  assert _error_line(capsys) == (f"embed: error: --input {fifo}: a FIFO (a stream), expected a "
                                 f"regular file")


def test_standard_input_as_input_is_refused_where_it_is_a_stream(tmp_path):
  if not stream("/dev/stdin"):
    pytest.skip("standard input is a file here, which embed reads")
  with pytest.raises(RunError, match=r"^--input /dev/stdin: a (FIFO|character device) "
                                     r"\(a stream\), expected a regular file$"):
    embed.embed(str(tmp_path / "no-model"), "/dev/stdin", str(tmp_path / "e.npy"))


# --- A Parquet file without the text column --------------------------------------------------


def test_a_parquet_input_without_the_text_column_names_its_columns_before_the_model(
    tmp_path, capsys):
  import pyarrow as pa
  import pyarrow.parquet as pq
  source = tmp_path / "texts.parquet"
  pq.write_table(pa.table({"id": ["a", "b"], "body": ["one text", "another"]}), source)
  assert embed.main(["--model", str(tmp_path / "no-model"), "--input", str(source), "--out",
                     str(tmp_path / "e.npy")]) == 2
  assert _error_line(capsys) == (f"embed: error: --input {source}: no column 'text' "
                                 f"(--text-field), columns: ['id', 'body']")
  assert sorted(os.listdir(tmp_path)) == ["texts.parquet"]
