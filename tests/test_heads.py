"""The regression and tagging heads: their metrics against hand-computed cases, the words'
alignment against transformers' word_ids, runs from a Hugging Face directory whose export
transformers loads as itself (logits and loss), predict, a run from scratch that resumes
exactly, and the one-line refusals of bad labels."""

import json
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax_encoder.tokenizer import Tokenizer, encode_words  # noqa: E402
from tests import hf_models, runs  # noqa: E402
from train.data import examples
from train.errors import RunError  # noqa: E402
from train.outputs.predict import predict  # noqa: E402
from train.tasks import regress, tag  # noqa: E402
from train.tasks.tag import Tagger  # noqa: E402

WORDS = {"PER": ["ada", "fox", "brown dog"], "LOC": ["oslo", "abcd", "over there"]}
OTHER = ["the", "quick", "0123", "jumps", "abcdefgh", "+-*/", "9"]


def _write(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def _tagged(rng, n):
  """Lines of words and BIO tags: names of two kinds among other words; a name of two words
  is a B- and an I-."""
  rows = []
  for _ in range(n):
    words, tags = [], []
    for _ in range(rng.integers(2, 7)):
      if rng.random() < 0.35:
        kind = ("PER", "LOC")[int(rng.integers(2))]
        name = str(rng.choice(WORDS[kind])).split()
        words += name
        tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(name) - 1)
      else:
        words.append(str(rng.choice(OTHER)))
        tags.append("O")
    rows.append({"tokens": words, "tags": tags})
  return rows


def _scored(rng, n):
  """Pairs of texts and a number: half the difference of their lengths."""
  rows = []
  for _ in range(n):
    a = " ".join(rng.choice(list("abcdefghij"), rng.integers(1, 6)))
    b = " ".join(rng.choice(list("0123456789"), rng.integers(1, 6)))
    rows.append({"text": a, "text_pair": b, "label": (len(a) - len(b)) / 4})
  return rows


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """{'tag': (train, eval), 'regress': (train, eval)} JSON-lines files, and a BERT directory."""
  directory = tmp_path_factory.mktemp("heads")
  rng = np.random.default_rng(0)
  files = {task: tuple(_write(directory / f"{task}.{split}.jsonl", make(rng, n))
                       for split, n in (("train", 48), ("eval", 16)))
           for task, make in (("tag", _tagged), ("regress", _scored))}
  return files, hf_models.write(directory / "bert", "bert")


def _args(task, files, *overrides, steps=8, every=4):
  train, eval_ = files[task]
  return [f"--config={os.path.join(runs.ROOT, 'configs', task + '.py')}",
          f"--config.data.train={train}", f"--config.data.eval={eval_}",
          f"--config.train.num_steps={steps}", "--config.train.batch_size=8",
          "--config.train.seq_len=32", "--config.train.log_every=2",
          f"--config.train.eval_every={steps}", f"--config.train.checkpoint_every={every}",
          "--config.train.keep_checkpoints=3", "--config.optim.warmup_steps=2", *overrides]


@pytest.fixture(scope="module", params=["tag", "regress"])
def hf_run(request, data, tmp_path_factory):
  """(task, workdir, final eval metrics) of a few steps from the BERT directory."""
  files, bert = data
  workdir = str(tmp_path_factory.mktemp(request.param) / "run")
  result = runs.train(workdir, *_args(request.param, files, f"--config.init.hf={bert}"),
                      config=None)
  assert f"fine-tuning from {bert}: " in result.stderr
  records = runs.read_metrics(os.path.join(workdir, "metrics.jsonl"))
  return request.param, workdir, [r for r in records if r["split"] == "eval"][-1]


# ---------------------------------------------------------------------------------------------
# The metrics, against cases worked out by hand.


