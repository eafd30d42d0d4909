"""What the commands write and what they leave alone: every `--out` replaces a regular file
whole or not at all and writes a stream (a FIFO, a device) in place, never replacing it; the
readers of a run (export, predict, load_encoder) write, move and delete nothing in its workdir,
a save in flight included."""

import errno
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading

import pytest

from tests import runs
from train.errors import RunError
from train.outputs.export import main as export_main
from train.outputs.predict import predict
from train.run.metrics import read_metrics

CLASSES = {"digits": "0123456789", "letters": "abcdefghij"}


def _tree(directory):
  """Every entry below `directory`, files with their sizes and modification times."""
  out = {}
  for root, dirs, files in os.walk(directory):
    for name in dirs + files:
      path = os.path.join(root, name)
      info = os.stat(path)
      out[os.path.relpath(path, directory)] = (stat.S_ISDIR(info.st_mode), info.st_size,
                                               info.st_mtime_ns)
  return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """(a tiny classify run's workdir, its eval.jsonl): from scratch, bytes, four steps."""
  directory = tmp_path_factory.mktemp("outputs")
  rows = [{"text": CLASSES[label][i % 7:] * 2, "label": label}
          for i in range(24) for label in CLASSES]
  for name in ("train.jsonl", "eval.jsonl"):
    (directory / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
  workdir = str(directory / "run")
  runs.train(workdir, f"--config={os.path.join(runs.ROOT, 'configs', 'classify.py')}",
             f"--config.data.train={directory / 'train.jsonl'}",
             f"--config.data.eval={directory / 'eval.jsonl'}", "--config.data.tokenizer=bytes",
             "--config.model.d_model=16", "--config.model.n_heads=2", "--config.model.d_ff=32",
             "--config.model.n_layers=1", "--config.model.max_len=32",
             "--config.train.num_steps=4", "--config.train.batch_size=8",
             "--config.train.seq_len=32", "--config.train.eval_every=4",
             "--config.train.checkpoint_every=4", config=None)
  return workdir, str(directory / "eval.jsonl")


def _read_fifo(path, into):
  with open(path, "rb") as f:
    into.append(f.read())


def test_predict_writes_a_fifo_as_a_stream_and_leaves_it_a_fifo(run, tmp_path):
  workdir, lines = run
  fifo = str(tmp_path / "predictions")
  os.mkfifo(fifo)
  received = []
  reader = threading.Thread(target=_read_fifo, args=(fifo, received))
  reader.start()
  done = predict(workdir, lines, fifo)
  reader.join(timeout=runs.limit(60))
  assert stat.S_ISFIFO(os.stat(fifo).st_mode)
  written = received[0].decode().splitlines()
  assert len(written) == done.count == 48 and json.loads(written[0])["label"] in CLASSES
  assert os.listdir(tmp_path) == ["predictions"]  # no temporary file beside it


def test_a_character_device_is_written_in_place_never_replaced(run, tmp_path):
  workdir, lines = run
  assert predict(workdir, lines, "/dev/null").count == 48
  assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
  assert not [n for n in os.listdir("/dev") if n.startswith("null.tmp")]
  with pytest.raises(RunError, match=f"--out /dev/full: cannot write it \\("
                                     f"{os.strerror(errno.ENOSPC)}\\)"):
    predict(workdir, lines, "/dev/full")
  assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


@pytest.mark.parametrize("suffix", [".msgpack", ".safetensors", ".jaxexport"])
def test_export_streams_to_a_fifo_and_fails_on_dev_full_in_one_line(run, tmp_path, capsys,
                                                                       suffix):
  workdir, _ = run
  if suffix == ".safetensors":
    pytest.importorskip("torch")
  fifo = str(tmp_path / f"encoder{suffix}")
  os.mkfifo(fifo)
  received = []
  reader = threading.Thread(target=_read_fifo, args=(fifo, received))
  reader.start()
  assert export_main(["--workdir", workdir, "--out", fifo]) == 0
  reader.join(timeout=runs.limit(60))
  assert stat.S_ISFIFO(os.stat(fifo).st_mode) and len(received[0]) > 1000
  full = str(tmp_path / f"full{suffix}")
  os.symlink("/dev/full", full)
  capsys.readouterr()
  assert export_main(["--workdir", workdir, "--out", full]) == 1
  error = capsys.readouterr().err
  assert error == (f"export: error: --out {full}: cannot write it "
                   f"({os.strerror(errno.ENOSPC)})\n")
  assert os.path.islink(full) and stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_link_is_written_through_and_stays_a_link(run, tmp_path):
  workdir, lines = run
  target = tmp_path / "real.jsonl"
  target.write_text("old\n")
  link = tmp_path / "link.jsonl"
  link.symlink_to(target)
  predict(workdir, lines, str(link))
  assert link.is_symlink() and len(target.read_text().splitlines()) == 48


def test_a_socket_at_out_is_refused_in_one_line(run, tmp_path, capsys):
  workdir, lines = run
  path = str(tmp_path / "socket.msgpack")
  with socket.socket(socket.AF_UNIX) as server:
    server.bind(path)
    with pytest.raises(RunError, match=f"^--out {path}: a socket, expected the name of a file"):
      predict(workdir, lines, path)
    assert export_main(["--workdir", workdir, "--out", path]) == 2
    assert capsys.readouterr().err.startswith(f"export: error: --out {path}: a socket")
    assert stat.S_ISSOCK(os.stat(path).st_mode)


def test_readers_of_a_live_run_leave_its_save_in_flight_and_everything_else_alone(run,
                                                                                   tmp_path):
  from train.run.load import load_config, load_encoder
  workdir = str(tmp_path / "run")
  shutil.copytree(run[0], workdir)
  # What orbax's writer has on disk while it saves step 8: a temporary directory.
  in_flight = os.path.join(workdir, "checkpoints", "8.orbax-checkpoint-tmp-1234567")
  os.makedirs(os.path.join(in_flight, "state"))
  open(os.path.join(in_flight, "state", "manifest.ocdbt"), "wb").close()
  before = _tree(workdir)
  load_config(workdir)
  load_encoder(workdir)
  assert export_main(["--workdir", workdir, "--out", str(tmp_path / "encoder.msgpack")]) == 0
  predict(workdir, run[1], str(tmp_path / "predictions.jsonl"))
  assert _tree(workdir) == before


def test_a_checkpoint_that_fails_verification_is_skipped_where_it_is_by_a_reader(run,
                                                                                  tmp_path):
  from train.run.load import load_encoder
  workdir = str(tmp_path / "run")
  shutil.copytree(run[0], workdir)
  newest = os.path.join(workdir, "checkpoints", "4")
  older = os.path.join(workdir, "checkpoints", "2")
  shutil.copytree(newest, older)  # an older one that verifies, to fall back to
  damaged = os.path.join(newest, "meta", "metadata")
  with open(damaged, "ab") as f:
    f.write(b" ")
  before = _tree(workdir)
  with pytest.warns(UserWarning, match="left it in place"):
    load_encoder(workdir)
  assert _tree(workdir) == before and not os.path.exists(workdir + "/checkpoints_corrupt")


def _rotating(workdir, reads):
  """A stand-in for a live run that saves the next checkpoint and deletes the one being read
  during each of the first `reads` reads; the reads after it go through."""
  from train.run.load import load_encoder

  def read(real_read):
    def reading(checkpointer):
      if read.calls < reads:
        read.calls += 1
        steps = checkpointer.steps()
        older = os.path.join(workdir, "checkpoints", str(steps[-1]))
        shutil.copytree(older, os.path.join(workdir, "checkpoints", str(steps[-1] + 2)))
        shutil.rmtree(older)
        raise ValueError("Truncated Zstd-compressed stream")  # what tensorstore said
      return real_read(checkpointer)
    return reading
  read.calls = 0
  return read, load_encoder


@pytest.mark.parametrize("patience, reads", [(120.0, 3), (0.0, 1)])
def test_a_reader_starts_again_while_a_live_run_rotates_its_checkpoints(run, tmp_path,
                                                                       monkeypatch, patience,
                                                                       reads):
  from train.run import load
  workdir = str(tmp_path / "run")
  shutil.copytree(run[0], workdir)
  wrap, load_encoder = _rotating(workdir, reads)
  real = load._reading
  monkeypatch.setattr(load, "_PATIENCE_S", patience)
  monkeypatch.setattr(load, "_reading", lambda w, read: real(w, wrap(read)))
  if patience:  # each read that fails is tried again on the newer checkpoint, which reads
    cfg, variables = load_encoder(workdir)
    assert cfg.d_model == 16 and wrap.calls == 3
    assert os.listdir(os.path.join(workdir, "checkpoints")) == ["10"]
  else:  # out of patience: one line naming the workdir and what to do, no traceback
    with pytest.raises(RunError) as e:
      load_encoder(workdir)
    assert str(e.value).startswith(f"workdir {workdir}: the live run deleted the checkpoint "
                                   f"being read, on each of 1 tries") and "\n" not in str(e.value)
    assert "config.train.keep_checkpoints" in str(e.value)


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
  """A tiny classify run of a DistilBERT architecture from scratch: --layout hf exports it."""
  directory = tmp_path_factory.mktemp("bert_run")
  rows = [{"text": CLASSES[label][i % 7:], "label": label} for i in range(8) for label in CLASSES]
  data = directory / "train.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in rows))
  workdir = str(directory / "run")
  distilbert = ["position_embedding=learned", "embedding_scale=False", "embedding_norm=True",
                "final_norm=False", "layer_norm_eps=1e-12", "activation=gelu", "d_model=16",
                "n_heads=2", "d_ff=32", "n_layers=1", "max_len=32"]
  runs.train(workdir, f"--config={os.path.join(runs.ROOT, 'configs', 'classify.py')}",
             f"--config.data.train={data}", f"--config.data.eval={data}",
             "--config.data.tokenizer=bytes", "--config.task.pooling=pre_classifier",
             *[f"--config.model.{f}" for f in distilbert], "--config.train.num_steps=2",
             "--config.train.batch_size=8", "--config.train.seq_len=16",
             "--config.train.eval_every=2", "--config.train.checkpoint_every=2", config=None)
  return workdir


def test_an_hf_export_is_readable_by_others_and_removes_what_a_killed_one_left(bert_run,
                                                                              tmp_path, capsys):
  pytest.importorskip("torch")
  out = str(tmp_path / "exported")
  left = f"{out}.tmp-{socket.gethostname()}-999999999"  # a killed export's, its pid gone
  os.makedirs(left)
  assert export_main(["--workdir", bert_run, "--layout", "hf", "--out", out]) == 0
  assert f"removed {left}" in capsys.readouterr().err
  assert sorted(os.listdir(tmp_path)) == ["exported"]
  umask = os.umask(0)
  os.umask(umask)
  for name in os.listdir(out):
    assert stat.S_IMODE(os.stat(os.path.join(out, name)).st_mode) == 0o666 & ~umask, name


def test_an_hf_export_through_a_link_to_an_empty_directory_writes_its_target(bert_run,
                                                                            tmp_path):
  pytest.importorskip("torch")
  target = tmp_path / "target"
  target.mkdir()
  link = tmp_path / "link"
  link.symlink_to(target)
  assert export_main(["--workdir", bert_run, "--layout", "hf", "--out", str(link)]) == 0
  assert link.is_symlink() and (target / "config.json").is_file()


def test_an_hf_export_onto_a_full_disk_is_one_line_and_leaves_nothing(bert_run, tmp_path,
                                                                      capsys):
  pytest.importorskip("torch")
  with runs.full_file_system(str(tmp_path / "small")) as mount:
    out = os.path.join(mount, "exported")
    assert export_main(["--workdir", bert_run, "--layout", "hf", "--out", out]) == 1
    assert capsys.readouterr().err == (f"export: error: --out {out}: cannot write it "
                                       f"({os.strerror(errno.ENOSPC)})\n")
    assert os.listdir(mount) == ["filler"]


@pytest.mark.slow
def test_exporting_a_live_run_again_and_again_does_not_disturb_it(tmp_path):
  """The run saves every two steps, keeping one checkpoint, while exports read it."""
  rows = [{"text": CLASSES[label][i % 7:] * 2, "label": label}
          for i in range(24) for label in CLASSES]
  data = tmp_path / "train.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in rows))
  workdir = str(tmp_path / "run")
  args = [f"--config={os.path.join(runs.ROOT, 'configs', 'classify.py')}",
          f"--workdir={workdir}", f"--config.data.train={data}", f"--config.data.eval={data}",
          "--config.data.tokenizer=bytes", "--config.model.d_model=16",
          "--config.model.n_heads=2", "--config.model.d_ff=32", "--config.model.n_layers=1",
          "--config.model.max_len=32", "--config.train.num_steps=80",
          "--config.train.batch_size=8", "--config.train.seq_len=32",
          "--config.train.eval_every=40", "--config.train.checkpoint_every=2",
          "--config.train.keep_checkpoints=1"]
  with open(tmp_path / "log", "w") as log:
    live = subprocess.Popen([sys.executable, "-m", "train", *args], cwd=runs.ROOT,
                            env=runs.environment(), stdout=log, stderr=log)
    try:
      runs.wait_for_step(workdir, 2)
      exported = 0
      while live.poll() is None:
        exported += export_main(["--workdir", workdir, "--out", str(tmp_path / "e.msgpack")]) == 0
    finally:
      live.kill()
  assert live.wait() == 0, (tmp_path / "log").read_text()[-3000:]
  assert exported >= 2
  steps = [r["step"] for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))
           if r["split"] == "train"]
  assert max(steps) == 80


def test_a_run_that_embeds_no_sentences_is_no_sentence_transformers_folder(run, tmp_path,
                                                                            capsys):
  out = str(tmp_path / "folder")
  assert export_main(["--workdir", run[0], "--layout", "sentence-transformers",
                      "--out", out]) == 2
  assert capsys.readouterr().err == (
      "export: error: --layout sentence-transformers: a classify run embeds no sentences (a "
      "contrastive run does: configs/embed.py)\n")
  assert not os.path.exists(out)
