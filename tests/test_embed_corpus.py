"""`python -m train.embed --out DIR/`: a corpus embedded into a folder of parts and a manifest,
read back by flax_encoder.corpus.read_embeddings in input order; the same embeddings and ids
as a single file, over several devices and processes; continued after kill -9 to what an
uninterrupted run writes, bit for bit; another run's folder refused in one line."""

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from flax_encoder.corpus import CorpusError, done_parts, read_embeddings, read_manifest
from train.errors import RunError
from train.outputs import corpus as parts
from train.outputs import embed
from tests import runs
from tests.test_embed_command import TEXTS, folder  # noqa: F401  (a module-scoped fixture)

PART_MB = 300 / (1 << 20)  # parts of 300 bytes: several for a few dozen lines
LONG = "a b " * 400  # 1,600 bytes: a line longer than a part, which leaves the next one empty


def _records(n: int = 60) -> list[dict]:
  """n records, every third without an id, texts of TEXTS and one long one."""
  rows = []
  for i in range(n):
    text = LONG if i == 7 else f"{TEXTS[i % len(TEXTS)]} {i}"
    rows.append({"text": text} | ({} if i % 3 == 2 else {"id": f"doc-{i}"}))
  return rows


def _jsonl(path, rows, blank_every: int = 0) -> str:
  lines = [json.dumps(r) for r in rows]
  if blank_every:  # blank lines count as lines, hold no text
    lines = [x for i, line in enumerate(lines) for x in ([line, ""] if i % blank_every == 1
                                                          else [line])]
  path.write_text("\n".join(lines) + "\n")
  return str(path)


def _single(folder, source, tmp_path):  # noqa: F811
  """(ids, vectors) of the single-file output of the same input."""
  out = tmp_path / "single.jsonl"
  embed.embed(folder, source, str(out))
  lines = [json.loads(x) for x in out.read_text().splitlines()]
  return [x["id"] for x in lines], np.array([x["embedding"] for x in lines], np.float32)


def _input(kind: str, tmp_path) -> str:
  rows = _records()
  if kind == "jsonl":
    return _jsonl(tmp_path / "in.jsonl", rows, blank_every=5)
  if kind == "txt.gz":
    path = tmp_path / "in.txt.gz"
    path.write_bytes(gzip.compress(("\n".join(r["text"] for r in rows) + "\n\n").encode()))
    return str(path)
  import pyarrow as pa
  import pyarrow.parquet as pq
  path = str(tmp_path / "in.parquet")
  table = pa.table({"text": [r["text"] for r in rows], "id": [r.get("id") for r in rows]})
  pq.write_table(table, path, row_group_size=7)
  return path


@pytest.mark.parametrize("kind", ["jsonl", "txt.gz", "parquet"])
def test_a_folder_holds_in_input_order_what_a_single_file_holds(folder, tmp_path, kind):  # noqa: F811
  source = _input(kind, tmp_path)
  out = str(tmp_path / "out") + "/"
  assert embed.embed(folder, source, out, part_mb=PART_MB) == 60
  ids, vectors = read_embeddings(out)
  expected_ids, expected = _single(folder, source, tmp_path)
  assert ids == expected_ids
  np.testing.assert_allclose(vectors, expected, atol=1e-6)
  manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
  assert manifest["complete"] and len(manifest["parts"]) > 3
  assert manifest["model"]["dim"] == 32 and manifest["model"]["normalize"]
  if kind == "jsonl":  # the long line leaves the part after its own empty, and counted
    assert 0 in [p["rows"] for p in manifest["parts"]]
  assert sum(p["rows"] for p in manifest["parts"]) == 60


def test_a_process_reads_only_the_bytes_of_its_own_parts(tmp_path):
  # Part 0 holds bytes that are neither UTF-8 nor JSON: reading part 1 alone never sees them.
  path = tmp_path / "in.jsonl"
  good = "".join(json.dumps({"text": f"text {i}"}) + "\n" for i in range(10))
  path.write_bytes(b"\xff\xfe not json\n" * 40 + good.encode())  # 480 bytes, then the texts
  reader = parts._reader(str(path), 480, "text", "id")
  assert reader.count == 2
  assert [text for _, _, text in reader.read(1)] == [f"text {i}" for i in range(10)]
  with pytest.raises(RunError, match=r"invalid UTF-8 in the line at byte 0 "):
    list(reader.read(0))