def test_pearson_and_spearman_are_those_worked_out_by_hand():
  # dx = dy = (-1.5, -.5, .5, 1.5) but for the middle two swapped: 4 / 5.
  assert regress.pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
  assert regress.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
  # Tied values share their mean rank: (1, 2.5, 2.5, 4) against (1, 2, 3, 4) is 4.5 / sqrt(22.5).
  np.testing.assert_array_equal(regress.ranks([1, 2, 2, 3]), [1, 2.5, 2.5, 4])
  np.testing.assert_array_equal(regress.ranks([30, 10, 20, 10]), [4, 1.5, 3, 1.5])
  assert regress.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(3 / np.sqrt(10))
  # Monotone but not linear: the ranks agree exactly, the values do not.
  assert regress.spearman([1, 2, 3, 4], [1, 10, 100, 1000]) == pytest.approx(1.0)
  assert regress.pearson([1, 2, 3, 4], [1, 10, 100, 1000]) < 0.9
  assert regress.spearman([4, 3, 2, 1], [1, 2, 3, 5]) == pytest.approx(-1.0)
  assert np.isnan(regress.pearson([1, 1, 1], [1, 2, 3]))  # undefined, not a number made up


TAGS = ["B-LOC", "B-PER", "I-LOC", "I-PER", "O"]


def _entities(true, predicted, tagged=None):
  index = lambda row: [TAGS.index(t) if t else 0 for t in row]
  true, predicted = np.array([index(true)]), np.array([index(predicted)])
  tagged = np.ones_like(true, bool) if tagged is None else np.array([tagged])
  return tuple(int(c) for c in tag.entity_counts(tag.BIO.of(TAGS), true, predicted, tagged))


def test_entities_are_counted_strictly_as_worked_out_by_hand():
  # (true entities, predicted entities, predicted ones that are true)
  assert _entities(["B-PER", "I-PER", "O", "B-LOC"],
                   ["B-PER", "I-PER", "O", "B-PER"]) == (2, 2, 1)  # the LOC's type is wrong
  assert _entities(["B-PER", "I-PER"], ["B-PER", "O"]) == (1, 1, 0)  # ends too soon
  assert _entities(["B-PER", "O"], ["B-PER", "I-PER"]) == (1, 1, 0)  # ends too late
  assert _entities(["B-PER", "B-PER"], ["B-PER", "I-PER"]) == (2, 1, 0)  # two, not one
  # An I- that follows no B- or I- of its type begins nothing (seqeval's strict IOB2).
  assert _entities(["O", "I-PER", "I-PER", "B-LOC"],
                   ["B-PER", "I-PER", "I-PER", "B-LOC"]) == (1, 2, 1)
  assert _entities(["B-PER", "I-LOC"], ["B-PER", "O"]) == (1, 1, 1)
  # Untagged positions (a word's other ids) are skipped: the words either side are adjacent.
  assert _entities(["B-LOC", None, "I-LOC", "O"], ["B-LOC", None, "I-LOC", "O"],
                   [True, False, True, True]) == (1, 1, 1)
  assert _entities(["B-LOC", None, "I-LOC"], ["B-LOC", "O", "B-LOC"],
                   [True, False, True]) == (1, 2, 0)
  assert tag.entity_f1(2, 2, 1) == 0.5 and tag.entity_f1(0, 0, 0) == 0.0
  assert tag.BIO.of(["NN", "VB"]) is None and tag.BIO.of([0, 1]) is None
  assert tag.BIO.of(["O", "I-X"]) is None  # nothing begins an entity: not BIO
  assert tag.BIO.of(TAGS) == tag.BIO((True, True, False, False, False), (0, 1, 0, 1, -1))


# ---------------------------------------------------------------------------------------------
# The words' layout, and runs from a Hugging Face directory.


