"""python -m train.prepare: windows that hold exactly the documents, deterministic output, every
tokenizer kind, one-line errors naming the file, and training on what it wrote."""

import json
import os
import unicodedata

import numpy as np
import pytest

from tests import runs
from train.data import dataset, prepare, tokens
from train.errors import RunError

DOCS = ["first document\nwith two lines\n", "zweites Dokument: äöü\n", "a third"]


@pytest.fixture
def corpus(tmp_path):
  """Two text files and a JSON-lines file of two documents: the inputs, in input order."""
  (tmp_path / "a.txt").write_text(DOCS[0], encoding="utf-8")
  (tmp_path / "b.txt").write_text(DOCS[1], encoding="utf-8")
  (tmp_path / "c.jsonl").write_text(
      "\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate([DOCS[2], "x"])) + "\n",
      encoding="utf-8")
  return [str(tmp_path / "*.txt"), str(tmp_path / "c.jsonl")]


@pytest.fixture(scope="module")
def topics(tmp_path_factory):
  """~100 KB of the built-in corpus as a text file: enough to train a small vocabulary."""
  from train.data.sources import builtin_topics
  path = tmp_path_factory.mktemp("topics") / "topics.txt"
  path.write_text("".join(builtin_topics()[:60]), encoding="utf-8")
  return str(path)


def _all_windows(out):
  """Every window in the order prepare cut them, from the two splits."""
  with open(os.path.join(out, "dataset.json")) as f:
    meta = json.load(f)
  w = dataset.load_prepared(out, meta["seq_len"])
  every, rows, train, held_out = meta["held_out_every"], [], iter(w.train), iter(w.eval)
  for i in range(len(w.train) + len(w.eval)):
    rows.append(next(held_out) if i % every == every - 1 else next(train))
  return meta, np.concatenate(rows)


def test_bytes_windows_hold_the_documents_back_to_back_with_separators(corpus, tmp_path):
  out = str(tmp_path / "out")
  meta = prepare.prepare(corpus, out, seq_len=8, eval_fraction=0.25, progress=False)
  expected = []
  for doc in [*DOCS, "x"]:
    expected += [b + 4 for b in doc.encode("utf-8")] + [prepare.SEPARATOR_ID]
  _, ids = _all_windows(out)
  padding = -len(expected) % 8
  np.testing.assert_array_equal(ids, expected + [prepare.PAD_ID] * padding)
  assert meta["vocab_size"] == tokens.BYTE_VOCAB_SIZE and meta["dtype"] == "uint16"
  assert meta["windows"]["eval"] == len(ids) // 8 // 4  # every 4th window
  assert [os.path.basename(i["path"]) for i in meta["inputs"]] == ["a.txt", "b.txt", "c.jsonl"]
  assert meta["inputs"][0]["bytes"] == len(DOCS[0].encode())
  assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.txt", "c.jsonl", "out"]  # no leftovers


def test_sentencepiece_is_trained_on_the_corpus_and_the_output_is_deterministic(topics,
                                                                                tmp_path):
  import sentencepiece as spm
  outs = [str(tmp_path / f"out{workers}") for workers in (1, 2)]
  for out, workers in zip(outs, (1, 2)):
    meta = prepare.prepare([topics], out, "sentencepiece", vocab_size=600, seq_len=64,
                           eval_fraction=0.1, workers=workers, progress=False)
  for name in ("train.bin", "eval.bin", "tokenizer.model", "dataset.json"):
    with open(os.path.join(outs[0], name), "rb") as a, open(os.path.join(outs[1], name),
                                                            "rb") as b:
      assert a.read() == b.read(), name  # byte-identical, whatever the worker count
  assert meta["vocab_size"] == 604 and meta["tokenizer"]["file"] == "tokenizer.model"
  _, ids = _all_windows(outs[0])
  assert ids.max() < 604 and (ids >= prepare.FIRST_TOKEN_ID).mean() > 0.99
  sp = spm.SentencePieceProcessor(model_file=os.path.join(outs[0], "tokenizer.model"))
  pieces = ids[:ids.tolist().index(prepare.SEPARATOR_ID)] - prepare.FIRST_TOKEN_ID
  with open(topics, encoding="utf-8") as f:
    text = unicodedata.normalize("NFKC", f.read())  # sentencepiece's normalization
  assert " ".join(sp.decode(pieces.tolist()).split()) == " ".join(text.split())


