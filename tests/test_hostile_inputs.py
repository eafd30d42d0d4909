"""Hostile text: a line of megabytes is cut to what the model can see before it is tokenized,
text the tokenizer cannot read is said or refused, and labels no float or class holds, broken
tokenizer files and special ids past the vocabulary are one line naming the file."""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from flax_encoder import EncoderConfig
from flax_encoder.classifier import SequenceClassifier
from flax_encoder.text_classifier import TextClassifier
from flax_encoder.token_classifier import TokenClassifier
from flax_encoder.tokenizer import CHARS_PER_ID, LONGER_LOOK, Tokenizer, encode_examples
from train.data import examples, prepare, vocabulary
from train.data.tokens import TokenizerSpec, encode_bytes
from train.errors import RunError
from train.outputs import predict
from train.tasks import classify, regress, tag, tokenizing
from train.tasks.start import Start, start_of
from train.tasks.supervised import FineTuned

SEQ_LEN = 16
SEEN = SEQ_LEN * CHARS_PER_ID  # the characters of a text an example of SEQ_LEN ids can show
FIELDS = {"text": "text", "pair": "text_pair", "label": "label"}
TAG_FIELDS = {"tokens": "tokens", "tags": "tags"}
ENGLISH = ["the quick brown fox jumps over the lazy dog", "a b c d e f g h", "0 1 2 3 4 5"]