def test_each_words_tag_sits_at_its_first_id_as_transformers_word_ids_say(data, tmp_path):
  files, bert = data
  hf = transformers.AutoTokenizer.from_pretrained(bert)
  ours = Tokenizer.from_file("huggingface", os.path.join(bert, "tokenizer.json"))
  texts = [r["tokens"] for r in map(json.loads, open(files["tag"][0]))][:12]
  texts.append(["abcdefgh"] * 12 + ["fox", ""])  # cut off at 16 ids, an empty word
  # Words of thousands of characters that tokenize to nothing, then words that show.
  texts.append(["\u200b" * 3000, " " * 2000, "fox", "abcdefgh", "fox"])
  from train.tasks.tokenizing import template_of
  laid = encode_words(ours, texts, 16, template_of(ours))
  several = 0
  for words, (ids, first) in zip(texts, laid):
    encoded = hf(words, is_split_into_words=True, truncation=True, max_length=16)
    word_ids = encoded.word_ids()
    assert ids.tolist() == encoded["input_ids"]
    assert first.tolist() == [word_ids.index(w) if w in word_ids else -1
                              for w in range(len(words))]
    several += len(ids) - 2 > (first >= 0).sum()
  assert several and laid[-2][1][-3:].tolist() == [-1, -1, -1]  # a word split; words cut
  assert laid[-1][1].tolist()[:3] == [-1, -1, 1]

  # The prepared labels: each word's tag at its first id, -1 (-100 in transformers) elsewhere.
  meta = examples.prepare_tagged({"train": files["tag"][0], "eval": files["tag"][1]},
                                 str(tmp_path / "data"), _spec_tokenizer(bert), "tokenizer.json", 32,
                                 {"tokens": "tokens", "tags": "tags"}, 0,
                                 template_of(ours))
  labels = examples.load_examples(str(tmp_path / "data"))["train"]["labels"]
  for i, row in enumerate(map(json.loads, open(files["tag"][0]))):
    word_ids = hf(row["tokens"], is_split_into_words=True).word_ids()
    want = [-1 if w is None or (j and word_ids[j - 1] == w) else
            meta["labels"].index(row["tags"][w]) for j, w in enumerate(word_ids)]
    assert labels[i, :len(want)].tolist() == want and set(labels[i, len(want):]) <= {-1}


def _spec_tokenizer(directory):
  from train.data.tokens import TokenizerSpec
  return TokenizerSpec("huggingface", os.path.join(directory, "tokenizer.json")).load(0)


def test_predict_in_int8_is_near_the_float_prediction(hf_run, data, tmp_path):
  # --quantize int8 (qwix: int8 kernels a scale per output channel, activations a scale per
  # token): the same tags for nearly every word; numbers within 2% of the float ones (this
  # tiny run predicts nearly one number: their spread is no scale).
  pytest.importorskip("qwix")
  task, workdir, _ = hf_run
  eval_ = data[0][task][1]
  got = {}
  for quantize in (None, "int8"):
    out = tmp_path / f"{quantize}.jsonl"
    assert predict(workdir, eval_, str(out), quantize=quantize).count == 16
    got[quantize] = [json.loads(line) for line in out.read_text().splitlines()]
  if task == "tag":
    tags = [(a, b) for x, y in zip(got[None], got["int8"]) for a, b in zip(x["tags"], y["tags"])]
    assert np.mean([a == b for a, b in tags]) >= 0.95
  else:
    plain, int8 = (np.array([p["score"] for p in got[q]]) for q in (None, "int8"))
    assert not np.array_equal(plain, int8)  # computed otherwise
    assert np.abs(int8 - plain).max() <= 0.02 * np.abs(plain).max()


def test_predict_refuses_int8_for_a_classify_run_in_one_line():
  from train.tasks.supervised import FineTuned, quantized_run
  run = FineTuned("classify", None, {}, ["a", "b"], {}, None)
  assert quantized_run(run, None) is run
  with pytest.raises(RunError, match=r"^--quantize int8: a classify run predicts in its float "
                     r"weights here, expected a run of \('regress', 'rerank', 'tag'\)$"):
    quantized_run(run, "int8")