def test_a_run_stopped_at_any_moment_continues_to_what_an_uninterrupted_run_writes(
    folder, tmp_path, monkeypatch):  # noqa: F811
  source = _input("jsonl", tmp_path)
  whole = str(tmp_path / "whole") + "/"
  embed.embed(folder, source, whole, part_mb=PART_MB)

  from flax_encoder.embeddings import SentenceEncoder
  call, calls = SentenceEncoder.__call__, {"n": 0}

  def stopped_at_the_fifth(self, *args, **kwargs):
    calls["n"] += 1
    if calls["n"] == 5:
      raise KeyboardInterrupt
    return call(self, *args, **kwargs)

  resumed = str(tmp_path / "resumed") + "/"
  with monkeypatch.context() as m:
    m.setattr(SentenceEncoder, "__call__", stopped_at_the_fifth)
    with pytest.raises(KeyboardInterrupt):
      embed.embed(folder, source, resumed, part_mb=PART_MB)
  left = os.listdir(resumed)
  done = len(done_parts(left))
  assert done >= 4 and not [name for name in left if ".tmp-" in name]  # the 5th call's part gone
  with pytest.raises(CorpusError, match=rf"incomplete \({done} parts written so far\): run the"):
    read_embeddings(resumed)
  embed.embed(folder, source, resumed, part_mb=PART_MB)
  assert sorted(os.listdir(whole)) == sorted(os.listdir(resumed))
  # a part's file lost, or another's ids in its place: one line naming it
  for name, value in (("part-00001.npy", None), ("part-00002.ids.json", b'{"line": []}')):
    damaged = tmp_path / "damaged"
    shutil.rmtree(damaged, ignore_errors=True)
    shutil.copytree(tmp_path / "whole", damaged)
    if value is None:
      (damaged / name).unlink()
    else:
      (damaged / name).write_bytes(value)
    with pytest.raises(CorpusError, match=rf"{name}: (no such file|its SHA-256 differs)"):
      read_embeddings(str(damaged))
  for name in os.listdir(whole):
    assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "resumed" / name).read_bytes()


@pytest.mark.slow  # kill -9 of a process of its own
def test_kill_9_then_the_same_command_gives_an_uninterrupted_runs_folder(folder, tmp_path):  # noqa: F811
  source = str(tmp_path / "in.txt")
  with open(source, "w") as f:
    f.writelines(f"{TEXTS[i % len(TEXTS)]} {i}\n" for i in range(3000))
  args = ["--model", folder, "--input", source, "--part-mb", "0.002"]
  killed = str(tmp_path / "killed") + "/"
  proc = subprocess.Popen([sys.executable, "-m", "train.embed", *args, "--out", killed],
                          cwd=runs.ROOT, env=runs.environment(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + runs.limit(120)
  while not os.path.exists(os.path.join(killed, "part-00003.json")):
    assert proc.poll() is None and time.monotonic() < deadline
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert embed.main([*args, "--out", killed]) == 0
  whole = str(tmp_path / "whole") + "/"
  assert embed.main([*args, "--out", whole]) == 0
  assert sorted(os.listdir(whole)) == sorted(os.listdir(killed))  # no part half-written
  for name in os.listdir(whole):
    assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "killed" / name).read_bytes()


def test_another_runs_folder_is_refused_in_one_line_and_never_mixed(folder, tmp_path, capsys):  # noqa: F811
  source = tmp_path / "in.jsonl"
  _jsonl(source, _records(20))
  out = str(tmp_path / "out") + "/"
  common = ["--model", folder, "--out", out, "--part-mb", str(PART_MB)]
  assert embed.main([*common, "--input", str(source)]) == 0
  manifest = (tmp_path / "out" / "manifest.json").read_bytes()

  _jsonl(source, _records(21))  # the input changed
  assert embed.main([*common, "--input", str(source)]) == 2
  error = capsys.readouterr().err.strip().splitlines()[-1]
  assert error.startswith(f"embed: error: --out {out}: holds the embeddings of another run "
                          f"(the input's size was ")
  _jsonl(source, _records(20))
  assert embed.main([*common, "--input", str(source), "--prompt", "query: "]) == 2
  assert "(the prompt was '', now 'query: ')" in capsys.readouterr().err
  assert (tmp_path / "out" / "manifest.json").read_bytes() == manifest  # left as it was

  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "notes.txt").write_text("mine")
  assert embed.main(["--model", folder, "--input", str(source),
                     "--out", str(tmp_path / "other")]) == 2
  assert "a directory holding 'notes.txt' and no manifest.json" in capsys.readouterr().err
  with pytest.raises(RunError, match="a file, which one of 2 processes cannot write"):
    embed.embed(folder, str(source), str(tmp_path / "e.npy"), process=(0, 2))