def _write(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
  return str(path)


def _one_line(error, *words):
  message = str(error.value)
  assert "\n" not in message and all(w in message for w in words), message


@pytest.fixture
def handed(monkeypatch):
  """The length of every text handed to a tokenizer, as it is handed."""
  lengths = []
  encode = Tokenizer.encode_batch

  def spy(self, texts):
    lengths.extend(len(t) for t in texts)
    return encode(self, texts)

  monkeypatch.setattr(Tokenizer, "encode_batch", spy)
  words = Tokenizer._encode_words

  def spy_words(self, texts):
    lengths.extend(len(t) for t in texts)
    return words(self, texts)

  monkeypatch.setattr(Tokenizer, "_encode_words", spy_words)
  return lengths


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
  """A BERT WordPiece tokenizer.json trained on a few English lines: it reads no Japanese."""
  from benchmarks.hf_walkthrough import wordpiece as train_wordpiece
  tokenizer, _ = train_wordpiece(ENGLISH * 4, 60)
  path = tmp_path_factory.mktemp("wordpiece") / "tokenizer.json"
  tokenizer.save(str(path))
  return str(path)


def _bytes():
  return TokenizerSpec("bytes").load()


def _prepare(tmp_path, train, eval_=None, tokenizer=None, name="data", **kwargs):
  """examples.prepare_examples of the rows `train` and `eval_` (else `train`) at SEQ_LEN."""
  paths = {"train": _write(tmp_path / "train.jsonl", train),
           "eval": _write(tmp_path / "eval.jsonl", eval_ or train)}
  kwargs = {"pad_id": 0, "separator_id": 2, **kwargs}
  return examples.prepare_examples(paths, str(tmp_path / name), tokenizer or _bytes(), None,
                                   SEQ_LEN, FIELDS, **kwargs)


def _rows(directory, split="train"):
  loaded = examples.load_examples(str(directory))[split]
  return np.asarray(loaded["tokens"]), np.asarray(loaded["labels"])


# ---------------------------------------------------------------------------------------------
# A line of megabytes: cut to what seq_len ids can show, before it is tokenized.


SHORT = [{"text": f"short text {i}", "label": "ab"[i % 2]} for i in range(16)]
LONG = "many words " * 300_000  # 3.3 MB


def test_fine_tuning_examples_tokenize_of_a_long_line_only_what_they_hold(tmp_path, handed):
  with_long = SHORT[:8] + [{"text": LONG, "label": "a"}] + SHORT[8:]
  meta = _prepare(tmp_path, with_long, SHORT)
  assert max(handed) <= SEEN
  assert meta["truncated"] == {"train": 1, "eval": 0}
  rows, labels = _rows(tmp_path / "data")
  # The long line's ids are those of the whole text, truncated; the others' are unchanged.
  uncut, _ = examples.example_ids(encode_bytes(LONG), None, SEQ_LEN, 2)
  np.testing.assert_array_equal(rows[8], uncut)
  _prepare(tmp_path, SHORT, name="short")
  short_rows, short_labels = _rows(tmp_path / "short")
  np.testing.assert_array_equal(np.delete(rows, 8, 0), short_rows)
  np.testing.assert_array_equal(np.delete(labels, 8), short_labels)


def test_tagged_words_are_cut_in_length_and_number_before_tokenizing(tmp_path, handed):
  short = [{"tokens": ["ada", "lives", "in", "oslo"], "tags": ["B", "O", "O", "B"]}] * 8
  words = ["word"] * 200_000 + ["x" * 3_000_000]
  long = {"tokens": words, "tags": ["O"] * len(words)}
  paths = {"train": _write(tmp_path / "train.jsonl", short[:4] + [long] + short[4:]),
           "eval": _write(tmp_path / "eval.jsonl", short)}
  meta = examples.prepare_tagged(paths, str(tmp_path / "data"), _bytes(), None, SEQ_LEN,
                                 TAG_FIELDS, 0)
  short_chars = 16 * sum(1 + len(w) for w in short[0]["tokens"])  # 8 train, 8 eval
  assert max(handed) <= SEEN and sum(handed) <= short_chars + SEEN
  seen_words = -(-SEQ_LEN // len(" word"))  # each word: a space and four bytes
  assert meta["untagged"]["train"] == len(words) - seen_words
  rows, labels = _rows(tmp_path / "data")
  np.testing.assert_array_equal(rows[4], encode_bytes(" word" * seen_words)[:SEQ_LEN])
  examples.prepare_tagged({"train": paths["eval"], "eval": paths["eval"]},
                          str(tmp_path / "short"), _bytes(), None, SEQ_LEN, TAG_FIELDS, 0)
  short_rows, short_labels = _rows(tmp_path / "short")
  np.testing.assert_array_equal(np.delete(rows, 4, 0), short_rows)
  np.testing.assert_array_equal(np.delete(labels, 4, 0), short_labels)


def test_a_vocabulary_from_scratch_is_trained_on_what_the_model_can_see(tmp_path, monkeypatch):
  trained, train = [], vocabulary.train_vocabulary

  def keep(kind, sample, *args, **kwargs):
    trained.extend(sample)
    return train(kind, sample, *args, **kwargs)

  monkeypatch.setattr(vocabulary, "train_vocabulary", keep)
  path = _write(tmp_path / "train.jsonl", SHORT + [{"text": LONG, "label": "a"}])
  tokenizing._train_vocabulary("bpe", 300, SEQ_LEN, path, lambda record: [record["text"]],
                             str(tmp_path))
  assert trained == [s["text"] for s in SHORT] + [LONG[:SEEN]]


def test_the_librarys_layout_cuts_a_long_text_and_keeps_the_others(handed):
  texts = [s["text"] for s in SHORT]
  alone = encode_examples(_bytes(), texts, None, SEQ_LEN, 2)
  rows = encode_examples(_bytes(), texts + [LONG], [None] * 16 + [LONG], SEQ_LEN, 2)
  # a pair of two long texts is looked at a little further, to tell which is the longer
  assert max(handed) <= LONGER_LOOK * (SEQ_LEN + 1) * CHARS_PER_ID
  for row, expected in zip(rows, alone):
    np.testing.assert_array_equal(row, expected)
  uncut, _ = examples.example_ids(encode_bytes(LONG), encode_bytes(LONG), SEQ_LEN, 2)
  np.testing.assert_array_equal(rows[-1], uncut)


# Texts whose first characters tokenize to few ids or none: sentence-transformers tokenizes
# them whole, so their first ids lie far past seq_len * CHARS_PER_ID characters.
SPARSE_STARTS = [" " * 20_000 + "the quick brown fox " * 50, "\t" * 9_000 + "hello world " * 40,
                 "\u200b" * 30_000 + "zero width then words " * 30,
                 "QUJD" * 900 + " then words " * 30, "x" * 100 + " y" * 3_000,
                 ("a" * 70 + " ") * 500, "\u00fcn\u00efc\u00f6d\u00e9 " * 3_000, "fox, " * 4_000,
                 "word " * 10_000, "  lead and trail  ", "", "short"]
# Texts that spell the special tokens of BERT's and RoBERTa's tokenizers: a tokenizer makes
# them the special ids, which are the text's own (attention mask 1), neither padding nor the
# boundary between a pair's texts.
LITERAL_SPECIALS = ["a [PAD] b [SEP] c [CLS]", "<pad> dog <pad> fox </s> the <s>", "[PAD]",
                    "<pad>", "the [SEP] quick </s></s> fox [PAD] [PAD]"]


def _tokenizers(wordpiece):
  """Each way of tokenizing a text: WordPiece, byte-level BPE (RoBERTa's, its offsets
  trimmed), Unigram with Metaspace, SentencePiece."""
  import io

  import sentencepiece as spm
  from tokenizers import Tokenizer as HF, models, normalizers, pre_tokenizers, processors, \
      trainers
  corpus = ENGLISH * 20
  byte_bpe = HF(models.BPE())
  byte_bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
  byte_bpe.train_from_iterator(corpus, trainers.BpeTrainer(
      vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  byte_bpe.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
  unigram = HF(models.Unigram())
  unigram.normalizer, unigram.pre_tokenizer = normalizers.NFKC(), pre_tokenizers.Metaspace()
  unigram.train_from_iterator(corpus, trainers.UnigramTrainer(
      vocab_size=60, special_tokens=["<unk>"], unk_token="<unk>"))
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=model,
                                 vocab_size=60, hard_vocab_limit=False, minloglevel=2)
  return {"wordpiece": Tokenizer.from_file("huggingface", wordpiece),
          "byte_bpe": Tokenizer("huggingface", byte_bpe.to_str().encode()),
          "unigram": Tokenizer("huggingface", unigram.to_str().encode()),
          "sentencepiece": Tokenizer("sentencepiece", model.getvalue()),
          "bytes": _bytes()}


@pytest.mark.parametrize("count", [3, 16])
def test_a_texts_first_ids_are_those_of_the_whole_text_in_bounded_pieces(
    wordpiece, count, monkeypatch, handed):
  """However few ids its first characters make, a text's first `count` ids are those of the
  whole text, tokenized a piece at a time and never more than MAX_PIECE_CHARS at once (here
  2^15: each text's words are shorter, Metaspace's of tabs or zero-width spaces included, as
  a word longer than that is read only so far)."""
  import flax_encoder.tokenizer as tokenizer_lib
  tokenizers = _tokenizers(wordpiece)
  handed.clear()
  monkeypatch.setattr(tokenizer_lib, "MAX_PIECE_CHARS", 1 << 15)
  for name, tokenizer in tokenizers.items():
    whole = [ids[:count] for ids in tokenizer.encode_batch(SPARSE_STARTS)]
    handed.clear()
    got = tokenizer.encode_leading(SPARSE_STARTS, count)
    assert max(handed) <= 1 << 15, name
    for text, want, ids in zip(SPARSE_STARTS, whole, got):
      np.testing.assert_array_equal(ids, want, err_msg=f"{name}: {text[:20]!r}")


def test_a_tokenizer_that_panics_on_a_text_is_one_line_naming_it_and_the_data(
    wordpiece, tmp_path, monkeypatch):
  """A Split regex that backtracks past Oniguruma's limit makes `tokenizers` panic (a
  BaseException) on some texts only: fine-tuning data and predict name the file in one line."""
  with open(wordpiece) as f:
    spec = json.load(f)
  spec["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(a+)+$"},
                           "behavior": "Isolated", "invert": False}
  path = str(tmp_path / "tokenizer.json")
  with open(path, "w") as f:
    json.dump(spec, f)
  tokenizer = TokenizerSpec("huggingface", path).load(0)
  rows = SHORT[:4] + [{"text": "a" * 40 + "b", "label": "a"}]
  with pytest.raises(RunError) as raised:
    _prepare(tmp_path, rows, SHORT[:4], tokenizer=tokenizer)
  said = str(raised.value)
  assert said.startswith(f"{tmp_path / 'train.jsonl'}: its tokenizer {path}: the `tokenizers` "
                         f"library failed on a text (") and "\n" not in said, said
  run = _fine_tuned("classify", ["a", "b"])
  run = dataclasses.replace(run, tokenizer=Tokenizer.from_file("huggingface", path))
  monkeypatch.setattr(predict, "read_run", lambda workdir: run)
  (tmp_path / "run").mkdir()
  given = _write(tmp_path / "in.jsonl", [{"text": "a" * 40 + "b"}])
  with pytest.raises(RunError, match=r"^--input \S*in.jsonl: the run's tokenizer: the "
                                     r"`tokenizers` library failed on a text \("):
    predict.predict(str(tmp_path / "run"), given, str(tmp_path / "p.jsonl"))


def _fine_tuned(task: str, labels: list | None) -> FineTuned:
  """A run as train.predict reads one, of random parameters (nothing trained): bytes, SEQ_LEN."""
  cfg = EncoderConfig(vocab_size=260, d_model=16, n_heads=2, d_ff=32, n_layers=1,
                      max_len=SEQ_LEN, dropout=0.0)
  model = (TokenClassifier(cfg, len(labels)) if task == "tag" else
           SequenceClassifier(cfg, len(labels) if labels else 1, "mean"))
  params = nn.unbox(model.init(jax.random.key(0), np.ones((1, 8), np.int32))["params"])
  fields = TAG_FIELDS if task == "tag" else FIELDS
  meta = {"fields": fields, "seq_len": SEQ_LEN, "separator_id": 2, "pad_id": 0,
          "template": None}
  return FineTuned(task, model, jax.device_get(params), labels, meta, _bytes())


@pytest.mark.parametrize("task", ["classify", "tag"])
def test_predict_tokenizes_of_a_long_line_only_what_it_holds_the_others_unchanged(
    task, tmp_path, monkeypatch, handed, capsys):
  run = _fine_tuned(task, ["a", "b"])
  monkeypatch.setattr(predict, "read_run", lambda workdir: run)
  (tmp_path / "run").mkdir()
  if task == "tag":
    short = [{"tokens": s["text"].split()} for s in SHORT]
    long = {"tokens": LONG.split()}
  else:
    short, long = [{"text": s["text"]} for s in SHORT], {"text": LONG}
  given = _write(tmp_path / "in.jsonl", short[:8] + [long] + short[8:])
  only_short = _write(tmp_path / "short.jsonl", short)
  run_dir = str(tmp_path / "run")
  assert predict.main(["--workdir", run_dir, "--input", given, "--out",
                       str(tmp_path / "p.jsonl")]) == 0
  assert max(handed) <= SEEN
  summary = capsys.readouterr().out.strip().splitlines()[-1]
  assert summary.endswith("17 predictions"), summary
  done = predict.predict(run_dir, only_short, str(tmp_path / "q.jsonl"))
  assert done.count == 16
  lines = [json.loads(line) for line in open(tmp_path / "p.jsonl")]
  assert lines[:8] + lines[9:] == [json.loads(line) for line in open(tmp_path / "q.jsonl")]
  if task == "tag":  # a tag per word, none past what the ids show
    tags = lines[8]["tags"]
    assert len(tags) == len(long["tokens"]) and tags[-1] is None and tags[0] in ("a", "b")


def test_pretraining_tokenizes_a_document_of_megabytes_in_pieces(tmp_path, handed):
  documents = ["a short one", LONG, "another"]
  _write(tmp_path / "docs.jsonl", [{"text": d} for d in documents])
  out = str(tmp_path / "out")
  meta = prepare.prepare([str(tmp_path / "docs.jsonl")], out, seq_len=512, eval_fraction=0.5,
                         workers=1, progress=False)
  assert max(handed) <= prepare._CHUNK_CHARS < len(LONG)
  # The pieces make the same ids as the whole: the windows hold the documents back to back.
  from tests.test_prepare import _all_windows
  _, ids = _all_windows(out)
  expected = np.concatenate([np.append(encode_bytes(d), prepare.SEPARATOR_ID)
                             for d in documents])
  np.testing.assert_array_equal(ids[:len(expected)], expected)
  assert meta["tokens"] == sum(len(d) for d in documents)


def test_pieces_end_after_a_space_and_hold_the_whole_text():
  text = ("word " * 30 + "x" * 50) * 3
  pieces = list(vocabulary.pieces(text, 64))
  assert "".join(pieces) == text and all(len(p) <= 64 for p in pieces)
  assert pieces[0].endswith(" ") and pieces[0] == "word " * 12


# ---------------------------------------------------------------------------------------------
# Text the tokenizer cannot read.


def _tokens(path: str, text: str, unknown: bool = False) -> int:
  """How many tokens (`unknown`: [UNK]s) the tokenizer.json `path` makes of `text`, as
  tokenizers counts them."""
  from tokenizers import Tokenizer as HFTokenizer
  tokenizer = HFTokenizer.from_file(path)
  ids = tokenizer.encode(text, add_special_tokens=False).ids
  return ids.count(tokenizer.token_to_id("[UNK]")) if unknown else len(ids)


def test_the_unknown_token_is_the_tokenizers_own_for_each_kind(wordpiece, tmp_path):
  loaded = TokenizerSpec("huggingface", wordpiece).load(offset=4)
  vocab = json.load(open(wordpiece))["model"]["vocab"]
  assert loaded.unk_id == vocab["[UNK]"] + 4
  sample = ENGLISH * 20
  for kind, name in (("unigram", "u.json"), ("bpe", "b.json"), ("sentencepiece", "s.model")):
    vocabulary.train_vocabulary(kind, sample, 300, str(tmp_path / name), exact=False)
  unigram = TokenizerSpec("huggingface", str(tmp_path / "u.json")).load(offset=4)
  assert unigram.unk_id == unigram._model.token_to_id("<unk>") + 4
  assert TokenizerSpec("huggingface", str(tmp_path / "b.json")).load().unk_id is None
  sentencepiece = TokenizerSpec("sentencepiece", str(tmp_path / "s.model")).load(offset=4)
  assert sentencepiece.unk_id == 4 and _bytes().unk_id is None


def test_texts_all_unknown_are_refused_and_mostly_unknown_said(wordpiece, tmp_path, capsys):
  tokenizer = TokenizerSpec("huggingface", wordpiece).load()
  japanese = [{"text": "日本語の文章です", "label": "ab"[i % 2]} for i in range(6)]
  with pytest.raises(RunError) as error:
    _prepare(tmp_path, japanese, tokenizer=tokenizer)
  tokens = 6 * _tokens(wordpiece, japanese[0]["text"])
  _one_line(error, f"{tmp_path}/train.jsonl: every one of its {tokens} tokens is the unknown "
                   f"token '[UNK]' of the tokenizer {wordpiece}")
  assert sorted(os.listdir(tmp_path)) == ["eval.jsonl", "train.jsonl"]  # nothing kept
  half, english = "the 日本語", "the fox"
  rows = [{"text": text, "label": "ab"[i % 2]} for text in (english, half) for i in range(6)]
  _prepare(tmp_path, rows, rows[:6], tokenizer=tokenizer)
  rate = _tokens(wordpiece, half, unknown=True) / (_tokens(wordpiece, english)
                                                   + _tokens(wordpiece, half))
  assert rate > 0.2
  warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
  assert warnings == [f"warning: {tmp_path}/train.jsonl: {rate:.0%} of its tokens are the "
                      f"unknown token '[UNK]' of the tokenizer {wordpiece} (line 7: '{half}'…): "
                      f"the model will not tell apart what they stand for"]
  _prepare(tmp_path, rows[:6] + rows[6:7], name="few")  # a fifth or less: not said
  assert "warning" not in capsys.readouterr().err


def test_pretraining_refuses_a_corpus_its_tokenizer_cannot_read_and_warns_of_one_it_half_can(
    wordpiece, tmp_path, capsys):
  (tmp_path / "ja.txt").write_text("日本語の文章です。\n" * 20, encoding="utf-8")
  (tmp_path / "half.txt").write_text("the fox 日本\n" * 20, encoding="utf-8")
  code = prepare.main(["--input", str(tmp_path / "ja.txt"), "--out", str(tmp_path / "a"),
                       "--tokenizer", wordpiece, "--seq-len", "8", "--workers", "1",
                       "--eval-fraction", "0.2"])
  err = capsys.readouterr().err
  assert code == 2 and "Traceback" not in err
  tokens = 20 * _tokens(wordpiece, "日本語の文章です。")
  assert (f"prepare: error: --tokenizer {wordpiece}: every one of the {tokens} tokens of the "
          f"inputs is its unknown token '[UNK]', expected a tokenizer that reads them"
          ) in err.splitlines()
  assert not os.path.exists(tmp_path / "a")
  prepare.prepare([str(tmp_path / "half.txt")], str(tmp_path / "b"), wordpiece, seq_len=8,
                  eval_fraction=0.2, workers=1, progress=False)
  rate = _tokens(wordpiece, "the fox 日本", unknown=True) / _tokens(wordpiece, "the fox 日本")
  warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
  assert len(warnings) == 1 and "'the fox 日本" in warnings[0], warnings
  assert (f"prepare: warning: --tokenizer {wordpiece}: {rate:.0%} of the tokens of the inputs "
          f"are its unknown token '[UNK]'") in warnings[0]


# ---------------------------------------------------------------------------------------------
# Labels no float or class holds: one line naming the file, the line and the field.


HUGE = 10 ** 400


@pytest.mark.parametrize("label, words", [
    (HUGE, "'label': label 100000000000… (an integer of 401 digits), expected a finite number"),
    (-HUGE, "'label': label -100000000000… (an integer of 401 digits)"),
    (1e39, "'label': label 1e+39, expected a finite number of magnitude at most 3.403e+38"),
], ids=["huge", "-huge", "past float32"])
def test_a_regression_label_no_float32_holds_is_one_line(label, words, tmp_path):
  rows = [{"text": "a", "label": 1.5}, {"text": "b", "label": label}]
  with pytest.raises(RunError) as error:
    _prepare(tmp_path, rows, kind="number")
  _one_line(error, f"{tmp_path}/train.jsonl:2: ", words)
  regressor = regress.Regressor(_fine_tuned("regress", None))
  with pytest.raises(RunError) as error:
    regressor.read({"text": "a", "label": label}, "in.jsonl:3")
  _one_line(error, "in.jsonl:3: ", words)
  assert regressor.read({"text": "a", "label": -2}, "in.jsonl:4") == (("a", None), -2.0)


@pytest.mark.parametrize("label", [["a"], {"a": 1}, True, 1.0])
def test_a_label_that_is_no_class_is_one_line_in_training_and_predict(label, tmp_path):
  classes = [0, 1] if label in (True, 1.0) else ["a", "b"]
  train = [{"text": "x", "label": c} for c in classes]
  with pytest.raises(RunError) as error:
    _prepare(tmp_path, train, [{"text": "x", "label": label}])
  _one_line(error, f"{tmp_path}/eval.jsonl:1: label {label!r} is not one of the training")
  predictor = classify.Predictor(_fine_tuned("classify", classes))
  with pytest.raises(RunError) as error:
    predictor.read({"text": "x", "label": label}, "in.jsonl:2")
  _one_line(error, f"in.jsonl:2: label {label!r}, expected one of the run's classes")
  assert predictor.read({"text": "x", "label": classes[1]}, "in.jsonl:3") == (("x", None), 1)


def test_a_tag_that_is_no_class_is_one_line_in_training_and_predict(tmp_path):
  good = [{"tokens": ["a", "b"], "tags": ["O", "B"]}]
  bad = [{"tokens": ["a", "b"], "tags": [["O"], "O"]}]
  paths = {"train": _write(tmp_path / "train.jsonl", good),
           "eval": _write(tmp_path / "eval.jsonl", bad)}
  with pytest.raises(RunError) as error:
    examples.prepare_tagged(paths, str(tmp_path / "data"), _bytes(), None, SEQ_LEN, TAG_FIELDS,
                            0)
  _one_line(error, f"{tmp_path}/eval.jsonl:1: tag ['O'] is not one of the training file's tags")
  tagger = tag.Tagger(_fine_tuned("tag", ["B", "O"]))
  with pytest.raises(RunError) as error:
    tagger.read(bad[0], "in.jsonl:5")
  _one_line(error, "in.jsonl:5: tag ['O'], expected one of the run's tags ['B', 'O']")


# ---------------------------------------------------------------------------------------------
# Broken tokenizer files, special ids past the vocabulary: one line naming the file.


def _hf_directory(path, wordpiece, post_processor_ids=None, config="{}"):
  """A Hugging Face directory's tokenizer files (no model): `wordpiece`'s tokenizer.json, its
  post-processor's [CLS] id set to `post_processor_ids` where given, and `config` as
  config.json."""
  path.mkdir()
  tokenizer = json.load(open(wordpiece))
  if post_processor_ids is not None:
    tokenizer["post_processor"]["special_tokens"]["[CLS]"]["ids"] = post_processor_ids
  (path / "tokenizer.json").write_text(json.dumps(tokenizer))
  (path / "tokenizer_config.json").write_text(json.dumps({"mask_token": "[MASK]",
                                                          "pad_token": "[PAD]"}))
  (path / "config.json").write_text(config)
  return str(path)


@pytest.mark.parametrize("case", ["tokenizer.json", "directory", "config.json", "config list"])
def test_prepare_names_the_tokenizer_file_that_is_broken(case, wordpiece, tmp_path, capsys):
  (tmp_path / "c.txt").write_text("the quick brown fox\n")
  config = {"config.json": '{"pad_token_id": 0,', "config list": "[0]"}.get(case, "{}")
  directory = _hf_directory(tmp_path / "model", wordpiece, config=config)
  if case in ("tokenizer.json", "directory"):
    with open(wordpiece) as f:
      (tmp_path / "model" / "tokenizer.json").write_text(f.read()[:300])  # truncated
  given = f"{directory}/tokenizer.json" if case == "tokenizer.json" else directory
  broken = f"{directory}/{'config.json' if case.startswith('config') else 'tokenizer.json'}"
  code = prepare.main(["--input", str(tmp_path / "c.txt"), "--out", str(tmp_path / "out"),
                       "--tokenizer", given, "--seq-len", "8", "--workers", "1"])
  err = capsys.readouterr().err
  errors = [line for line in err.splitlines() if line.startswith("prepare: error:")]
  assert code == 2 and "Traceback" not in err and len(errors) == 1, err
  assert broken in errors[0] and ("EOF while parsing" in errors[0] or "JSON" in errors[0])


def test_a_fine_tuning_tokenizer_that_is_broken_is_one_line_naming_it(wordpiece, tmp_path):
  from configs import classify
  broken = tmp_path / "tokenizer.json"
  broken.write_text(open(wordpiece).read()[:300])
  config = classify.get_config()
  config.data.tokenizer = str(broken)
  with pytest.raises(RunError) as error:
    tokenizing.tokenizer_of(config, start_of(config, str(tmp_path)), "unused", lambda r: [],
                            "unused")
  _one_line(error, f"config.data.tokenizer: '{broken}', expected a readable huggingface",
            "EOF while parsing")
  # A Hugging Face directory's tokenizer.json is named as config.init.hf's.
  config.data.tokenizer = None
  start = Start({}, None, TokenizerSpec("huggingface", str(broken)), str(tmp_path),
                hf={"pad_id": 0})
  with pytest.raises(RunError) as error:
    tokenizing.tokenizer_of(config, start, "unused", lambda r: [], "unused")
  _one_line(error, f"config.init.hf: '{broken}', expected a readable huggingface")


def test_special_ids_past_the_vocabulary_are_refused_before_anything_trains(wordpiece, tmp_path):
  directory = _hf_directory(tmp_path / "model", wordpiece, [5000])
  tokenizer = TokenizerSpec("huggingface", f"{directory}/tokenizer.json").load(offset=0)
  size = tokenizer.vocab_size
  template = tokenizing.template_of(tokenizer)
  assert template.start == (5000,)
  rows = [{"text": "the fox", "label": c} for c in "ab"]
  with pytest.raises(RunError) as error:
    _prepare(tmp_path, rows, tokenizer=tokenizer, template=template)
  _one_line(error, f"{directory}/tokenizer.json: special id 5000",
            f"below its vocabulary size {size}")
  with pytest.raises(RunError) as error:
    _prepare(tmp_path, rows, tokenizer=_bytes(), pad_id=999)
  _one_line(error, "the bytes tokenizer: padding id 999, expected an id below its vocabulary "
                   "size 260")
  with pytest.raises(RunError) as error:
    examples.prepare_tagged({"train": "unused", "eval": "unused"}, str(tmp_path / "tags"),
                            tokenizer, None, SEQ_LEN, TAG_FIELDS, 0, template)
  _one_line(error, "special id 5000")
  # Pretraining on the directory's ids, and the library's classifier, refuse them too.
  (tmp_path / "c.txt").write_text("the quick brown fox\n")
  with pytest.raises(prepare.PrepareError) as error:
    prepare.prepare([str(tmp_path / "c.txt")], str(tmp_path / "out"), directory, seq_len=8,
                    workers=1, progress=False)
  _one_line(error, f"--tokenizer {directory}", "special id 5000",
            f"below its vocabulary size {size}")
  cfg = EncoderConfig(vocab_size=size, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=16)
  with pytest.raises(ValueError, match=rf"^template: id 5000, expected ids below the encoder's "
                                       rf"vocab_size {size}$"):
    TextClassifier(cfg, {}, ["a", "b"], tokenizer, 16, 2, template=template)
