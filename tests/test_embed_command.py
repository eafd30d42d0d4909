"""`python -m train.embed`: a file of texts in, its sentence embeddings out (.npy, .parquet,
.jsonl), equal to what sentence-transformers' encode gives for the same folder, a chunk at a
time; bad arguments and lines refused in one line, leaving no output behind."""

import json
import os

import numpy as np
import pytest

from train.errors import RunError
from train.outputs import embed

# sentence-transformers (and torch under it) save the folders and give the expected vectors.
st = pytest.importorskip("sentence_transformers")
from tests import hf_models  # noqa: E402  (torch and transformers)

TEXTS = ["the quick brown fox", "jumps over the lazy dog", "0123 4567", "a b c d e f g h i j",
         "+ - * / = < > ! ?", "abcd efgh ij " * 20, "9", "the dog"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  """A tiny BERT with mean pooling and normalisation, saved by sentence-transformers."""
  from sentence_transformers.base.modules import Normalize, Transformer
  from sentence_transformers.sentence_transformer.modules import Pooling
  hf = hf_models.write(tmp_path_factory.mktemp("hf"), "bert", head="base")
  model = st.SentenceTransformer(modules=[Transformer(hf, max_seq_length=24),
                                          Pooling(32, pooling_mode="mean"), Normalize()],
                                 device="cpu")
  path = str(tmp_path_factory.mktemp("st"))
  model.save(path)
  return path


@pytest.fixture(scope="module")
def expected(folder):
  return st.SentenceTransformer(folder, device="cpu").encode(TEXTS)


@pytest.fixture
def small_chunks(monkeypatch):
  monkeypatch.setattr(embed, "_CHUNK", 3)  # the 8 texts span three chunks


def test_each_output_holds_the_embeddings_sentence_transformers_gives_in_input_order(
    folder, expected, tmp_path, small_chunks):
  source = tmp_path / "texts.jsonl"
  ids = [f"doc-{i}" for i in range(len(TEXTS))]
  source.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in zip(ids, TEXTS)))
  assert embed.embed(folder, str(source), str(tmp_path / "e.npy")) == len(TEXTS)
  np.testing.assert_allclose(np.load(tmp_path / "e.npy"), expected, atol=1e-5)

  embed.embed(folder, str(source), str(tmp_path / "e.jsonl"))
  lines = [json.loads(x) for x in (tmp_path / "e.jsonl").read_text().splitlines()]
  assert [x["id"] for x in lines] == ids
  np.testing.assert_allclose([x["embedding"] for x in lines], expected, atol=1e-5)

  import pyarrow.parquet as pq
  embed.embed(folder, str(source), str(tmp_path / "e.parquet"))
  table = pq.read_table(tmp_path / "e.parquet").to_pydict()
  assert table["id"] == ids
  np.testing.assert_allclose(table["embedding"], expected, atol=1e-5)


def test_a_text_file_is_one_text_a_line_and_its_ids_are_line_numbers(folder, expected, tmp_path):
  source = tmp_path / "texts.txt"
  source.write_text(TEXTS[0] + "\n\n" + "\n".join(TEXTS[1:]) + "\n")  # line 2 is blank
  embed.embed(folder, str(source), str(tmp_path / "e.jsonl"))
  lines = [json.loads(x) for x in (tmp_path / "e.jsonl").read_text().splitlines()]
  assert [x["id"] for x in lines] == [1] + list(range(3, len(TEXTS) + 2))
  np.testing.assert_allclose([x["embedding"] for x in lines], expected, atol=1e-5)


def test_a_bad_line_after_the_first_chunk_leaves_no_output_and_names_the_line(
    folder, tmp_path, small_chunks):
  source = tmp_path / "texts.jsonl"
  rows = [{"text": t} for t in TEXTS[:5]] + [{"text": ["not", "a", "string"]}]
  source.write_text("".join(json.dumps(r) + "\n" for r in rows))
  out = tmp_path / "e.npy"
  with pytest.raises(RunError) as e:
    embed.embed(folder, str(source), str(out))
  assert str(e.value) == (f"--input {source}: line 6: 'text' (--text-field) is list, expected "
                          f"a string")
  assert list(tmp_path.iterdir()) == [source]


@pytest.mark.parametrize("out, message", [
    ("e.csv", "ends in '.csv', expected one of .npy, .parquet, .jsonl"),
    ("missing/e.npy", "no directory"),
    ("texts.jsonl", "the file --input"),
])
def test_unusable_outputs_are_refused_before_the_model_is_read(tmp_path, out, message):
  source = tmp_path / "texts.jsonl"
  source.write_text('{"text": "a text"}\n')
  with pytest.raises(RunError, match=message) as e:
    embed.embed(str(tmp_path / "no-model"), str(source), str(tmp_path / out))
  assert str(e.value).startswith(f"--out {tmp_path / out}: ") and "\n" not in str(e.value)