@pytest.mark.slow  # several processes
def test_two_processes_of_two_devices_and_eight_devices_write_what_one_device_writes(folder, tmp_path):  # noqa: F811
  source = _input("jsonl", tmp_path)
  one = str(tmp_path / "one") + "/"
  embed.embed(folder, source, one, part_mb=PART_MB)
  shared = str(tmp_path / "shared") + "/"
  out = subprocess.run(
      [sys.executable, "-m", "train.launch", "--program", "embed", "--processes", "2",
       "--devices-per-process", "2", "--", "--model", folder, "--input", source,
       "--out", shared, "--part-mb", str(PART_MB)],
      cwd=runs.ROOT, env=runs.environment(), capture_output=True, text=True,
      timeout=runs.limit(300))
  assert out.returncode == 0, out.stdout[-3000:]
  assert f"[0] {shared}: 60 embeddings" in out.stdout
  assert "2 processes of 2 cpu devices" in out.stdout
  eight = str(tmp_path / "eight") + "/"
  out = subprocess.run(
      [sys.executable, "-m", "train.embed", "--model", folder, "--input", source, "--out", eight,
       "--part-mb", str(PART_MB)], cwd=runs.ROOT, env=runs.EIGHT_DEVICES, capture_output=True,
      text=True, timeout=runs.limit(300))
  assert out.returncode == 0, out.stderr[-3000:]
  assert "1 process of 8 cpu devices, 2048 ids a device a call" in out.stdout
  expected_ids, expected = read_embeddings(one)
  for written in (shared, eight):
    ids, vectors = read_embeddings(written)
    assert ids == expected_ids
    np.testing.assert_allclose(vectors, expected, atol=1e-6)


@pytest.mark.slow  # several processes
def test_two_processes_write_int8_parts_by_the_same_ranges_as_one(folder, tmp_path):  # noqa: F811
  # int8's ranges are process 0's, broadcast to the other (JAX's own): one manifest, and the
  # codes one process writes, but for a float on a bucket's edge
  source = _input("jsonl", tmp_path)
  one = str(tmp_path / "one") + "/"
  embed.embed(folder, source, one, part_mb=PART_MB, precision="int8", calibration_texts=20)
  shared = str(tmp_path / "shared") + "/"
  out = subprocess.run(
      [sys.executable, "-m", "train.launch", "--program", "embed", "--processes", "2",
       "--devices-per-process", "2", "--", "--model", folder, "--input", source,
       "--out", shared, "--part-mb", str(PART_MB), "--precision", "int8",
       "--calibration-texts", "20"],
      cwd=runs.ROOT, env=runs.environment(), capture_output=True, text=True,
      timeout=runs.limit(300))
  assert out.returncode == 0, out.stdout[-3000:]
  ranges = [np.array(read_manifest(d)["model"]["ranges"]) for d in (one, shared)]
  np.testing.assert_allclose(*ranges, atol=1e-6)
  (ids, codes), (expected_ids, expected) = read_embeddings(shared), read_embeddings(one)
  assert ids == expected_ids and codes.dtype == np.int8
  assert np.abs(codes.astype(np.int16) - expected).max() <= 1


@pytest.mark.parametrize("option, value, said", [
    # a changed --dtype was said as a change of the model's fingerprint
    ("--dtype", "bfloat16", "--dtype was 'float32', now 'bfloat16'"),
    # a changed --id-field was hidden by a cut of both fields at 20 characters
    ("--id-field", "key", "--id-field was 'id', now 'key'"),
    ("--text-field", "body", "--text-field was 'text', now 'body'"),
])
def test_a_changed_option_is_named_with_both_values(option, value, said, folder, tmp_path,  # noqa: F811
                                                     capsys):
  source = tmp_path / "in.jsonl"
  _jsonl(source, [{**r, "key": r.get("id"), "body": r["text"]} for r in _records(8)])
  out = str(tmp_path / "out") + "/"
  common = ["--model", folder, "--out", out, "--part-mb", str(PART_MB), "--input", str(source)]
  assert embed.main(common) == 0
  capsys.readouterr()
  assert embed.main([*common, option, value]) == 2
  error = capsys.readouterr().err.strip().splitlines()[-1]
  assert f"holds the embeddings of another run ({said}); expected this command's" in error