def test_a_run_exports_what_transformers_loads_as_itself_and_predicts_its_eval(hf_run,
                                                                               data, tmp_path):
  task, workdir, final = hf_run
  files, _ = data
  rows = [json.loads(line) for line in open(files[task][1])]
  from train.outputs.export import main as export
  out = str(tmp_path / "exported")
  assert export(["--workdir", workdir, "--layout", "hf", "--out", out]) == 0
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  if task == "tag":
    model = transformers.AutoModelForTokenClassification.from_pretrained(
        out, attn_implementation="eager").eval()
    assert type(model).__name__ == "BertForTokenClassification"
    assert list(model.config.id2label.values()) == ["B-LOC", "B-PER", "I-LOC", "I-PER", "O"]
    batch = tokenizer([r["tokens"] for r in rows], is_split_into_words=True, padding=True,
                      return_tensors="pt")
    labels = torch.full(batch["input_ids"].shape, -100)
    for i, row in enumerate(rows):
      seen = set()
      for j, w in enumerate(batch.word_ids(i)):
        if w is not None and w not in seen:
          seen.add(w)
          labels[i, j] = model.config.label2id[row["tags"][w]]
  else:
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        out, attn_implementation="eager").eval()
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"
    batch = tokenizer([r["text"] for r in rows], [r["text_pair"] for r in rows], padding=True,
                      return_token_type_ids=True, return_tensors="pt")
    labels = torch.tensor([r["label"] for r in rows])
  with torch.no_grad():
    theirs = model(**batch, labels=labels)
  # The held-out loss is theirs on the same examples: the tags' alignment, the loss.
  assert final["loss"] == pytest.approx(theirs.loss.item(), rel=1e-5)

  out = tmp_path / "predictions.jsonl"
  done = predict(workdir, files[task][1], str(out))
  written = [json.loads(line) for line in out.read_text().splitlines()]
  if task == "tag":
    logits = theirs.logits.numpy()
    ours = Tagger(workdir)
    mine = np.asarray(ours.run.model.apply({"params": ours.params},
                                           batch["input_ids"].numpy().astype(np.int32)))
    real = batch["attention_mask"].numpy().astype(bool)
    np.testing.assert_allclose(mine[real], logits[real], atol=1e-5)
    for i, row in enumerate(rows):  # each word's tag: the logits at its first id
      first = [batch.word_ids(i).index(w) for w in range(len(row["tokens"]))]
      assert written[i]["tags"] == [ours.labels[int(np.argmax(logits[i, j]))] for j in first]
    assert set(done.scores) == {"accuracy", "macro_f1", "entity_f1"}
    _unseen_words_are_null(workdir, tmp_path)
  else:
    np.testing.assert_allclose([w["score"] for w in written], theirs.logits[:, 0].numpy(),
                               atol=1e-5)
    assert done.scores["mse"] == pytest.approx(final["loss"], rel=1e-5)
    _correlations_agree(final, done.scores, [w["score"] for w in written],
                        theirs.logits[:, 0].numpy(), labels.numpy())
  if task == "tag":
    for name in set(done.scores):  # counts of the argmaxes, tied to transformers' logits above
      assert done.scores[name] == pytest.approx(final[name], abs=1e-6), name
  assert done.count == done.labelled == len(rows)


def _correlations_agree(final, scores, written, logits, labels):
  """predict's correlations are those of the predictions it wrote (one computation: equal);
  the run's eval made its predictions in other batches, another float32 program, so its
  correlations are those of transformers' logits up to what moving each prediction by the
  1e-5 asserted above can change, however small the predictions' spread."""
  assert scores["pearson"] == regress.pearson(written, labels)
  assert scores["spearman"] == regress.spearman(written, labels)
  x = np.asarray(logits, np.float64)
  n, moved = len(x), 2 * 1e-5
  # Pearson's is the cosine of the centred vectors: a change of norm d turns them by at most
  # d / |x - mean(x)|, and the cosine by no more than that angle.
  assert final["pearson"] == pytest.approx(
      regress.pearson(x, labels), abs=moved * np.sqrt(n) / np.linalg.norm(x - x.mean()))
  # Spearman's moves only where two predictions closer than the change can swap ranks, each
  # swap changing the sum of squared rank differences by at most 4n: 24 / (n^2 - 1) of it.
  near = int(np.sum(np.abs(x[:, None] - x[None, :]) < moved) - n) // 2
  assert final["spearman"] == pytest.approx(regress.spearman(x, labels),
                                            abs=near * 24 / (n * n - 1) + 1e-12)


def _unseen_words_are_null(workdir, tmp_path):
  """predict on lines without tags: a tag per word, null for the words cut off."""
  lines = [{"tokens": ["ada", "lives", "in", "oslo"]}, {"tokens": ["abcdefgh"] * 20},
           {"tokens": []}]
  path = _write(tmp_path / "words.jsonl", lines)
  done = predict(workdir, path, str(tmp_path / "tags.jsonl"))
  written = [json.loads(line)["tags"] for line in open(tmp_path / "tags.jsonl")]
  assert done.count == 3 and done.scores is None
  tags = set(Tagger(workdir).labels)
  assert len(written[0]) == 4 and set(written[0]) <= tags
  # The 30 ids between [CLS] and [SEP] hold the first 8 words (4 ids each), no more.
  assert set(written[1][:5]) <= tags and written[1][-5:] == [None] * 5
  assert written[2] == []
  bad = _write(tmp_path / "bad.jsonl", [*lines, {"tokens": ["ada"], "tags": ["B-ORG"]}])
  with pytest.raises(RunError, match=r"^\S*bad.jsonl:4: tag 'B-ORG', expected one of the run's "
                                     r"tags \['B-LOC'"):
    predict(workdir, bad, str(tmp_path / "never.jsonl"))
  assert not os.path.exists(tmp_path / "never.jsonl")


