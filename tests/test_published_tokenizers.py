"""Tokenizers of published Hugging Face checkpoints: a tokenizer.json saved with padding and
truncation (sentence-transformers'), and the files older checkpoints ship instead of one
(vocab.txt; vocab.json and merges.txt), built with `tokenizers` alone and compared with
transformers' tokenizers of the same files (BERT's pure-Python one among them) and with ids
worked out by hand."""

import json
import os

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers", reason="the huggingface tokenizer kind needs it")

from flax_encoder.hf_tokenizer import TokenizerError, tokenizer_from_directory  # noqa: E402
from flax_encoder.modules_json import TRANSFORMERS  # noqa: E402
from flax_encoder.tokenizer import Template, Tokenizer  # noqa: E402

pytestmark = pytest.mark.library  # the library's own: run on accelerators too

WORDPIECE = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s", "un", "##aff",
             "##able", "cafe", "don", "'", "t", "stop", ",", "!", ".", ":", "中", "文", "Hello",
             "Café", "STOP", "##S", "the", "a"]
TEXTS = ["Hello worlds, unaffable Café!", "don't STOP: 中文.", "  the\tworld\nthe  ", "",
         "x" * 120 + " hello", "HELLO WORLDS"]
PAIRS = ["the world", "STOP!", "a", "hello", "café", "unaffable"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def _write(directory, files: dict) -> str:
  """`files` (name -> text, or a JSON value) written into `directory`, made if need be."""
  for name, content in files.items():
    os.makedirs(os.path.dirname(os.path.join(directory, name)), exist_ok=True)
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
      f.write(content if isinstance(content, str) else json.dumps(content))
  return str(directory)


def _bert_directory(directory, **config) -> str:
  return _write(directory, {"vocab.txt": "\n".join(WORDPIECE) + "\n",
                            **({"tokenizer_config.json": config} if config else {})})


def _ids(tokenizer: Tokenizer, texts) -> list[list[int]]:
  return [ids.tolist() for ids in tokenizer.encode_batch(texts)]


def _laid_out(tokenizer: Tokenizer, text: str, pair: str) -> tuple[list[int], list[int]]:
  """A pair's ids and token types as the library lays them out with the template."""
  template = tokenizer.template()
  a, b = _ids(tokenizer, [text, pair])
  first = [*template.start, *a, *template.between]
  return first + b + [*template.end], [0] * len(first) + [template.second_type] * (
      len(b) + len(template.end))


def _assert_same_as(reference, tokenizer: Tokenizer):
  """Equal ids, for each text alone, and equal pairs (ids and token types) laid out with the
  tokenizer's template."""
  assert _ids(tokenizer, TEXTS) == [
      reference(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
  for text, pair in zip(TEXTS, PAIRS):
    expected = reference(text, pair, return_token_type_ids=True)
    assert _laid_out(tokenizer, text, pair) == (expected["input_ids"],
                                                expected["token_type_ids"])


# ---- vocab.txt (BERT's WordPiece)

@pytest.mark.parametrize("config", [{}, {"do_lower_case": False}, {"do_lower_case": True,
                                    "strip_accents": False, "tokenize_chinese_chars": False}])
def test_a_vocab_txt_tokenizes_as_transformers_python_bert_tokenizer(tmp_path, config):
  legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy",
                               reason="transformers' pure-Python BERT tokenizer is the reference")
  directory = _bert_directory(tmp_path, **config)
  reference = legacy.BertTokenizerLegacy(os.path.join(directory, "vocab.txt"), **config)
  tokenizer = tokenizer_from_directory(directory)
  _assert_same_as(reference, tokenizer)
  assert tokenizer.template() == Template((2,), (3,), (3,), second_type=1)
  assert tokenizer.unk_id == 1 and tokenizer.size == len(WORDPIECE)


def test_a_vocab_txt_tokenizes_as_transformers_builds_it_from_the_directory(tmp_path,
                                                                            monkeypatch):
  transformers = pytest.importorskip("transformers", reason="the reference is transformers'")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  directory = _bert_directory(tmp_path, do_lower_case=False, tokenizer_class="BertTokenizer")
  _assert_same_as(transformers.AutoTokenizer.from_pretrained(directory),
                  tokenizer_from_directory(directory))


def test_the_case_and_accents_a_vocab_txt_is_read_with_decide_its_ids(tmp_path):
  uncased = tokenizer_from_directory(_bert_directory(tmp_path / "uncased"))
  cased = tokenizer_from_directory(_bert_directory(tmp_path / "cased", do_lower_case=False))
  text = ["Hello Café STOPS"]
  assert _ids(uncased, text) == [[5, 11, 15, 7]]  # hello cafe stop ##s
  assert _ids(cased, text) == [[22, 23, 24, 25]]  # Hello Café STOP ##S


def test_a_built_tokenizer_keeps_its_offset_and_survives_its_bytes(tmp_path):
  tokenizer = tokenizer_from_directory(_bert_directory(tmp_path), offset=3)
  again = Tokenizer("huggingface", tokenizer.model, offset=3)
  assert _ids(tokenizer, ["hello world"]) == _ids(again, ["hello world"]) == [[8, 9]]
  assert again.template() == Template((5,), (6,), (6,), second_type=1)
  assert json.loads(tokenizer.model)["model"]["type"] == "WordPiece"


# ---- vocab.json and merges.txt (RoBERTa's byte-level BPE)

def _hand_bpe(directory, **config) -> str:
  """A byte-level BPE small enough to tokenize by hand: "hi there" is hi, Ġth, er, e."""
  symbols = ROBERTA_SPECIALS + ["h", "i", "t", "e", "r", "Ġ", "Ã", "©", "hi", "Ġt", "er",
                                "Ġth", "Ã©", "a", "b"]  # a, b: what `template` encodes
  merges = ["h i", "Ġ t", "e r", "Ġt h", "Ã ©"]
  return _write(directory, {"vocab.json": {s: i for i, s in enumerate(symbols)},
                            "merges.txt": "#version: 0.2\n" + "\n".join(merges) + "\n",
                            **({"tokenizer_config.json": config} if config else {})})


def test_vocab_json_and_merges_txt_tokenize_as_worked_out_by_hand(tmp_path):
  tokenizer = tokenizer_from_directory(_hand_bpe(tmp_path / "plain"))
  prefixed = tokenizer_from_directory(_hand_bpe(tmp_path / "prefixed", add_prefix_space=True))
  # hi | Ġth er e | Ġ | é as its two bytes' symbols, merged
  assert _ids(tokenizer, ["hi there é"]) == [[13, 16, 15, 8, 10, 17]]
  assert _ids(prefixed, ["hi there"]) == [[10, 13, 16, 15, 8]]  # Ġ hi: no merge "Ġ h"
  # RoBERTa's layout: <s> a </s></s> b </s>, every token of type 0
  assert tokenizer.template() == Template((0,), (2, 2), (2,), second_type=0)
  assert tokenizer.unk_id is None  # every byte is a symbol of the vocabulary


def _trained_bpe(directory, **config) -> str:
  trainer = tokenizers.ByteLevelBPETokenizer()
  trainer.train_from_iterator(
      ["Hello world, the café is unaffable!", "don't STOP: the world's 中文 text.",
       "hello again, World"] * 3, vocab_size=320, min_frequency=1,
      special_tokens=ROBERTA_SPECIALS, show_progress=False)
  os.makedirs(directory, exist_ok=True)
  trainer.save_model(str(directory))
  return _write(directory, {"tokenizer_config.json": config} if config else {})


@pytest.mark.parametrize("add_prefix_space", [False, True])
def test_vocab_json_and_merges_txt_tokenize_as_transformers_roberta_tokenizer(
    tmp_path, monkeypatch, add_prefix_space):
  transformers = pytest.importorskip("transformers", reason="the reference is transformers'")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  directory = _trained_bpe(tmp_path, add_prefix_space=add_prefix_space,
                           tokenizer_class="RobertaTokenizer")
  tokenizer = tokenizer_from_directory(directory)
  _assert_same_as(transformers.RobertaTokenizer.from_pretrained(directory), tokenizer)
  assert tokenizer.template() == Template((0,), (2, 2), (2,), second_type=0)


# ---- sentence-transformers folders

def _modules(transformer_path: str) -> dict:
  return {"modules.json": [
      {"idx": 0, "name": "0", "path": transformer_path, "type": TRANSFORMERS[0]},
      {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]}


def test_a_sentence_transformers_folder_is_read_from_its_transformer_module(tmp_path):
  _write(tmp_path, _modules("0_Transformer"))
  _bert_directory(tmp_path / "0_Transformer", do_lower_case=False)
  assert _ids(tokenizer_from_directory(tmp_path), ["Hello world"]) == [[22, 6]]


@pytest.mark.parametrize("settings", ["sentence_bert_config.json",
                                      "sentence_xlm-roberta_config.json"])  # a family's name
def test_a_sentence_transformers_module_that_lower_cases_texts_lower_cases_them(tmp_path,
                                                                              settings):
  _write(tmp_path, {**_modules(""), settings: {"do_lower_case": True}})
  _bert_directory(tmp_path, do_lower_case=False)  # a cased vocabulary at the top
  tokenizer = tokenizer_from_directory(tmp_path)
  assert _ids(tokenizer, ["Hello STOP"]) == [[5, 15]]  # hello stop, not Hello STOP (22, 24)
  assert tokenizer.template() == Template((2,), (3,), (3,), second_type=1)


# ---- a tokenizer.json saved with padding and truncation

def _bert_json(cased: bool = False, **settings) -> bytes:
  """A tokenizer.json of BERT's make, built here with `tokenizers`, with `settings` applied
  (padding, truncation) as sentence-transformers saves them."""
  from tokenizers import Tokenizer as HFTokenizer, models, normalizers, pre_tokenizers, processors
  model = HFTokenizer(models.WordPiece({t: i for i, t in enumerate(WORDPIECE)}, unk_token="[UNK]"))
  model.normalizer = normalizers.BertNormalizer(lowercase=not cased, strip_accents=not cased)
  model.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  model.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
      special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
  if "padding" in settings:
    model.enable_padding(pad_id=0, pad_token="[PAD]", **settings["padding"])
  if "truncation" in settings:
    model.enable_truncation(**settings["truncation"])
  return model.to_str().encode("utf-8")


def test_a_tokenizer_json_with_padding_and_truncation_encodes_without_them(tmp_path):
  saved = _bert_json(padding={"length": 16}, truncation={"max_length": 8})
  file = json.loads(saved)
  assert file["padding"]["strategy"] == {"Fixed": 16} and file["truncation"]["max_length"] == 8
  plain = Tokenizer("huggingface", _bert_json())
  tokenizer = Tokenizer("huggingface", saved)
  assert tokenizer.ignored_settings == ["padding to 16", "truncation at 8"]
  assert plain.ignored_settings == []
  assert tokenizer.template() == plain.template() == Template((2,), (3,), (3,), second_type=1)
  texts = TEXTS + ["hello world " * 10]
  ids = _ids(tokenizer, texts)
  assert ids == _ids(plain, texts) and len(ids[-1]) == 20 and len(ids[3]) == 0
  assert tokenizer.model == saved  # the file as it came, for whoever saves it again


def test_a_directory_s_tokenizer_json_comes_first_and_as_it_is(tmp_path):
  saved = _bert_json(padding={"pad_to_multiple_of": 8})
  _bert_directory(tmp_path)
  _write(tmp_path, {"tokenizer.json": saved.decode("utf-8")})
  tokenizer = tokenizer_from_directory(tmp_path)
  assert tokenizer.model == saved
  assert tokenizer.ignored_settings == ["padding to the longest (a multiple of 8)"]
  assert _ids(tokenizer, ["hello"]) == [[5]]


@pytest.mark.parametrize("tokenizer_class", ["BertTokenizer", "DistilBertTokenizerFast"])
@pytest.mark.parametrize("config", [{}, {"do_lower_case": False}, {"strip_accents": False},
                                    {"do_lower_case": False, "strip_accents": True,
                                     "tokenize_chinese_chars": False}])
def test_a_tokenizer_json_is_read_with_its_classes_options_as_transformers_reads_it(
    tmp_path, monkeypatch, tokenizer_class, config):
  """transformers 5 builds a BERT-like class's normalizer from tokenizer_config.json's options,
  over tokenizer.json's: a cased tokenizer.json lower-cases and strips accents where the
  options (or their defaults) say so."""
  transformers = pytest.importorskip("transformers", reason="the reference is transformers'")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  directory = _write(tmp_path, {"tokenizer.json": _bert_json(cased=True).decode("utf-8"),
                                "tokenizer_config.json": {"tokenizer_class": tokenizer_class,
                                                          **config}})
  _assert_same_as(transformers.AutoTokenizer.from_pretrained(directory),
                  tokenizer_from_directory(directory))


def test_a_cased_tokenizer_saved_as_transformers_5_saves_it_lower_cases_as_it_reads_it(
    tmp_path, monkeypatch):
  """`BertTokenizerFast(tokenizer_object=…)` writes do_lower_case true beside a cased
  tokenizer.json; AutoTokenizer then lower-cases, and so does the library."""
  transformers = pytest.importorskip("transformers", reason="the reference is transformers'")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  cased = tokenizers.Tokenizer.from_str(_bert_json(cased=True).decode("utf-8"))
  transformers.BertTokenizerFast(tokenizer_object=cased).save_pretrained(str(tmp_path))
  tokenizer = tokenizer_from_directory(tmp_path)
  _assert_same_as(transformers.AutoTokenizer.from_pretrained(str(tmp_path)), tokenizer)
  assert _ids(tokenizer, ["Hello Café STOPS"]) == [[5, 11, 15, 7]]  # hello cafe stop ##s


# ---- what cannot be read

NO_FILES = ["tokenizer.json", "vocab.txt", "vocab.json", "merges.txt", "save_pretrained(DIR)"]


@pytest.mark.parametrize("files, named", [
    ({}, NO_FILES),
    ({"vocab.json": {"a": 0}}, NO_FILES),
    ({**_modules("0_Transformer"), "0_Transformer/config.json": {}}, NO_FILES + ["0_Transformer"]),
    ({**_modules("../elsewhere")}, ["modules.json", "path '../elsewhere' leads out of"]),
    ({"modules.json": {"0": "x"}}, ["modules.json", "expected a list of modules"]),
    ({"vocab.txt": "[UNK]\n[SEP]\nhello\n"}, ["vocab.txt", "'[CLS]'", "cls_token"]),
    ({"vocab.txt": "\n".join(WORDPIECE), "tokenizer_config.json": {"do_lower_case": "yes"}},
     ["tokenizer_config.json", "do_lower_case='yes'", "true or false"]),
    ({"vocab.txt": "\n".join(WORDPIECE), "tokenizer_config.json": {
        "tokenizer_class": "MPNetTokenizer"}}, ["tokenizer_config.json", "MPNetTokenizer"]),
    ({"vocab.txt": "\n".join(WORDPIECE), "special_tokens_map.json": {"cls_token": 5}},
     ["special_tokens_map.json", "cls_token=5"]),
    ({"vocab.json": {"<s>": 0, "</s>": 1, "a": 2}, "merges.txt": "#version: 0.2\na a\n"},
     ["merges.txt", "'aa'"]),
    ({"vocab.json": {"<s>": 0, "a": 1}, "merges.txt": "a b c\n"}, ["vocab.json", "merges.txt"]),
    ({"tokenizer.json": "{not json"}, ["tokenizer.json", "not a tokenizer"]),
    ({"tokenizer_config.json": "[1]", "vocab.txt": "[CLS]"},
     ["tokenizer_config.json", "expected a JSON object"]),
])
def test_a_directory_it_cannot_read_is_one_line_naming_the_file(tmp_path, files, named):
  _write(tmp_path, files)
  with pytest.raises(TokenizerError) as raised:
    tokenizer_from_directory(tmp_path)
  message = str(raised.value)
  assert "\n" not in message and all(part in message for part in named), message


def test_a_path_that_is_no_directory_is_named(tmp_path):
  with pytest.raises(TokenizerError, match="no-such: not a directory"):
    tokenizer_from_directory(tmp_path / "no-such")
