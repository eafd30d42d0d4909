"""Model folders built to break their reader: a modules.json that is a directory or a FIFO, an
older sentence-transformers layout whose top holds another tokenizer than its Transformer's,
a vocab.json whose ids are huge or strings, JSON nested past Python's recursion limit, a
tokenizer.json whose regex panics inside `tokenizers`, a max_seq_length of NaN, and weights
holding NaN in the parity report. Each is one line naming the file (or, for the tokenizer, read
as sentence-transformers reads it), and nothing blocks on a FIFO."""

import json
import os
import shutil
import threading

import numpy as np
import pytest

from flax_encoder import families
from flax_encoder.embeddings import EmbeddingError, SentenceEncoder
from flax_encoder.families import HFError
from flax_encoder.hf_tokenizer import TokenizerError, tokenizer_from_directory
from flax_encoder.tokenizer import Tokenizer

pytestmark = pytest.mark.library

TEXTS = ["the quick brown fox", "a b c d e f", "0123 4567 89 + - * /", "THE LAZY dog", ""]
DEEP = "[" * 200_000  # past Python's recursion limit in json's parser


def _one_line(error: BaseException, *parts: str) -> str:
  message = str(error)
  assert "\n" not in message and all(p in message for p in parts), message
  return message


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory):
  """A sentence-transformers folder (mean pooling, Normalize) around a tiny random BERT, as
  sentence-transformers 6 saves it."""
  pytest.importorskip("torch", reason="sentence-transformers saves the folder")
  pytest.importorskip("sentence_transformers")
  from sentence_transformers.base.modules import Normalize
  from sentence_transformers.sentence_transformer.modules import Pooling

  from tests import hf_models
  from tests.test_embeddings import _save
  root = tmp_path_factory.mktemp("hostile")
  bert = hf_models.write(root / "bert", "bert", head="base")
  return _save(root / "st", bert, Pooling(32, pooling_mode="mean"), Normalize())


def _copy(st_folder, tmp_path) -> str:
  folder = str(tmp_path / "st")
  shutil.copytree(st_folder, folder)
  return folder


def _within(seconds: float, run, fifo: str):
  """run()'s result or error, failing where it blocks (on the FIFO `fifo`) for `seconds`: the
  FIFO is then opened for writing and closed, which lets the blocked reader go on."""
  out = {}

  def target():
    try:
      out["value"] = run()
    except BaseException as e:  # noqa: BLE001 - handed to the test
      out["error"] = e

  thread = threading.Thread(target=target, daemon=True)
  thread.start()
  thread.join(seconds)
  if thread.is_alive():
    os.close(os.open(fifo, os.O_WRONLY))
    thread.join()
    pytest.fail(f"the reader blocked on the FIFO {fifo}")
  if "error" in out:
    raise out["error"]
  return out.get("value")


# ---- 1. a JSON file that is no file

@pytest.mark.parametrize("what", ["directory", "fifo"])
def test_a_modules_json_that_is_no_file_is_refused_not_read_as_a_plain_directory(
    st_folder, tmp_path, what):
  folder = _copy(st_folder, tmp_path)
  file = os.path.join(folder, "modules.json")
  os.remove(file)
  os.mkdir(file) if what == "directory" else os.mkfifo(file)
  said = "a directory" if what == "directory" else "a FIFO"
  for read, error in ((SentenceEncoder.load, EmbeddingError), (families.load_hf, HFError),
                      (tokenizer_from_directory, TokenizerError)):
    with pytest.raises(error) as raised:
      _within(30, lambda: read(folder), file)
    assert _one_line(raised.value, said, "expected a JSON file").startswith(file)


@pytest.mark.parametrize("name", ["config.json", "1_Pooling/config.json",
                                  "sentence_bert_config.json",
                                  "config_sentence_transformers.json", "tokenizer.json"])
def test_a_fifo_among_a_folders_files_is_refused_without_blocking(st_folder, tmp_path, name):
  folder = _copy(st_folder, tmp_path)
  file = os.path.join(folder, name)
  os.remove(file)
  os.mkfifo(file)
  with pytest.raises(EmbeddingError) as raised:
    _within(30, lambda: SentenceEncoder.load(folder), file)
  assert _one_line(raised.value, "a FIFO (named pipe), expected a").startswith(file)