def test_the_command_says_what_it_wrote_and_refuses_in_one_line(folder, tmp_path, capsys):
  source = tmp_path / "texts.txt"
  source.write_text("\n".join(TEXTS))
  assert embed.main(["--model", folder, "--input", str(source),
                     "--out", str(tmp_path / "e.npy")]) == 0
  assert capsys.readouterr().out == f"{tmp_path / 'e.npy'}: {len(TEXTS)} embeddings\n"
  assert embed.main(["--model", str(tmp_path), "--input", str(source),
                     "--out", str(tmp_path / "f.npy")]) == 2
  error = capsys.readouterr().err.strip().splitlines()[-1]
  assert error.startswith(f"embed: error: --model {tmp_path}: ")
  assert embed.main(["--model", folder, "--input", str(source), "--prompt-name", "no-such-prompt",
                     "--out", str(tmp_path / "f.npy")]) == 2
  assert "--prompt-name no-such-prompt: not among the model's prompts" in capsys.readouterr().err
  assert not (tmp_path / "f.npy").exists()


def test_a_hugging_face_directory_is_mean_pooled_as_sentence_transformers_makes_one_of_it(
    tmp_path):
  hf = hf_models.write(tmp_path / "hf", "bert", head="base")
  source = tmp_path / "texts.txt"
  source.write_text("\n".join(TEXTS) + "\n")
  embed.embed(hf, str(source), str(tmp_path / "e.npy"))
  want = st.SentenceTransformer(hf, device="cpu").encode(TEXTS)  # Transformer, mean Pooling
  np.testing.assert_allclose(np.load(tmp_path / "e.npy"), want, atol=1e-5)


class _Tsv:
  """A format the command does not have: id, then the vector's numbers, tab-separated."""

  def __init__(self, path: str, total: int, dim: int, dtype=np.float32):
    self.file = open(path, "w", encoding="utf-8")

  def write(self, ids: list, embeddings: np.ndarray) -> None:
    self.file.writelines("\t".join([str(i), *map(str, e)]) + "\n"
                         for i, e in zip(ids, embeddings.tolist()))

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.file.close()


def test_a_new_out_format_is_one_entry_of_the_table(folder, expected, tmp_path, monkeypatch,
                                                    capsys):
  monkeypatch.setitem(embed.OUT_FORMATS, ".tsv", embed.OutFormat("id and numbers a line", _Tsv))
  source = tmp_path / "texts.txt"
  source.write_text("\n".join(TEXTS) + "\n")
  assert embed.embed(folder, str(source), str(tmp_path / "e.tsv")) == len(TEXTS)
  rows = [line.split("\t") for line in (tmp_path / "e.tsv").read_text().splitlines()]
  assert [int(r[0]) for r in rows] == list(range(1, len(TEXTS) + 1))
  np.testing.assert_allclose([[float(x) for x in r[1:]] for r in rows], expected, atol=1e-5)
  with pytest.raises(RunError, match=r"expected one of .npy, .parquet, .jsonl, .tsv, or a folder"):
    embed.embed(folder, str(source), str(tmp_path / "e.csv"))
  with pytest.raises(SystemExit):
    embed.main(["--help"])
  said = capsys.readouterr().out
  assert "  .tsv      id and numbers a line\n" in said and "  DIR/      (a name ending in /" in said


@pytest.mark.parametrize("part_mb", ["1e-6", "0", "-1", "inf", "nan", "2e6"])
def test_a_part_size_that_cannot_serve_is_refused_naming_the_range(part_mb, tmp_path, capsys):
  # 1e-6 made one-byte parts (3,000 parts, 9,001 files of a 3 KB input); inf an OverflowError.
  with pytest.raises(SystemExit) as e:
    embed.main(["--model", str(tmp_path), "--input", str(tmp_path / "t.txt"), "--out",
                str(tmp_path / "out") + "/", "--part-mb", part_mb])
  assert e.value.code == 2
  error = capsys.readouterr().err.strip().splitlines()[-1]
  assert f"--part-mb {float(part_mb)}, expected a number of MiB from 0.000244141 (256 bytes) " \
         f"to 1048576" in error
  assert not os.path.exists(tmp_path / "out")
  from train.outputs import corpus
  with pytest.raises(RunError, match="^part_mb: "):
    corpus.embed_parts(None, "", "", str(tmp_path / "out"), part_mb=float(part_mb))