@pytest.mark.parametrize("damage", ["npy", "ids", "list", "no rows"])
def test_a_part_damaged_since_it_was_written_is_embedded_again_and_said(damage, folder, tmp_path,  # noqa: F811
                                                                         capsys):
  # A .npy overwritten in place (same size) counted as done, and read_embeddings then refused
  # the "complete" folder; a marker that is a list, or lacks rows, was an AttributeError or a
  # KeyError.
  source = tmp_path / "in.jsonl"
  _jsonl(source, _records(20))
  out = tmp_path / "out"
  assert embed.embed(folder, str(source), f"{out}/", part_mb=PART_MB) == 20
  want_ids, want = read_embeddings(str(out))
  part = out / "part-00001"
  if damage == "npy":  # the same size, other values
    data = bytearray((out / "part-00001.npy").read_bytes())
    data[-4:] = np.float32(7).tobytes()
    (out / "part-00001.npy").write_bytes(bytes(data))
  elif damage == "ids":
    about = json.loads((out / "part-00001.ids.json").read_text())
    (out / "part-00001.ids.json").write_text(json.dumps({**about, "ids": None}))
  else:
    about = json.loads(part.with_suffix(".json").read_text())
    part.with_suffix(".json").write_text(json.dumps(
        list(about) if damage == "list" else {k: v for k, v in about.items() if k != "rows"}))
  capsys.readouterr()
  assert embed.embed(folder, str(source), f"{out}/", part_mb=PART_MB) == 20
  assert "embed: part-00001 is embedded again: its " in capsys.readouterr().err
  ids, vectors = read_embeddings(str(out))
  assert ids == want_ids
  np.testing.assert_allclose(vectors, want, atol=1e-6)


@pytest.mark.parametrize("change, said", [
    (lambda m: {**m, "parts": [{k: v for k, v in p.items() if k != "file"} for p in m["parts"]]},
     "parts[0].file=None, expected a string"),
    (lambda m: {**m, "parts": [{**p, "file": "../elsewhere.npy"} for p in m["parts"]]},
     "parts[0].file='../elsewhere.npy', expected the name of a .npy file of the folder"),
    (lambda m: {**m, "parts": "all"}, "parts='all', expected a list of the parts"),
    (lambda m: {**m, "model": {**m["model"], "dim": "32"}}, "model.dim='32', expected an "
                                                             "integer >= 1"),
])
def test_a_damaged_manifest_is_one_corpus_error_naming_the_field(change, said, folder,  # noqa: F811
                                                                 tmp_path):
  # a manifest part without file was a KeyError
  source = tmp_path / "in.jsonl"
  _jsonl(source, _records(12))
  out = tmp_path / "out"
  embed.embed(folder, str(source), f"{out}/", part_mb=PART_MB)
  manifest = out / "manifest.json"
  manifest.write_text(json.dumps(change(json.loads(manifest.read_text()))))
  with pytest.raises(CorpusError) as e:
    read_embeddings(str(out))
  assert str(e.value) == f"{manifest}: {said}"


def test_a_manifest_nested_too_deep_is_one_corpus_error(tmp_path):
  # a RecursionError it was
  (tmp_path / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
  with pytest.raises(CorpusError, match=r"manifest.json: not readable JSON \(nested too "):
    read_embeddings(str(tmp_path))


def test_an_input_changed_in_its_middle_is_embedded_again_where_it_changed(folder, tmp_path,  # noqa: F811
                                                                           monkeypatch, capsys):
  # Same size, the change between the head and the tail its fingerprint reads (a few bytes
  # here, a MiB of each in a run): it kept the old vectors and said complete.
  monkeypatch.setattr(parts, "_SAMPLE", 40)
  source = tmp_path / "in.jsonl"
  rows = _records(20)
  _jsonl(source, rows)
  out = tmp_path / "out"
  assert embed.embed(folder, str(source), f"{out}/", part_mb=PART_MB) == 20
  rows[10] = {**rows[10], "text": rows[10]["text"][::-1]}  # the same bytes, reversed
  _jsonl(source, rows)
  capsys.readouterr()
  assert embed.embed(folder, str(source), f"{out}/", part_mb=PART_MB) == 20
  err = capsys.readouterr().err
  assert err.count("is embedded again: its input differs from what it embedded") == 1
  ids, vectors = read_embeddings(str(out))
  expected_ids, expected = _single(folder, str(source), tmp_path)
  assert ids == expected_ids
  np.testing.assert_allclose(vectors, expected, atol=1e-6)


def test_an_input_that_grows_while_it_is_read_is_said_and_the_folder_left_incomplete(
    folder, tmp_path, monkeypatch):  # noqa: F811
  # 266 of 1,000 appended lines went in, the rest dropped, and the folder said complete.
  source = tmp_path / "in.jsonl"
  _jsonl(source, _records(20))
  finish = parts._Part.finish

  def finish_then_grow(self, *args):
    finish(self, *args)
    if self.k == 0:
      with open(source, "a") as f:
        f.write(json.dumps({"text": "appended while the run reads"}) + "\n")

  monkeypatch.setattr(parts._Part, "finish", finish_then_grow)
  out = tmp_path / "out"
  with pytest.raises(RunError) as e:
    embed.embed(folder, str(source), f"{out}/", part_mb=PART_MB)
  assert str(e.value).startswith(f"--input {source}: changed while it was read (")
  assert e.value.exit_code == 1
  with pytest.raises(CorpusError, match="incomplete"):
    read_embeddings(str(out))