# ---- 2. the tokenizer is the Transformer module's

def _older_layout(st_folder, tmp_path) -> str:
  """The folder in sentence-transformers' older layout: the Transformer in 0_Transformer (its
  config.json, weights, tokenizer and sentence_bert_config.json), and at the top a
  tokenizer.json of the same vocabulary with its ids reversed, which sentence-transformers
  never reads."""
  folder = _copy(st_folder, tmp_path)
  module = os.path.join(folder, "0_Transformer")
  os.mkdir(module)
  for name in os.listdir(folder):
    if name in ("config.json", "model.safetensors", "sentence_bert_config.json") or (
        name.startswith(("tokenizer", "special_tokens", "vocab"))):
      shutil.move(os.path.join(folder, name), module)
  with open(os.path.join(folder, "modules.json")) as f:
    modules = json.load(f)
  modules[0]["path"] = "0_Transformer"
  with open(os.path.join(folder, "modules.json"), "w") as f:
    json.dump(modules, f)
  with open(os.path.join(module, "tokenizer.json")) as f:
    tokenizer = json.load(f)
  vocab = tokenizer["model"]["vocab"]
  top = max(vocab.values())
  tokenizer["model"]["vocab"] = {t: i if i < 5 else top + 5 - i for t, i in vocab.items()}
  with open(os.path.join(folder, "tokenizer.json"), "w") as f:
    json.dump(tokenizer, f)
  return folder


def test_an_older_folder_is_tokenized_by_its_transformer_modules_tokenizer(st_folder, tmp_path):
  from sentence_transformers import SentenceTransformer
  folder = _older_layout(st_folder, tmp_path)
  ours = SentenceEncoder.load(folder)
  module = tokenizer_from_directory(os.path.join(folder, "0_Transformer"))
  assert [i.tolist() for i in ours.tokenizer.encode_batch(TEXTS)] == [
      i.tolist() for i in module.encode_batch(TEXTS)]
  want = SentenceTransformer(folder, device="cpu").encode(TEXTS)
  np.testing.assert_allclose(ours(TEXTS), want, rtol=0, atol=1e-5)
  # the top tokenizer.json gives other vectors: the test tells the two apart
  top = Tokenizer.from_file("huggingface", os.path.join(folder, "tokenizer.json"))
  top = SentenceEncoder(ours.model, ours.params, top, ours.max_seq_length)
  assert np.abs(top(TEXTS) - want).max() > 1e-2


def test_a_transformer_module_without_a_tokenizer_is_refused_not_read_from_the_top(
    st_folder, tmp_path):
  folder = _older_layout(st_folder, tmp_path)
  for name in os.listdir(os.path.join(folder, "0_Transformer")):
    if name.startswith("tokenizer"):
      os.remove(os.path.join(folder, "0_Transformer", name))
  with pytest.raises(TokenizerError) as raised:
    tokenizer_from_directory(folder)
  _one_line(raised.value, "no tokenizer files", os.path.join(folder, "0_Transformer"))


# ---- 3. vocab.json's ids

BPE = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", "h", "e", "he"]


def _bpe(directory, vocab: dict) -> str:
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "vocab.json"), "w") as f:
    json.dump(vocab, f)
  with open(os.path.join(directory, "merges.txt"), "w") as f:
    f.write("#version: 0.2\nh e\n")
  return str(directory)


IDS = {s: i for i, s in enumerate(BPE)}


@pytest.mark.parametrize("vocab, named", [
    # 10**12: tokenizers took 54 s and 14 GB to build it (10**9: 27 s, 3.8 GB)
    ({**IDS, "x": 10**12}, "id of 'x' is 1000000000000, expected an id in [0, 9)"),
    ({**IDS, "x": len(BPE) + 1}, "id of 'x' is 9, expected an id in [0, 9)"),
    ({**IDS, "x": -1}, "id of 'x' is -1, expected an id in [0, 9)"),
    ({**IDS, "x": 7}, "'he' and 'x' both have id 7, expected an id per token"),
    ({s: str(i) for s, i in IDS.items()}, "id of '<s>' is '0' (a string), expected an integer"),
    ({**IDS, "h": "5"}, "id of 'h' is '5' (a string), expected an integer"),
    ({**IDS, "x": 8.0}, "id of 'x' is 8.0 (a number), expected an integer"),
])
def test_vocab_json_ids_are_checked_before_tokenizers_builds_them(tmp_path, vocab, named):
  with pytest.raises(TokenizerError) as raised:
    tokenizer_from_directory(_bpe(tmp_path, vocab))
  assert _one_line(raised.value, named).startswith(str(tmp_path / "vocab.json"))