def test_the_help_says_the_part_size_default_and_what_a_part_is_for(capsys):
  with pytest.raises(SystemExit):
    embed.main(["--help"])
  said = " ".join(capsys.readouterr().out.split())
  assert "(default: 16)" in said and "the unit a stopped run resumes from" in said


def test_a_folder_out_that_is_a_file_is_refused_as_one(tmp_path):
  # "afile/" where afile is a file: "cannot write it (File exists)", exit 1, it was
  (tmp_path / "afile").write_text("kept\n")
  (tmp_path / "t.txt").write_text("a text\n")
  with pytest.raises(RunError) as e:
    embed.embed(str(tmp_path / "no-model"), str(tmp_path / "t.txt"), f"{tmp_path / 'afile'}/")
  assert str(e.value) == f"--out {tmp_path / 'afile'}/: a file, expected a folder"
  assert e.value.exit_code == 2 and (tmp_path / "afile").read_text() == "kept\n"


class _Bar:
  """tqdm's place in a test: where the bar starts and each move it is told of."""

  made: list = []

  def __init__(self, *args, initial=0, **kwargs):
    self.initial, self.moves = initial, []
    _Bar.made.append(self)

  def update(self, n):
    self.moves.append(n)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    pass

  close = lambda self: None  # noqa: E731


