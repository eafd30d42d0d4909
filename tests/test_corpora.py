"""Corpora as they are stored (directories, compressed files, Parquet), prepared in shards,
trained on as one dataset or as a weighted mixture, and a prepare that stops when told."""

import bz2
import gzip
import hashlib
import json
import lzma
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest

from tests import runs
from train.data import dataset, pipeline, prepare
from train.errors import RunError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def documents():
  from train.data.sources import builtin_topics
  return list(builtin_topics())  # 79, ~460 KB


def _windows(directory, split=None):
  """The windows of a prepared directory as a sorted list of bytes (a multiset)."""
  with open(os.path.join(directory, "dataset.json")) as f:
    meta = json.load(f)
  rows = []
  for name in [split] if split else ["train", "eval"]:
    ids = np.fromfile(os.path.join(directory, f"{name}.bin"), meta["dtype"])
    rows += [r.tobytes() for r in ids.reshape(-1, meta["seq_len"])]
  return sorted(rows)


def _bins(directory):
  return [open(os.path.join(directory, f"{s}.bin"), "rb").read() for s in ("train", "eval")]


def test_compressed_and_parquet_inputs_give_the_windows_of_their_plain_equivalents(
    documents, tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  import zstandard
  lines = "".join(json.dumps({"text": d, "n": i}) + "\n" for i, d in enumerate(documents))
  plain = lines.encode()
  stored = {"c.jsonl": plain, "c.jsonl.gz": gzip.compress(plain),
            "c.jsonl.bz2": bz2.compress(plain), "c.jsonl.xz": lzma.compress(plain),
            "c.jsonl.zst": zstandard.ZstdCompressor().compress(plain),
            "c.txt": "\n".join(documents).encode(), "c.txt.gz": gzip.compress(
                "\n".join(documents).encode())}
  for name, content in stored.items():
    (tmp_path / name).write_bytes(content)
  pq.write_table(pa.table({"id": list(range(len(documents))), "text": documents}),
                 tmp_path / "c.parquet", row_group_size=16)  # several row groups
  results = {}
  for name in [*stored, "c.parquet"]:
    meta = prepare.prepare([str(tmp_path / name)], str(tmp_path / f"out-{name}"), seq_len=64,
                           eval_fraction=0.1, progress=False)
    results[name] = _bins(tmp_path / f"out-{name}")
    raw = (tmp_path / name).read_bytes()
    assert meta["inputs"][0]["bytes"] == len(raw)  # the file as stored
    assert meta["inputs"][0]["sha256"] == hashlib.sha256(raw).hexdigest()
  for name in ["c.jsonl.gz", "c.jsonl.bz2", "c.jsonl.xz", "c.jsonl.zst", "c.parquet"]:
    assert results[name] == results["c.jsonl"], name
  assert results["c.txt.gz"] == results["c.txt"]


def test_bad_stored_inputs_are_one_line_naming_the_file(documents, tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  import zstandard
  lines = b'{"text": "a"}\n' * 1000
  (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(lines)[:-30])
  frames = b"".join(zstandard.ZstdCompressor().compress(lines[i:i + 1400])
                    for i in range(0, len(lines), 1400))
  (tmp_path / "cut.jsonl.zst").write_bytes(frames[:len(frames) * 6 // 10 + 5])  # within a frame
  (tmp_path / "head.jsonl.zst").write_bytes(frames[:20])  # nothing decompresses
  (tmp_path / "ok.jsonl").write_bytes(lines)
  pq.write_table(pa.table({"body": ["a"]}), tmp_path / "nocol.parquet")
  pq.write_table(pa.table({"text": ["a", None]}), tmp_path / "null.parquet")
  (tmp_path / "fake.parquet").write_bytes(b"not parquet")
  cases = {"cut.jsonl.gz": r"cut.jsonl.gz: not a readable .gz file",
           "cut.jsonl.zst": r"cut.jsonl.zst: not a readable .zst file .*truncated",
           "ok.jsonl head.jsonl.zst": r"head.jsonl.zst: not a readable .zst file .*truncated",
           "nocol.parquet": r"nocol.parquet: no column 'text' \(--text-field\); it has body",
           "null.parquet": r"null.parquet: row 2: 'text' \(--text-field\) is NoneType",
           "fake.parquet": r"fake.parquet: not a readable Parquet file"}
  for names, message in cases.items():
    with pytest.raises(prepare.PrepareError, match=message):
      prepare.prepare([str(tmp_path / n) for n in names.split()], str(tmp_path / "out"),
                      progress=False)
    assert not (tmp_path / "out").exists()


def test_directories_and_recursive_globs_name_every_file_below(tmp_path):
  for path in ["src/a.c", "src/b.h", "src/deep/er/c.c", "src/.git/HEAD", "src/deep/.hidden.c"]:
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text(path)
  src = str(tmp_path / "src")
  names = lambda paths: [os.path.relpath(p, src) for p in paths]
  assert names(prepare.expand([src])) == ["a.c", "b.h", "deep/er/c.c"]
  assert names(prepare.expand([src], include=["*.c"])) == ["a.c", "deep/er/c.c"]
  assert names(prepare.expand([f"{src}/**/*.c"])) == ["a.c", "deep/er/c.c"]
  assert names(prepare.expand([src, f"{src}/a.c"])) == ["a.c", "b.h", "deep/er/c.c"]  # once
  with pytest.raises(prepare.PrepareError, match=r"no file below it matches --include \*.rs"):
    prepare.expand([src], include=["*.rs"])


def test_link_loops_are_not_gone_round_and_each_real_file_is_read_once(tmp_path):
  (tmp_path / "src" / "deep").mkdir(parents=True)
  (tmp_path / "src" / "deep" / "a.txt").write_text("a")
  (tmp_path / "src" / "deep" / "up").symlink_to("..")  # glob.glob goes round it 40 times
  (tmp_path / "src" / "also.txt").symlink_to("deep/a.txt")
  src = str(tmp_path / "src")
  names = lambda paths: [os.path.relpath(p, src) for p in paths]
  assert names(prepare.expand([f"{src}/**/*.txt"])) == ["also.txt"]  # the link, read once
  assert names(prepare.expand([f"{src}/deep/**", src, f"{src}/./deep/a.txt"])) == ["deep/a.txt"]
  (tmp_path / "src" / "gone.txt").symlink_to("nowhere.txt")
  with pytest.raises(prepare.PrepareError, match=r"gone.txt is a symbolic link to 'nowhere.txt',"
                                                 r" which does not exist"):
    prepare.expand([src])


def _corpus_tree(tmp_path, documents):
  """Files of several sizes, one big enough to be split into parts of its own."""
  tree = tmp_path / "corpus"
  (tree / "sub").mkdir(parents=True)
  for i in range(5):
    (tree / f"doc{i}.txt").write_text("\n".join(documents[i * 8:(i + 1) * 8]))
  big = "".join(json.dumps({"text": d}) + "\n" for d in documents)
  (tree / "sub" / "big.jsonl.gz").write_bytes(gzip.compress(big.encode()))
  return str(tree)


def test_shards_prepared_apart_hold_the_windows_of_one_prepare_and_train_as_one(
    documents, tmp_path):
  tree = _corpus_tree(tmp_path, documents)
  options = dict(seq_len=64, eval_fraction=0.1, progress=False, part_mb=0.05)
  whole = prepare.prepare([tree], str(tmp_path / "whole"), **options)
  assert whole["shard"]["parts"] >= 5
  for shard in range(3):
    meta = prepare.prepare([tree], str(tmp_path / f"part-{shard}"), shard=shard, num_shards=3,
                           workers=2 if shard == 0 else 1, **options)
    assert meta["shard"] == {**whole["shard"], "index": shard, "count": 3}
  for split in ("train", "eval"):
    union = sorted(w for s in range(3) for w in _windows(tmp_path / f"part-{s}", split))
    assert union == _windows(tmp_path / "whole", split)

  together = dataset.load_prepared(f"{tmp_path}/part-*", 64)  # the glob syntax of the config
  assert sorted(r.tobytes() for r in together.train[:]) == _windows(tmp_path / "whole", "train")
  listed = dataset.load_prepared(",".join(f"{tmp_path}/part-{s}" for s in range(3)), 64)
  np.testing.assert_array_equal(listed.train[:], together.train[:])
  batches = pipeline.TrainBatches(together.train, 16, seed=0, rows=slice(None))
  epoch = np.concatenate([next(batches) for _ in range(len(together.train) // 16)])
  drawn, held = Counter(r.tobytes() for r in epoch), Counter(_windows(tmp_path / "whole", "train"))
  assert not drawn - held  # one epoch: no window more often than the union holds it

  with pytest.raises(prepare.PrepareError, match="--num-shards 2 with --tokenizer "
                     "sentencepiece: every shard needs the same tokenizer"):
    prepare.prepare([tree], str(tmp_path / "x"), "sentencepiece", 300, shard=0, num_shards=2)
  with pytest.raises(prepare.PrepareError, match="--num-shards 50: the inputs make"):
    prepare.prepare([tree], str(tmp_path / "x"), shard=0, num_shards=50, **options)


def test_datasets_that_disagree_are_refused_naming_them(documents, tmp_path):
  (tmp_path / "a.txt").write_text("\n".join(documents[:30]))
  for name, tokenizer, size in (("bytes", "bytes", None), ("bytes2", "bytes", None),
                                ("sp", "sentencepiece", 500)):
    prepare.prepare([str(tmp_path / "a.txt")], str(tmp_path / name), tokenizer, size,
                    seq_len=32, eval_fraction=0.1, progress=False)
  with pytest.raises(RunError, match=r"config.data.prepared: .*sp and .*bytes differ in their "
                     r"vocabulary \(504 and 260\)"):
    dataset.load_prepared(f"{tmp_path}/bytes,{tmp_path}/sp", 32)
  with pytest.raises(RunError, match=r"config.data.weights: '1', expected 2 positive"):
    dataset.load_prepared(f"{tmp_path}/bytes,{tmp_path}/bytes2", 32, "1")
  with pytest.raises(RunError, match=r"'.*/nothing-\*' matches no directory"):
    dataset.load_prepared(f"{tmp_path}/nothing-*", 32)
  with pytest.raises(RunError, match=r"names .*bytes twice"):
    dataset.load_prepared(f"{tmp_path}/bytes,{tmp_path}/bytes", 32)


def _two_sources(tmp_path, documents, seq_len=32):
  for name, docs in (("a", documents[:60]), ("b", documents[60:])):
    (tmp_path / f"{name}.txt").write_text("\n".join(docs))
    prepare.prepare([str(tmp_path / f"{name}.txt")], str(tmp_path / name), seq_len=seq_len,
                    eval_fraction=0.1, progress=False)
  return f"{tmp_path}/a,{tmp_path}/b"


def test_a_mixture_draws_its_weights_deterministically_and_resumes_exactly(documents, tmp_path):
  windows = dataset.load_prepared(_two_sources(tmp_path, documents), 32, "0.8,0.2")
  sizes = np.diff(windows.sources.starts)
  assert sizes[1] / sizes.sum() > 0.4 and windows.sources.weights == (0.8, 0.2)  # not b's share
  batches = pipeline.TrainBatches(windows.train, 8, seed=0, rows=slice(None),
                              sources=windows.sources)
  rows = np.concatenate([next(batches) for _ in range(1000)])
  shares = batches.shares()
  b_rows = {r.tobytes() for r in windows.train[np.arange(*windows.sources.starts[1:])]}
  drawn_b = np.mean([r.tobytes() in b_rows for r in rows])
  assert abs(drawn_b - 0.2) < 0.02 and abs(shares[f"share {tmp_path}/b"] - 0.2) < 0.02

  again = pipeline.TrainBatches(windows.train, 8, seed=0, rows=slice(None),
                            sources=windows.sources)
  again.set_state({"batches": 600})
  np.testing.assert_array_equal(np.concatenate([next(again) for _ in range(400)]),
                                rows[600 * 8:])
  uniform = dataset.load_prepared(f"{tmp_path}/a,{tmp_path}/b", 32)
  assert uniform.sources.weights is None


def test_a_run_on_a_mixture_logs_each_sources_share(documents, tmp_path):
  prepared = _two_sources(tmp_path, documents)
  workdir = str(tmp_path / "run")
  runs.train(workdir, f"--config.data.prepared={prepared}", "--config.data.weights=1,1",
             "--config.train.num_steps=8", "--config.train.log_every=4")
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    train = [r for r in map(json.loads, f) if r["split"] == "train" and r["step"] % 4 == 0]
  for record in train:
    assert record[f"share {tmp_path}/a"] == pytest.approx(0.5, abs=0.05)
  result = runs.train(str(tmp_path / "bad"), f"--config.data.prepared={prepared}",
                      "--config.data.weights=1", check=False)
  assert result.returncode != 0 and "config.data.weights: '1', expected 2" in result.stderr


def _as_from_a_terminal():
  """SIGINT with its default action and not blocked, as a shell starts a command: what the
  test process inherited or set (an ignored or blocked signal stays so across exec, and
  Python then never raises KeyboardInterrupt) is not the program's."""
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _interrupt(tmp_path, args, wait_for, sig):
  """Starts python -m train.prepare in a session of its own; once `wait_for` shows in its
  output, sends `sig` to the whole session (what Ctrl-C does to a terminal's processes)."""
  process = subprocess.Popen(
      [sys.executable, "-m", "train.prepare", *args, "--out", str(tmp_path / "out")],
      cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True,
      env=runs.environment(), preexec_fn=_as_from_a_terminal)
  seen = ""
  while wait_for not in seen:
    seen += os.read(process.stderr.fileno(), 1 << 16).decode(errors="replace")  # what came
    assert process.poll() is None, seen[-2000:]
  os.killpg(process.pid, sig)
  start = time.monotonic()
  code = process.wait(timeout=runs.limit(30))
  rest = process.stderr.read()
  return code, time.monotonic() - start, rest


@pytest.mark.slow
@pytest.mark.parametrize("phase, sig, code", [("encoding", signal.SIGINT, 130),
                                              ("vocabulary: training", signal.SIGTERM, 143)])
def test_a_signal_ends_a_prepare_promptly_in_any_phase_with_nothing_left(
    documents, tmp_path, phase, sig, code):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(documents) * 40)  # ~20 MB: minutes of work either way
  tokenizer = ["--tokenizer", "sentencepiece", "--vocab-size", "2000"]
  if phase == "encoding":  # tokenizers' BPE encodes ~2 MB/s here: seconds of encoding
    prepare.prepare([str(corpus)], str(tmp_path / "vocab"), "bpe", 500, sample_mb=0.5,
                    vocab_only=True, progress=False)
    tokenizer = ["--tokenizer", str(tmp_path / "vocab" / "tokenizer.json")]
  returned, seconds, err = _interrupt(tmp_path, ["--input", str(corpus), *tokenizer,
                                                 "--workers", "2"], phase, sig)
  assert returned == code and seconds < 10, err[-2000:]
  assert "interrupted" in err and "Traceback" not in err
  assert sorted(os.listdir(tmp_path)) == sorted(["corpus.txt", "vocab"][:1 + (phase ==
                                                                              "encoding")])
  pids = subprocess.run(["pgrep", "-f", str(corpus)], capture_output=True, text=True).stdout
  assert not pids.strip()  # no worker or child process left


def test_tokenizers_vocabularies_train_on_the_sample_and_bpe_encodes_any_text(documents,
                                                                             tmp_path):
  from tokenizers import Tokenizer
  (tmp_path / "a.txt").write_text("\n".join(documents[:20]))
  text = (tmp_path / "a.txt").read_text()
  for kind in ("bpe", "wordpiece", "unigram"):
    meta = prepare.prepare([str(tmp_path / "a.txt")], str(tmp_path / kind), kind, 400,
                           seq_len=64, eval_fraction=0.1, progress=False)
    assert meta["tokenizer"] == {"kind": "huggingface", "file": "tokenizer.json",
                                 "vocab_size": 400}, kind
  first = np.fromfile(tmp_path / "bpe" / "train.bin", np.uint16)[:9 * 64]  # the 10th is held out
  bpe = Tokenizer.from_file(str(tmp_path / "bpe" / "tokenizer.json"))
  decoded = bpe.decode((first - prepare.FIRST_TOKEN_ID).tolist())
  assert len(decoded) > 1000 and text.startswith(decoded[:-1])  # lossless, newlines included

  only = prepare.prepare([str(tmp_path / "a.txt")], str(tmp_path / "vocab"), "bpe", 300,
                         vocab_only=True, progress=False)
  assert only == {"tokenizer": str(tmp_path / "vocab" / "tokenizer.json")}
  assert os.listdir(tmp_path / "vocab") == ["tokenizer.json"]


@pytest.mark.parametrize("suffix", ["", ".gz", ".bz2", ".xz", ".zst"])
def test_a_stored_file_opens_as_its_decompressed_bytes(tmp_path, suffix):
  import zstandard
  from train.data import sources
  data = b'{"text": "a"}\n' * 100
  compress = {"": bytes, ".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress,
              ".zst": zstandard.ZstdCompressor().compress}[suffix]
  path = tmp_path / f"in.jsonl{suffix}"
  path.write_bytes(compress(data))
  assert sources.stored_format(str(path)) == ("jsonl", suffix or None)
  with sources.decompressed(str(path)) as f:
    assert f.read() == data
    if not suffix:  # an uncompressed file can be entered anywhere
      f.seek(14)
      assert f.readline() == b'{"text": "a"}\n'


@pytest.mark.parametrize("line, said", [
    ("not json", "not valid JSON (Expecting value: line 1 column 1 (char 0))"),
    ("[1, 2]", "not a JSON object"),
    ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "JSON nested too deeply to read, expected a JSON object of a few levels"),
    ('{"text": 3}', "'text' (--text-field) is int, expected a string"),
    ('{"text": null}', "'text' (--text-field) is NoneType, expected a string"),
    # it said "'text' (--text-field) is NoneType", of a line it named by its byte alone
    ('{"body": "a"}', "no 'text' field (--text-field), expected the text there"),
])
def test_a_record_is_refused_in_the_same_words_wherever_it_is_read(tmp_path, line, said):
  from train.data import sources
  from train.outputs import corpus, embed
  path = tmp_path / "in.jsonl"
  path.write_text('{"text": "a", "id": 7}\n' + line + "\n")
  with pytest.raises(sources.PrepareError) as prepared:
    list(sources.Source(str(path)).documents("text"))
  with pytest.raises(RunError) as embedded:  # --out FILE: by line number
    list(embed.texts_of(sources.Source(str(path)), str(path), "text", "id"))
  with pytest.raises(RunError) as parts:  # --out DIR/: its number counted, and its byte
    list(corpus._reader(str(path), 1 << 20, "text", "id").read(0))
  assert str(parts.value) == f"--input {path}: line 2 (at byte 23): {said}"
  if "--text-field" in said:  # prepare says which field it wanted its own way
    assert str(embedded.value) == f"--input {path}: line 2: {said}"
  else:
    assert str(prepared.value) == str(embedded.value) == f"{path}:2: {said}"
  assert sources.text_of(sources.record_of_line('{"text": "a", "id": 7}', "x"), "x", "text",
                         "id") == (7, "a")


@pytest.mark.parametrize("name", ["in.jsonl", "in.jsonl.gz"])
def test_a_bad_line_of_a_later_part_is_named_by_its_number_in_the_input(tmp_path, name):
  from train.outputs import corpus
  lines = [json.dumps({"text": f"text {i}", "id": i}) for i in range(50)]
  lines[36] = json.dumps({"body": "no text here"})
  data = ("\n".join(lines) + "\n").encode()
  path = tmp_path / name
  path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
  reader = corpus._reader(str(path), 200, "text", "id")
  begins = data.index(lines[36].encode())
  with pytest.raises(RunError) as e:
    for k in range(len(data) // 200 + 1):
      list(reader.read(k))
  assert str(e.value) == (f"--input {path}: line 37 (at byte {begins}): no 'text' field "
                          f"(--text-field), expected the text there")
