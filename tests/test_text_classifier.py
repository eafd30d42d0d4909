"""The library's text classifier: a tokenizer and a SequenceClassifier in one file that turns
texts into labels, computing what the module computes on the ids training lays out."""

import io

import jax
import numpy as np
import pytest

from flax_encoder import EncoderConfig
from flax_encoder.classifier import SequenceClassifier, macro_f1
from flax_encoder.text_classifier import TextClassifier
from flax_encoder.tokenizer import Tokenizer, encode_examples
from train.data.examples import example_ids

pytestmark = pytest.mark.library  # the library's own: run on accelerators too

LABELS = ["net", "doc", "games"]


def _sentencepiece(tmp_path) -> Tokenizer:
  import sentencepiece as spm
  rng = np.random.default_rng(0)
  words = ["packet", "router", "manual", "guide", "chess", "puzzle", "the", "a", "for"]
  lines = [" ".join(rng.choice(words, 8)) for _ in range(300)]
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                                 vocab_size=30, minloglevel=2, num_threads=1)
  return Tokenizer("sentencepiece", model.getvalue(), offset=4)


@pytest.fixture(params=["bytes", "sentencepiece"])
def classifier(request, tmp_path):
  tokenizer = (Tokenizer("bytes", None, offset=4) if request.param == "bytes"
               else _sentencepiece(tmp_path))
  cfg = EncoderConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32,
                      n_layers=1, max_len=32, dropout=0.0)
  model = SequenceClassifier(cfg, len(LABELS))
  params = jax.device_get(model.init(jax.random.key(0), np.ones((1, 8), np.int32))["params"])
  params = jax.tree.map(np.asarray, __import__("flax").linen.unbox(params))
  return TextClassifier(cfg, params, LABELS, tokenizer, seq_len=24, separator_id=2,
                        batch_size=4)


TEXTS = ["a router for packets", "the chess guide", "", "ü" * 40, "manual"]
PAIRS = ["and its context", None, "x", "y", "a very long second text " * 3]


def test_the_ids_are_laid_out_as_training_lays_them_out(classifier):
  tokenizer = classifier.tokenizer
  rows = encode_examples(tokenizer, TEXTS, PAIRS, 24, 2)
  for text, pair, row in zip(TEXTS, PAIRS, rows):
    first = tokenizer.encode_batch([text])[0]
    second = tokenizer.encode_batch([pair])[0] if pair is not None else None
    np.testing.assert_array_equal(row, example_ids(first, second, 24, 2)[0])
    assert len(row) <= 24


def test_probabilities_are_the_modules_on_those_ids_and_survive_a_file(classifier, tmp_path):
  rows = encode_examples(classifier.tokenizer, TEXTS, PAIRS, 24, 2)
  model = SequenceClassifier(classifier.config, len(LABELS))
  expected = []
  for row in rows:  # each alone, unpadded: padding must not change a row's answer
    logits = model.apply({"params": classifier.params}, np.asarray(row, np.int32)[None])
    expected.append(np.asarray(jax.nn.softmax(logits))[0])
  got = classifier.probabilities(TEXTS, PAIRS)
  np.testing.assert_allclose(got, np.array(expected), atol=2e-6)
  assert classifier(TEXTS, PAIRS) == [LABELS[i] for i in np.argmax(expected, -1)]
  classifier.save(tmp_path / "c.msgpack")
  loaded = TextClassifier.load(tmp_path / "c.msgpack")
  np.testing.assert_allclose(loaded.probabilities(TEXTS, PAIRS), got, atol=1e-6)
  assert loaded.labels == LABELS and loaded.tokenizer.kind == classifier.tokenizer.kind
  # How it runs is the reader's choice.
  half = TextClassifier.load(tmp_path / "c.msgpack", dtype="bfloat16")
  assert half.config.dtype == np.dtype("bfloat16")
  np.testing.assert_allclose(half.probabilities(TEXTS, PAIRS), got, atol=0.05)


def test_bad_inputs_are_one_line_naming_the_argument(classifier, tmp_path):
  for args, words in ((("a text",), "texts: a str, expected a list of strings"),
                      (([1, 2],), "texts: holds 1, expected strings"),
                      ((["a"], ["b", "c"]), "pairs: 2 of them, expected one per text (1)")):
    with pytest.raises(ValueError, match="^" + __import__("re").escape(words)):
      classifier.probabilities(*args)
  (tmp_path / "other.msgpack").write_bytes(b"not a classifier")
  with pytest.raises(ValueError, match="other.msgpack' is not a text classifier file"):
    TextClassifier.load(tmp_path / "other.msgpack")
  classifier.save(tmp_path / "c.msgpack")
  for size in (0, -4):  # -4 gave every text probabilities of 0 and the first label
    with pytest.raises(ValueError, match=f"batch_size: {size}, expected an integer >= 1"):
      TextClassifier.load(tmp_path / "c.msgpack", batch_size=size)


def test_macro_f1_is_the_mean_over_classes_seen():
  # Class 0: 1 right of 2 labels and 1 prediction; class 1: its one label missed; class 2
  # neither labelled nor predicted (left out).
  true_positives, true, predicted = [1, 0, 0], [2, 1, 0], [2, 1, 0]
  assert macro_f1(true_positives, true, predicted) == pytest.approx((2 / 4 + 0) / 2)