def test_the_bar_moves_with_each_call_and_a_resumed_run_starts_where_the_last_stopped(
    folder, tmp_path, monkeypatch):
  """The bar moved every 1,024 texts, and a resumed folder's bar started at 0, jumped to what
  was done (a rate of bytes never embedded), then slowed."""
  import tqdm
  from train.outputs import corpus
  monkeypatch.setattr(tqdm, "tqdm", _Bar)
  texts = [f"{t} {i}" for i in range(30) for t in TEXTS]
  source = tmp_path / "texts.txt"
  source.write_text("\n".join(texts) + "\n")
  _Bar.made = []
  embed.embed(folder, str(source), str(tmp_path / "e.npy"), show=True, batch_tokens=96)
  moves = _Bar.made[-1].moves
  assert sum(moves) == len(texts) and len(moves) > 4  # a move a call, 4 ids a text at least
  out = str(tmp_path / "parts") + "/"
  embed.embed(folder, str(source), out, part_mb=2048 / 2**20, batch_tokens=96)
  for extra in os.listdir(out):  # as if stopped after its first two parts
    if extra.startswith("part-") and not extra.startswith(("part-00000.", "part-00001.")):
      os.remove(os.path.join(out, extra))
  _Bar.made = []
  embed.embed(folder, str(source), out, show=True, part_mb=2048 / 2**20, batch_tokens=96)
  bar = _Bar.made[-1]
  size = os.path.getsize(source)
  assert 0 < bar.initial < size and bar.initial + sum(bar.moves) == size
  assert len(bar.moves) > 2 * (-(-size // 2048) - 2)  # more than a move a part
  assert corpus.texts_in(out) == len(texts)


def test_truncated_and_quantized_files_are_sentence_transformers_encode(folder, tmp_path, capsys):
  # truncate_dim and precision as SentenceTransformer(truncate_dim=).encode(precision=): int8's
  # ranges those of every text (the input is under --calibration-texts), written beside the
  # file for the queries; a float on a bucket's edge may take the next code
  from sentence_transformers.util.quantization import quantize_embeddings
  source = tmp_path / "texts.txt"
  source.write_text("\n".join(TEXTS))
  theirs = st.SentenceTransformer(folder, device="cpu", truncate_dim=20)
  floats = theirs.encode(TEXTS)
  assert embed.main(["--model", folder, "--input", str(source), "--out", str(tmp_path / "q.npy"),
                     "--truncate-dim", "20", "--precision", "int8"]) == 0
  got, want = np.load(tmp_path / "q.npy"), theirs.encode(TEXTS, precision="int8")
  assert got.dtype == np.int8 and got.shape == want.shape == (len(TEXTS), 20)
  assert np.abs(got.astype(np.int16) - want).max() <= 1
  ranges = np.load(tmp_path / "q.ranges.npy")
  np.testing.assert_allclose(ranges, [floats.min(0), floats.max(0)], atol=1e-5)
  assert "int8 ranges of the first 8 texts" in capsys.readouterr().err
  # queries bucketed by the corpus's ranges (--ranges), as quantize_embeddings(ranges=)
  assert embed.main(["--model", folder, "--input", str(source), "--out", str(tmp_path / "r.jsonl"),
                     "--truncate-dim", "20", "--precision", "uint8", "--ranges",
                     str(tmp_path / "q.ranges.npy")]) == 0
  got = np.array([json.loads(line)["embedding"] for line in open(tmp_path / "r.jsonl")])
  want = quantize_embeddings(floats, precision="uint8", ranges=ranges)
  assert np.abs(got - want.astype(np.int16)).max() <= 1
  import pyarrow.parquet as pq
  assert embed.main(["--model", folder, "--input", str(source), "--out", str(tmp_path / "b.parquet"),
                     "--precision", "ubinary"]) == 0
  column = pq.read_table(tmp_path / "b.parquet").column("embedding")
  assert column.type.value_type == "uint8" and column.type.list_size == 4
  np.testing.assert_array_equal(np.array(column.to_pylist()),
                                st.SentenceTransformer(folder, device="cpu").encode(
                                    TEXTS, precision="ubinary"))


@pytest.mark.parametrize("options,message", [
    (["--truncate-dim", "33"], "--truncate-dim 33: expected 1 to the 32 dimensions of --model"),
    (["--precision", "int8", "--calibration-texts", "1"], "--calibration-texts 1: expected at "
     "least 2"),
    (["--precision", "binary", "--ranges", "r.npy"], "--ranges: given with --precision binary"),
    (["--precision", "int8", "--ranges", "texts.txt"], "--ranges {tmp}/texts.txt: not a readable "
     ".npy file"),
])
def test_bad_truncation_and_precision_options_are_one_line(folder, tmp_path, capsys, options,
                                                           message):
  source = tmp_path / "texts.txt"
  source.write_text("\n".join(TEXTS))
  out = str(tmp_path / "e.npy")
  options = [o.replace("texts.txt", str(source)) for o in options]
  try:  # argparse's own refusals exit
    code = embed.main(["--model", folder, "--input", str(source), "--out", out, *options])
  except SystemExit as e:
    code = e.code
  assert code == 2
  error = capsys.readouterr().err.strip().splitlines()[-1]
  assert message.format(tmp=tmp_path) in error and "Traceback" not in error
  assert not os.path.exists(tmp_path / "e.npy")


def test_a_folder_of_truncated_parts_records_its_dim_and_names_another(folder, tmp_path, capsys):
  from flax_encoder.corpus import read_embeddings
  source = tmp_path / "texts.txt"
  source.write_text("\n".join(TEXTS))
  out = str(tmp_path / "parts") + "/"
  assert embed.main(["--model", folder, "--input", str(source), "--out", out,
                     "--truncate-dim", "8"]) == 0
  _, vectors = read_embeddings(out)
  want = st.SentenceTransformer(folder, device="cpu", truncate_dim=8).encode(TEXTS)
  np.testing.assert_allclose(vectors, want, atol=1e-5)
  capsys.readouterr()
  assert embed.main(["--model", folder, "--input", str(source), "--out", out,
                     "--truncate-dim", "16"]) == 2
  assert "--truncate-dim" in capsys.readouterr().err


def test_a_folder_in_a_precision_holds_encodes_codes_and_its_ranges(folder, tmp_path, capsys):
  # the parts in int8 by the ranges of the first texts, kept in the manifest: what
  # quantize_embeddings gives the float vectors with those ranges; another precision is named
  from sentence_transformers.util.quantization import quantize_embeddings

  from flax_encoder.corpus import read_embeddings, read_manifest
  source = tmp_path / "texts.txt"
  source.write_text("\n".join(TEXTS))
  out = str(tmp_path / "parts") + "/"
  assert embed.main(["--model", folder, "--input", str(source), "--out", out, "--precision",
                     "int8", "--calibration-texts", "5", "--part-mb", "0.0003"]) == 0
  assert "int8 ranges of the first 5 texts (in the manifest)" in capsys.readouterr().err
  ids, codes = read_embeddings(out)
  model = read_manifest(out)["model"]
  floats = st.SentenceTransformer(folder, device="cpu").encode(TEXTS)
  np.testing.assert_allclose(model["ranges"], [floats[:5].min(0), floats[:5].max(0)], atol=1e-5)
  want = quantize_embeddings(floats, precision="int8", ranges=np.array(model["ranges"]))
  assert codes.dtype == np.int8 and ids == list(range(1, len(TEXTS) + 1))
  assert np.abs(codes.astype(np.int16) - want).max() <= 1
  assert embed.main(["--model", folder, "--input", str(source), "--out", out, "--precision",
                     "ubinary", "--part-mb", "0.0003"]) == 2
  assert "--precision was 'int8', now 'ubinary'" in capsys.readouterr().err