def test_an_existing_sentencepiece_model_or_hugging_face_tokenizer_is_used_as_given(topics,
                                                                                    tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers
  tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
  tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
  tokenizer.train([topics], trainers.WordLevelTrainer(vocab_size=500, special_tokens=["[UNK]"]))
  path = str(tmp_path / "tokenizer.json")
  tokenizer.save(path)
  out = str(tmp_path / "hf")
  meta = prepare.prepare([topics], out, path, seq_len=32, eval_fraction=0.1, progress=False)
  assert meta["tokenizer"] == {"kind": "huggingface", "file": "tokenizer.json",
                               "vocab_size": 500}
  with open(topics, encoding="utf-8") as f:
    first_line = f.readline()
  expected = np.array(tokenizer.encode(first_line, add_special_tokens=False).ids) + 4
  _, ids = _all_windows(out)
  np.testing.assert_array_equal(ids[:len(expected)], expected)

  sp_model = str(tmp_path / "sp" / "tokenizer.model")
  prepare.prepare([topics], str(tmp_path / "sp"), "sentencepiece", vocab_size=400, seq_len=32,
                  eval_fraction=0.1, progress=False)
  again = prepare.prepare([topics], str(tmp_path / "sp2"), sp_model, seq_len=32,
                          eval_fraction=0.1, progress=False)
  assert again["vocab_size"] == 404
  with open(tmp_path / "sp" / "train.bin", "rb") as a, open(tmp_path / "sp2" / "train.bin",
                                                            "rb") as b:
    assert a.read() == b.read()


@pytest.mark.parametrize("case, message", [
    ("missing", "--input '{tmp}/missing.txt': no such file"),
    ("no match", "--input '{tmp}/*.md' matches no file"),
    ("utf-8", "{tmp}/bad.txt:2: invalid UTF-8 at byte 5 of the file"),
    ("json", "{tmp}/bad.jsonl:2: not a JSON object with a string field 'text' (--text-field)"),
    ("empty", "the inputs hold no text"),
    ("vocab", "--vocab-size 100000: sentencepiece cannot train it on this corpus"),
    ("exists", "--out '{tmp}/a.txt' already exists"),
    ("bpe 0", "--vocab-size 0: expected a number of tokens, 1 or more"),
    ("bpe 100", "--vocab-size 100: bpe cannot train it on this corpus (100 is fewer than the "
                "256 tokens of this text's alphabet"),
    ("part", "--part-mb -1: expected MB of input per part, more than 0"),
    ("sample", "--sample-mb 0: expected MB of text to train the vocabulary on"),
])
def test_bad_input_is_one_line_naming_the_file_and_leaves_no_output(tmp_path, capsys, case,
                                                                    message):
  (tmp_path / "a.txt").write_text("some text\n")
  (tmp_path / "bad.txt").write_bytes(b"fine\n\xff\xfe\n")
  (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n')
  (tmp_path / "empty.txt").write_text("")
  args = {
      "missing": ["--input", f"{tmp_path}/missing.txt"],
      "no match": ["--input", f"{tmp_path}/*.md"],
      "utf-8": ["--input", f"{tmp_path}/bad.txt"],
      "json": ["--input", f"{tmp_path}/bad.jsonl"],
      "empty": ["--input", f"{tmp_path}/empty.txt"],
      "vocab": ["--input", f"{tmp_path}/a.txt", "--tokenizer", "sentencepiece",
                "--vocab-size", "100000"],
      "exists": ["--input", f"{tmp_path}/a.txt", "--out", f"{tmp_path}/a.txt"],
      "bpe 0": ["--input", f"{tmp_path}/a.txt", "--tokenizer", "bpe", "--vocab-size", "0"],
      "bpe 100": ["--input", f"{tmp_path}/a.txt", "--tokenizer", "bpe", "--vocab-size", "100"],
      "part": ["--input", f"{tmp_path}/a.txt", "--part-mb", "-1"],
      "sample": ["--input", f"{tmp_path}/a.txt", "--tokenizer", "bpe", "--vocab-size", "300",
                 "--sample-mb", "0"],
  }[case]
  before = sorted(os.listdir(tmp_path))
  out = [] if case == "exists" else ["--out", f"{tmp_path}/out"]
  assert prepare.main([*args, *out, "--workers", "1"]) == 2
  err = capsys.readouterr().err
  assert f"prepare: error: {message.format(tmp=tmp_path)}" in err
  assert "Traceback" not in err
  assert sorted(os.listdir(tmp_path)) == before  # nothing written, no temporary left


def test_a_full_disk_is_one_line_and_a_killed_prepare_leaves_nothing_for_long(corpus,
                                                                               tmp_path, capsys):
  import subprocess
  import sys
  big = tmp_path / "big.txt"
  big.write_text("some text to pack into windows\n" * 20_000)  # 620 KB: more than 64 KB free
  with runs.full_file_system(str(tmp_path / "disk")) as disk:
    os.remove(os.path.join(disk, "filler"))  # room for a little, not for all
    assert prepare.main(["--input", str(big), "--out", f"{disk}/out"]) == 2
    err = capsys.readouterr().err
    assert f"prepare: error: --out {disk}/out: cannot write (No space left on device)" in err
    assert "Traceback" not in err and os.listdir(disk) == []
  # What a prepare killed with -9 left (its process is gone) is removed by the next one.
  gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True).stdout.strip()
  left = tmp_path / f"out.tmp-{os.uname().nodename}-{gone}"
  left.mkdir()
  (left / "train.bin").write_bytes(bytes(1000))
  assert prepare.main([*sum((["--input", c] for c in corpus), []), "--out",
                       str(tmp_path / "out"), "--seq-len", "8", "--eval-fraction", "0.25"]) == 0
  assert not left.exists() and f"removed {left}" in capsys.readouterr().err


def test_over_long_lines_are_cut_before_a_vocabulary_is_trained(tmp_path):
  from train.data import vocabulary
  words = " ".join(f"w{i % 700}" for i in range(40_000))  # one line of 230 K characters
  (tmp_path / "one.txt").write_text(words + "\n" + "x" * 50_000)
  sample = vocabulary.sample_lines([str(tmp_path / "one.txt")], "text", 100.0)
  assert max(map(len, sample)) <= vocabulary.LONGEST_LINE
  assert "".join(sample) == words + "x" * 50_000
  assert all(piece.endswith(" ") for piece in sample[:-5])  # cut after a space where one is
  # SentencePiece skipped the line whole and blamed the vocabulary size.
  meta = prepare.prepare([str(tmp_path / "one.txt")], str(tmp_path / "out"), "sentencepiece",
                         vocab_size=300, seq_len=64, eval_fraction=0.1, progress=False)
  assert meta["vocab_size"] == 304


def test_training_reads_prepared_windows_and_refuses_what_does_not_match(topics, tmp_path):
  prepared = str(tmp_path / "prepared")
  prepare.prepare([topics], prepared, "sentencepiece", vocab_size=400, seq_len=32,
                  eval_fraction=0.05, progress=False)
  workdir = str(tmp_path / "run")
  runs.train(workdir, f"--config.data.prepared={prepared}", "--config.train.num_steps=4")
  from train.run.load import load_encoder
  assert load_encoder(workdir)[0].vocab_size == 404
  from train.outputs.draw_attention import main as attention_main  # the run's own pieces
  out = tmp_path / "attention.png"
  assert attention_main(["--workdir", workdir, "--text", "def f(x):", "--out", str(out)]) == 0
  assert out.stat().st_size > 5000

  refused = {
      "--config.model.vocab_size=260": "config.model.vocab_size: 260, expected the data's 404",
      "--config.train.seq_len=16": "config.train.seq_len: 16, expected the windows' length 32",
  }
  for override, message in refused.items():
    result = runs.train(str(tmp_path / "refused"), f"--config.data.prepared={prepared}",
                        override, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]
  interrupted = str(tmp_path / "interrupted")  # what a killed prepare leaves under its name
  os.makedirs(interrupted)
  os.rename(os.path.join(prepared, "train.bin"), os.path.join(interrupted, "train.bin"))
  with pytest.raises(RunError, match="expected a prepared dataset: it holds no dataset.json"):
    dataset.load_prepared(interrupted, 32)
  with pytest.raises(RunError, match="missing': no such directory"):
    dataset.load_prepared(str(tmp_path / "missing"), 32)
  with pytest.raises(RunError, match="train.bin: None bytes, expected"):
    dataset.load_prepared(prepared, 32)


def test_config_data_paths_are_prepared_into_the_workdir_as_bytes(tmp_path):
  from tests import tiny
  (tmp_path / "mine.txt").write_text("my own text " * 100)
  config = tiny.get_config()
  config.data.paths = (str(tmp_path / "mine.txt"),)
  windows = dataset.windows(config, str(tmp_path / "run"))
  assert windows.vocab_size == tokens.BYTE_VOCAB_SIZE and windows.train.shape[1] == 32
  assert os.path.isfile(tmp_path / "run" / "data" / "dataset.json")
  _, ids = _all_windows(str(tmp_path / "run" / "data"))
  assert tokens.decode_bytes(ids[:12]) == "my own text "
  config.data.paths = (str(tmp_path / "missing.txt"),)
  with pytest.raises(RunError, match=r"config.data.paths: \('.*missing.txt',\): --input "
                     r"'.*missing.txt': no such file"):
    dataset.windows(config, str(tmp_path / "run"))


def test_characters_and_errors_split_across_read_blocks(corpus, tmp_path, monkeypatch):
  whole = prepare.prepare(corpus, str(tmp_path / "whole"), seq_len=8, eval_fraction=0.25,
                          progress=False)
  from train.data import sources
  monkeypatch.setattr(sources, "_READ_BYTES", 3)  # 'ä' and 'ö' straddle block boundaries
  monkeypatch.setattr(prepare, "_CHUNK_CHARS", 3)  # and units of work
  blocks = prepare.prepare(corpus, str(tmp_path / "blocks"), seq_len=8, eval_fraction=0.25,
                           progress=False)
  assert blocks["windows"] == whole["windows"]
  for name in ("train.bin", "eval.bin"):
    assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "blocks" / name).read_bytes()
  (tmp_path / "late.txt").write_bytes("line one\nline twö\n".encode() + b"x\xc3(\n")
  with pytest.raises(prepare.PrepareError, match=r"late.txt:3: invalid UTF-8 at byte 20 "):
    prepare.prepare([str(tmp_path / "late.txt")], str(tmp_path / "late"), progress=False)