# ---------------------------------------------------------------------------------------------
# From scratch (this project's ids, a vocabulary trained on the training words), resuming.


SCRATCH = ["--config.model.d_model=16", "--config.model.n_heads=2", "--config.model.d_ff=32",
           "--config.model.n_layers=1", "--config.model.max_len=32",
           "--config.data.vocab_size=400"]


def test_a_tagging_run_from_scratch_resumes_exactly(data, tmp_path):
  # Regression's examples are classification's (tested there) with float labels; its
  # held-out rows and their NaN padding are the runs' above.
  files, task = data[0], "tag"
  workdir = str(tmp_path / "run")
  args = _args(task, files, *SCRATCH, "--config.train.log_every=1", steps=4, every=2)
  runs.train(workdir, *args, config=None)
  straight = runs.losses(workdir)
  meta = examples.load_examples(os.path.join(workdir, "data"))["meta"]
  assert meta["tokenizer"]["offset"] == 4 and meta["template"] is None
  # As if killed after the checkpoint at step 2: the run goes on from there.
  shutil.rmtree(os.path.join(workdir, "checkpoints", "4"))
  result = runs.train(workdir, *args, config=None)
  assert "resumed from the checkpoint at step 2" in result.stderr
  assert runs.losses(workdir) == straight and len(straight) == 4
  tagged = Tagger(workdir).tag_indices([["ada", "fox"], ["abcdefgh"] * 40])
  assert len(tagged[0]) == 2 and tagged[1][0] >= 0 and tagged[1][-1] == -1


# ---------------------------------------------------------------------------------------------
# Bad labels: one line naming the file and line.


@pytest.mark.parametrize("task, train, eval_, words", [
    ("regress", [{"text": "a", "label": 1}, {"text": "b", "label": "3.2"}], None,
     "train.jsonl:2: label '3.2' is a str, expected a number"),
    ("regress", [{"text": "a"}], None, "train.jsonl:1: no 'label' field, expected every line"),
    ("regress", None, [{"text": "a", "label": True}],
     "eval.jsonl:1: label True is a bool, expected a number"),
    ("regress", [{"text": "a", "label": float("nan")}], None,
     "train.jsonl:1: label nan, expected a finite number"),
    ("tag", [{"tokens": ["a", "b"], "tags": ["O", "B-X"]}, {"tokens": ["a", "b"], "tags": ["O"]}],
     None, "train.jsonl:2: 'tags': 1 tags, expected a list of one tag per word (2)"),
    ("tag", [{"tokens": "a b", "tags": ["O", "O"]}], None,
     "train.jsonl:1: 'tokens': got a str, expected a list of strings"),
    ("tag", [{"tokens": ["a", 3], "tags": ["O", "O"]}], None,
     "train.jsonl:1: 'tokens': got a list holding 3, expected a list of strings"),
    ("tag", [{"tokens": ["a"], "tags": [0.5]}], None,
     "train.jsonl:1: tag 0.5 is a float, expected a string or an integer"),
    ("tag", None, [{"tokens": ["a"], "tags": ["B-ORG"]}],
     "eval.jsonl:1: tag 'B-ORG' is not one of the training file's tags"),
    ("tag", [{"tokens": ["a", "b"], "tags": ["O", "O"]}], None,
     "train.jsonl: every example has the tag 'O', expected at least two tags"),
])
def test_a_bad_label_is_one_line_naming_file_and_line(task, train, eval_, words, tmp_path):
  good = {"regress": [{"text": "a", "label": 1.5}, {"text": "b", "label": -2}],
          "tag": [{"tokens": ["a", "b"], "tags": ["O", "B-X"]}]}[task]
  files = {task: (_write(tmp_path / "train.jsonl", train or good),
                  _write(tmp_path / "eval.jsonl", eval_ or good))}
  result = runs.train(str(tmp_path / "run"), *_args(task, files, "--config.data.tokenizer=bytes"),
                      config=None, check=False)
  assert result.returncode == 2, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
  assert words in errors[0], errors[0]