def test_a_vocab_json_of_ids_in_order_still_builds(tmp_path):
  tokenizer = tokenizer_from_directory(_bpe(tmp_path, IDS))
  assert tokenizer.size == len(BPE) and tokenizer.encode_batch(["hhe"])[0].tolist() == [5, 7]


# ---- 4. JSON nested too deeply

@pytest.mark.parametrize("name", ["modules.json", "1_Pooling/config.json", "config.json",
                                  "sentence_bert_config.json",
                                  "config_sentence_transformers.json", "tokenizer.json"])
def test_json_nested_too_deeply_is_one_line_naming_the_file(st_folder, tmp_path, name):
  folder = _copy(st_folder, tmp_path)
  file = os.path.join(folder, name)
  with open(file, "w") as f:
    f.write(DEEP)
  with pytest.raises(EmbeddingError) as raised:
    SentenceEncoder.load(folder)
  assert _one_line(raised.value).startswith(file)


@pytest.mark.parametrize("name", ["tokenizer_config.json", "special_tokens_map.json"])
def test_tokenizer_files_nested_too_deeply_are_one_line_naming_them(tmp_path, name):
  from tests.test_published_tokenizers import WORDPIECE
  (tmp_path / "vocab.txt").write_text("\n".join(WORDPIECE) + "\n")
  (tmp_path / name).write_text(DEEP)
  with pytest.raises(TokenizerError) as raised:
    tokenizer_from_directory(tmp_path)
  _one_line(raised.value, f"{tmp_path / name}: not readable JSON (nested too deeply)")


def test_a_tokenizer_config_nested_too_deeply_is_named_where_it_gives_the_length(
    st_folder, tmp_path):
  folder = _copy(st_folder, tmp_path)
  os.remove(os.path.join(folder, "sentence_bert_config.json"))  # so model_max_length is read
  (tmp_path / "st" / "tokenizer_config.json").write_text(DEEP)
  with pytest.raises(EmbeddingError) as raised:
    SentenceEncoder.load(folder)
  _one_line(raised.value, "tokenizer_config.json: not readable JSON (nested too deeply)")


def test_a_shard_index_nested_too_deeply_is_one_line(st_folder, tmp_path):
  folder = _copy(st_folder, tmp_path)
  os.remove(os.path.join(folder, "model.safetensors"))
  (tmp_path / "st" / "model.safetensors.index.json").write_text(DEEP)
  with pytest.raises(HFError) as raised:
    families.load_hf(folder)
  _one_line(raised.value, "model.safetensors.index.json: not readable JSON")


# ---- 5. a tokenizer that panics inside `tokenizers`

def test_a_tokenizer_json_whose_regex_panics_is_one_line_naming_it(st_folder, tmp_path):
  folder = _copy(st_folder, tmp_path)
  file = os.path.join(folder, "tokenizer.json")
  with open(file) as f:
    tokenizer = json.load(f)
  # catastrophic backtracking: Oniguruma gives up, and `tokenizers` panics (a BaseException)
  tokenizer["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(a+)+$"},
                                "behavior": "Isolated", "invert": False}
  with open(file, "w") as f:
    json.dump(tokenizer, f)
  encoder = SentenceEncoder.load(folder)  # its template's texts, 'a' and 'b', pass
  with pytest.raises(EmbeddingError) as raised:
    encoder(["the fox", "a" * 40 + "b"])
  assert _one_line(raised.value, "retry-limit-in-match").startswith(file)


# ---- 6. max_seq_length

@pytest.mark.parametrize("value, said", [("NaN", "nan"), ("Infinity", "inf"),
                                         ("-Infinity", "-inf")])
def test_a_max_seq_length_that_is_no_number_is_one_line(st_folder, tmp_path, value, said):
  folder = _copy(st_folder, tmp_path)
  (tmp_path / "st" / "sentence_bert_config.json").write_text(
      f'{{"max_seq_length": {value}, "do_lower_case": false}}')
  with pytest.raises(EmbeddingError) as raised:
    SentenceEncoder.load(folder)
  assert str(raised.value) == (f"{tmp_path / 'st' / 'sentence_bert_config.json'}: "
                               f"max_seq_length={said}, expected an integer >= 3")


# ---- 7. the parity report on weights that are not finite

def test_the_parity_report_names_weights_holding_nan_before_comparing(tmp_path, capsys):
  torch = pytest.importorskip("torch", reason="the PyTorch bridge needs the torch extra")
  transformers = pytest.importorskip("transformers", reason="--hf compares against it")
  from flax_encoder.pytorch import parity
  torch.manual_seed(0)
  model = transformers.AutoModel.from_config(transformers.BertConfig(
      vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=37, max_position_embeddings=64))
  with torch.no_grad():
    model.encoder.layer[1].attention.self.key.weight[0, 0] = float("nan")
    model.encoder.layer[1].output.dense.bias[2] = float("inf")
  model.save_pretrained(tmp_path / "nan")
  capsys.readouterr()  # save_pretrained's progress
  assert parity.main(["--hf", str(tmp_path / "nan"), "--batch", "2", "--seq-len", "8"]) == 2
  out, err = capsys.readouterr()
  assert not out and len(err.strip().splitlines()) == 1, err
  assert err.startswith(f"parity: error: {tmp_path / 'nan'}: weights not finite: "
                        f"encoder.layer.1.attention.self.key.weight holds 1 NaN"), err


def test_the_parity_report_on_a_checkpoint_holding_inf_names_it(tmp_path, capsys):
  torch = pytest.importorskip("torch", reason="the PyTorch bridge needs the torch extra")
  from flax_encoder import EncoderConfig
  from flax_encoder.pytorch import parity, reference
  config = EncoderConfig(vocab_size=20, d_model=8, n_heads=2, d_ff=16, n_layers=2, max_len=16)
  state = reference.Encoder(config, "tutorial").state_dict()
  state["layers.1.norm2.weight"][3] = float("-inf")
  torch.save(state, tmp_path / "model.pt")
  code = parity.main(["--checkpoint", str(tmp_path / "model.pt"), "--n-heads", "2",
                      "--seq-len", "8"])
  err = capsys.readouterr().err
  assert code == 2 and "Traceback" not in err, err
  _one_line(err.strip(), "model.pt: weights not finite: layers.1.norm2.weight holds 0 NaN "
                         "and 1 inf of its 8 values")


def test_folder_files_read_a_file_once_and_again_once_it_changed(tmp_path):
  # one load's readers share a FolderFiles: a file is opened once, whatever each reader
  # expects of it (its own error class, an object, that it is there), and read again when it
  # changed since (a folder edited between two runs of one process)
  from flax_encoder.modules_json import FolderFiles
  from tests.opens import opened_under
  file = tmp_path / "config.json"
  file.write_text('{"a": 1}')
  files = FolderFiles()
  with opened_under(tmp_path) as opens:
    assert files.read_json(str(file), EmbeddingError, dict) == {"a": 1}
    assert files.read_json(str(file), HFError, dict, required=True) == {"a": 1}
    with pytest.raises(HFError, match=r"config.json: holds a dict, expected a JSON list$"):
      files.read_json(str(file), HFError, list)
    assert files.read_json(str(tmp_path / "absent.json"), EmbeddingError) is None
    with pytest.raises(TokenizerError, match=r"absent.json: no such file$"):
      files.read_json(str(tmp_path / "absent.json"), TokenizerError, required=True)
  assert dict(opens) == {"config.json": 1, "absent.json": 1}
  file.write_text('{"a": 22}')  # another size
  assert files.read_json(str(file), EmbeddingError, dict) == {"a": 22}
  file.write_text('{"a": ')
  for error in (EmbeddingError, HFError):  # what is wrong, kept, in each reader's class
    with pytest.raises(error, match=r"config.json: not readable JSON \("):
      files.read_json(str(file), error)
