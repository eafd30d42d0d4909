"""flax_encoder.cross_encoder: CrossEncoder folders, saved here by sentence-transformers 6 itself
around tiny random *ForSequenceClassification models (BERT with token types, RoBERTa; one
label and three), and as Hugging Face directories as rerankers were published before, score
what `CrossEncoder(folder).predict` scores, many pairs packed to a row; a folder completed by
`save_cross_encoder_modules` loads in CrossEncoder with the same scores."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from flax_encoder import cross_encoder
from flax_encoder.cross_encoder import Reranker, RerankerError, save_cross_encoder_modules
from flax_encoder.tokenizer import kept
from tests.opens import assert_a_load_opens_each_file_once
from tests.test_hostile_inputs import LITERAL_SPECIALS

MAX = 24  # ids a pair is cut to (BERT: 21 between its 3 special ids, an odd room)
WORDS = ("the quick brown fox jumps over lazy dog 0 1 2 3 4 5 6 7 8 9 0123 4567 89 a b c d e f g "
         "h i j abcd efgh ij + - * / = < > ! ? % +-*/ =<>!").split()


def _pairs() -> list[tuple[str, str]]:
  """Pairs of 0 to 40 words each (many cut at MAX ids, either text the longer, both longer
  than the room), some with characters the tokenizers never saw, one text or both empty."""
  rng = np.random.default_rng(0)
  text = lambda n: " ".join(rng.choice(WORDS, n))
  lengths = [(1, 2), (3, 5), (8, 13), (21, 2), (2, 21), (34, 40), (40, 34), (15, 15), (30, 30),
             (12, 9), (9, 12), (0, 5), (5, 0), (0, 0), (25, 11), (11, 25), (6, 17), (40, 40)]
  return [(text(a), text(b)) for a, b in lengths] + [
      ("Zürich ☃ naïve", "THE QUICK Brown fox"), ("dog", "the quick brown fox " * 10),
      *zip(LITERAL_SPECIALS, LITERAL_SPECIALS[::-1])]


PAIRS = _pairs()


def _perturbed(path) -> str:
  """The model saved at `path` with noise added to every parameter: transformers starts the
  LayerNorms at 1 and 0 and the token types near each other, where a mistake in reading them,
  or in the pair's token types, would hardly show in the scores."""
  import torch
  import transformers
  model = transformers.AutoModelForSequenceClassification.from_pretrained(path)
  torch.manual_seed(0)
  with torch.no_grad():
    for param in model.parameters():
      param.add_(0.1 * torch.randn_like(param))
  model.save_pretrained(path)
  return str(path)


def _edit(file, **entries) -> None:
  with open(file) as f:
    value = json.load(f)
  value.update(entries)
  with open(file, "w") as f:
    json.dump(value, f)


def _hf_files(source, target) -> str:
  """A copy of the Hugging Face files (config.json, weights, tokenizer) of `source`."""
  os.makedirs(target)
  for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(source, name), target)
  return str(target)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """name -> a CrossEncoder folder."""
  pytest.importorskip("torch", reason="sentence-transformers saves the folders")
  pytest.importorskip("sentence_transformers")
  from sentence_transformers import CrossEncoder

  from tests import hf_models
  root = tmp_path_factory.mktemp("ce")
  bert = _perturbed(hf_models.write(root / "bert", "bert", head="sequence_classification",
                                    num_labels=1))
  # transformers' BertTokenizer gives the model token types (a tokenizer.json alone, none);
  # built from the vocabulary, it lower-cases unless told not to, as this tokenizer.json does
  _edit(os.path.join(bert, "tokenizer_config.json"), tokenizer_class="BertTokenizer",
        do_lower_case=False)
  roberta = _perturbed(hf_models.write(root / "roberta", "roberta",
                                       head="sequence_classification", num_labels=1, seed=1))
  labels = _perturbed(hf_models.write(root / "labels", "bert", head="sequence_classification",
                                      num_labels=3, seed=2))
  # ModernBERT's classifier pools through its prediction head
  modernbert = _perturbed(hf_models.write(root / "modernbert", "modernbert",
                                          head="sequence_classification", num_labels=1, seed=3))
  save = lambda source, name, **options: CrossEncoder(source, device="cpu", **options).save(
      str(root / name)) or str(root / name)
  out = {
      "bert": save(bert, "bert-st", max_length=MAX),
      "roberta": save(roberta, "roberta-st", max_length=MAX),
      "labels": save(labels, "labels-st", max_length=MAX),
      "modernbert": save(modernbert, "modernbert-st", max_length=MAX),
      "prompt": save(bert, "prompt-st", max_length=MAX, prompts={"query": "the query: "},
                     default_prompt_name="query"),
  }
  # as rerankers were published before sentence-transformers 6: the Hugging Face directory
  # alone, its max length the tokenizer's, its activation where sentence-transformers 4 and 5
  # saved it
  out["plain"] = _hf_files(roberta, root / "plain")
  _edit(os.path.join(out["plain"], "tokenizer_config.json"), model_max_length=MAX - 5)
  _edit(os.path.join(out["plain"], "config.json"), sentence_transformers={
      "activation_fn": "torch.nn.modules.linear.Identity", "version": "4.1.0"})
  out["plain-bert"] = _hf_files(bert, root / "plain-bert")  # Sigmoid, 66 ids
  return out


@pytest.fixture(scope="module")
def loaded(folders):
  """name -> (Reranker, CrossEncoder) of each folder."""
  from sentence_transformers import CrossEncoder
  return {name: (Reranker.load(path), CrossEncoder(path, device="cpu"))
          for name, path in folders.items()}


def _identity(x):
  return x


@pytest.mark.parametrize("name", ["bert", "roberta", "labels", "modernbert", "plain",
                                  "plain-bert"])
def test_the_scores_are_cross_encoders(loaded, name):
  ours, theirs = loaded[name]
  got, want = ours.predict(PAIRS), theirs.predict(PAIRS)
  labels = () if ours.num_labels == 1 else (3,)
  assert got.dtype == np.float32 and got.shape == want.shape == (len(PAIRS), *labels)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
  # and the logits, which a sigmoid near 0.5 would flatten
  got, want = ours.predict(PAIRS, apply_activation=False), theirs.predict(
      PAIRS, activation_fn=_identity)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
  assert np.ptp(got) > 0.01  # scores that tell the pairs apart, far past the tolerance


@pytest.mark.parametrize("name", ["bert", "roberta", "plain"])
def test_pairs_are_laid_out_and_cut_as_transformers_does(loaded, name):
  """Each pair's ids are those transformers' tokenizer gives (truncation="longest_first"), and
  the token types the classifier gives them those it gives the model."""
  ours, theirs = loaded[name]
  rng = np.random.default_rng(1)
  pairs = PAIRS + [(" ".join(rng.choice(WORDS, a)), " ".join(rng.choice(WORDS, b)))
                   for a, b in rng.integers(0, 30, (60, 2))]
  features = theirs.preprocess(pairs)
  ids, second_starts = ours.encode_pairs(pairs)
  rows = ours.pack(ids, second_starts=second_starts)
  for i, row in enumerate(ids):
    real = features["attention_mask"][i].numpy().astype(bool)
    np.testing.assert_array_equal(row, features["input_ids"][i].numpy()[real], err_msg=str(i))
    if "token_type_ids" in features:
      at, segment = rows.where[i]
      types = rows.token_types[at][rows.segment_ids[at] == segment + 1]
      np.testing.assert_array_equal(types, features["token_type_ids"][i].numpy()[real])
  assert max(map(len, ids)) == ours.max_seq_length
  assert ("token_type_ids" in features) == (ours.model.type_separator is not None)


def test_a_load_opens_each_file_of_the_folder_once(folders):
  """A load reads the folder's files through one FolderFiles: modules.json, the modules'
  config.json, the settings and the tokenizer's options each opened once (or looked for once,
  where absent)."""
  for name in ("bert", "prompt"):
    assert_a_load_opens_each_file_once(Reranker.load, folders[name])


def test_what_the_folders_say_is_read(loaded):
  bert, roberta, labels, plain, plain_bert = (
      loaded[n][0] for n in ("bert", "roberta", "labels", "plain", "plain-bert"))
  # config_sentence_transformers.json's activation_fn; config.json's sentence_transformers
  # entry; else a sigmoid for one label, nothing for several
  assert [r.model.activation for r in (bert, roberta, labels, plain, plain_bert)] == [
      "Sigmoid", "Sigmoid", "Identity", "Identity", "Sigmoid"]
  assert [r.max_seq_length for r in (bert, roberta, plain, plain_bert)] == [MAX, MAX, MAX - 5, 66]
  assert (bert.num_labels, labels.num_labels) == (1, 3)
  # BertTokenizer gives token types (b of type 1 from the [SEP] after a); RoBERTa's none
  assert bert.model.type_separator == bert.template.between[0]
  assert roberta.model.type_separator is None and len(roberta.template.between) == 2
  assert plain_bert.model.type_separator == bert.model.type_separator
  for name in ("bert", "roberta", "plain"):
    ours, theirs = loaded[name]
    assert ours.max_seq_length == theirs.max_seq_length


@pytest.mark.parametrize("first,second,room,longer,want", [
    (3, 4, 10, None, (3, 4)),        # fits
    (2, 30, 10, None, (2, 8)),       # the shorter whole, the longer cut to the rest
    (30, 2, 10, None, (8, 2)),
    (5, 30, 10, None, (5, 5)),       # the shorter takes half: both cut to half
    (30, 7, 11, None, (6, 5)),       # the odd id to the longer
    (7, 30, 11, None, (5, 6)),
    (12, 12, 11, True, (6, 5)),      # both past the room: which is longer is asked
    (12, 12, 11, False, (5, 6)),
    (12, 12, 10, None, (5, 5)),      # an even room: not asked
])
def test_kept_is_longest_first(first, second, room, longer, want):
  def first_longer():
    assert longer is not None, "asked where it does not matter"
    return longer
  assert kept(first, second, room, first_longer) == want


def test_a_long_first_text_is_told_from_a_long_second(loaded):
  """Both texts past the room (21 ids): the odd id goes to the one longer whole, which only
  tokenizing past the room tells."""
  ours, theirs = loaded["bert"]
  pairs = [("a b " * 20, "c d " * 30), ("a b " * 30, "c d " * 20), ("a b " * 25, "c d " * 25)]
  features = theirs.preprocess(pairs)
  for row, want in zip(ours.tokenize(pairs), features["input_ids"].numpy()):
    np.testing.assert_array_equal(row, want)
  np.testing.assert_allclose(ours.predict(pairs), theirs.predict(pairs), rtol=0, atol=1e-5)


def test_rank_is_cross_encoders(loaded):
  ours, theirs = loaded["bert"]
  # each document once: equal scores have an order of their own in each
  query, documents = PAIRS[2][0], list(dict.fromkeys(d for _, d in PAIRS))
  want = theirs.rank(query, documents)
  got = ours.rank(query, documents)
  assert [i for i, _ in got] == [r["corpus_id"] for r in want]
  np.testing.assert_allclose([s for _, s in got], [r["score"] for r in want], rtol=0, atol=1e-5)
  assert ours.rank(query, documents, top_k=3) == got[:3]
  assert ours.rank(query, [], top_k=3) == []
  logits = ours.rank(query, documents, apply_activation=False)
  assert [i for i, _ in logits] == [i for i, _ in got]  # a sigmoid keeps the order
  np.testing.assert_allclose([s for _, s in logits], ours.predict(
      [(query, documents[i]) for i, _ in logits], apply_activation=False), rtol=0, atol=1e-6)


@pytest.mark.parametrize("prompt", [{}, {"prompt_name": "query"}, {"prompt": "a b c: "},
                                    {"prompt": ""}])
def test_a_prompt_goes_before_the_query_as_cross_encoder_puts_it(loaded, prompt):
  ours, theirs = loaded["prompt"]
  assert ours.default_prompt_name == "query"
  np.testing.assert_allclose(ours.predict(PAIRS, **prompt), theirs.predict(PAIRS, **prompt),
                             rtol=0, atol=1e-5)


def test_packing_does_not_change_a_score(folders, loaded):
  """Many pairs to a row, or one; a call of few ids, or one of all; or packed rows through the
  pure function under one's own jit: the same scores."""
  ours, _ = loaded["roberta"]
  want = ours.predict(PAIRS)
  alone = Reranker.load(folders["roberta"], max_segments=1)
  np.testing.assert_allclose(alone.predict(PAIRS), want, rtol=0, atol=1e-5)
  one_row = Reranker.load(folders["roberta"])
  np.testing.assert_allclose(one_row.predict(PAIRS, batch_tokens=MAX), want, rtol=0, atol=1e-5)
  assert {rows for rows, _ in one_row.shapes} == {1}  # a call a row
  rows = ours.pack(ours.tokenize(PAIRS), length=64)
  assert len(rows.tokens) < len(PAIRS) / 2  # several pairs a row
  out = jax.jit(ours.apply)(ours.params, rows.tokens, rows.segment_ids)
  np.testing.assert_allclose(np.asarray(out)[rows.where[:, 0], rows.where[:, 1], 0], want,
                             rtol=0, atol=1e-5)


@pytest.mark.parametrize("source,activation", [("bert", "Identity"), ("labels", "Sigmoid"),
                                               ("roberta", "Tanh")])
def test_saved_modules_make_a_cross_encoder_of_the_directory(folders, loaded, tmp_path, source,
                                                             activation):
  from sentence_transformers import CrossEncoder
  path = _hf_files(folders[source], tmp_path / "saved")
  save_cross_encoder_modules(path, 16, activation)
  theirs = CrossEncoder(path, device="cpu")
  ours = Reranker.load(path)
  assert (theirs.max_seq_length, ours.max_seq_length, ours.model.activation) == (
      16, 16, activation)
  assert type(theirs.activation_fn).__name__ == activation
  with open(os.path.join(path, "config.json")) as f:  # what sentence-transformers 4 and 5 read
    assert json.load(f)["sentence_transformers"]["activation_fn"].endswith("." + activation)
  got = ours.predict(PAIRS)
  np.testing.assert_allclose(got, theirs.predict(PAIRS), rtol=0, atol=1e-5)
  # the same model: its logits on pairs short enough not to be cut
  short = [("a b", "c d"), ("the quick", "fox"), ("0 1 2", "3 4"), ("dog", ""), ("", "lazy dog")]
  assert max(len(ids) for ids in loaded[source][0].tokenize(short)) <= 16
  np.testing.assert_allclose(ours.predict(short, apply_activation=False),
                             loaded[source][0].predict(short, apply_activation=False),
                             rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Refusals


def _copy(folders, tmp_path, name="bert") -> str:
  path = str(tmp_path / "copy")
  shutil.copytree(folders[name], path)
  return path


def _modules(path, *extra) -> None:
  with open(os.path.join(path, "modules.json"), "w") as f:
    json.dump([{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.base.modules.transformer.Transformer"},
               *({"idx": i + 1, "name": str(i + 1), "path": "", "type": t}
                 for i, t in enumerate(extra))], f)


def _write(path, name, value) -> None:
  with open(os.path.join(path, name), "w") as f:
    json.dump(value, f)


@pytest.mark.parametrize("change,file,words", [
    (lambda p: _modules(p, "sentence_transformers.cross_encoder.modules.logit_score.LogitScore"),
     "modules.json", ["LogitScore", "causal LM", "Transformer alone"]),
    (lambda p: _modules(p, "sentence_transformers.base.modules.dense.Dense"), "modules.json",
     ["module 1", "Dense", "Transformer alone"]),
    (lambda p: _edit(os.path.join(p, "config_sentence_transformers.json"),
                     model_type="SentenceTransformer"),
     "config_sentence_transformers.json", ["model_type='SentenceTransformer'", "CrossEncoder"]),
    (lambda p: os.remove(os.path.join(p, "config_sentence_transformers.json")),
     "config_sentence_transformers.json", ["model_type='SentenceTransformer'"]),
    (lambda p: _edit(os.path.join(p, "sentence_bert_config.json"),
                     transformer_task="text-generation"),
     "sentence_bert_config.json", ["transformer_task='text-generation'",
                                   "'sequence-classification'"]),
    (lambda p: os.remove(os.path.join(p, "sentence_bert_config.json")), "",
     ["no sentence_bert_config.json", "transformer_task"]),
    (lambda p: _edit(os.path.join(p, "sentence_bert_config.json"),
                     processing_kwargs={"text": {"max_length": 8}}),
     "sentence_bert_config.json", ["processing_kwargs=", "does not read"]),
    (lambda p: _edit(os.path.join(p, "config_sentence_transformers.json"),
                     activation_fn="torch.nn.modules.activation.Hardtanh"),
     "config_sentence_transformers.json", ["activation_fn=", "Hardtanh", "Sigmoid"]),
    (lambda p: _edit(os.path.join(p, "config_sentence_transformers.json"),
                     activation_fn="my_package.Scaled"),
     "config_sentence_transformers.json", ["'my_package.Scaled'", "torch.nn's"]),
    (lambda p: _edit(os.path.join(p, "config.json"), architectures=["BertForMaskedLM"]),
     "config.json", ["BertForMaskedLM", "*ForSequenceClassification"]),
    (lambda p: _edit(os.path.join(p, "config.json"),
                     id2label={"0": "a", "1": "b"}, label2id={"a": 0, "b": 1}),
     "", ["'classifier.weight'", "(2, 32)"]),
    (lambda p: _edit(os.path.join(p, "tokenizer_config.json"), tokenizer_class="MyTokenizer"),
     "tokenizer_config.json", ["tokenizer_class", "token types"]),
    (lambda p: _edit(os.path.join(p, "tokenizer_config.json"), model_input_names="input_ids"),
     "tokenizer_config.json", ["model_input_names='input_ids'", "a list"]),
    (lambda p: _edit(os.path.join(p, "config.json"), sentence_transformers="Sigmoid"),
     "config.json", ["sentence_transformers='Sigmoid'", "an object"]),
])
def test_folders_reranker_cannot_take_are_refused_naming_the_file(folders, tmp_path, change,
                                                                  file, words):
  path = _copy(folders, tmp_path)
  change(path)
  with pytest.raises(RerankerError) as e:
    Reranker.load(path)
  message = str(e.value)
  assert "\n" not in message and (os.path.join(path, file) if file else path) in message
  for word in words:
    assert word in message


def test_a_causal_lm_or_a_directory_of_nothing_is_refused(folders, tmp_path):
  path = _hf_files(folders["plain"], tmp_path / "causal")
  _edit(os.path.join(path, "config.json"), architectures=["Qwen3ForCausalLM"])
  with pytest.raises(RerankerError, match=r"config.json: architectures=\['Qwen3ForCausalLM'\], "
                                          r"expected a \*ForSequenceClassification"):
    Reranker.load(path)
  os.makedirs(tmp_path / "empty")
  with pytest.raises(RerankerError, match="neither modules.json nor config.json"):
    Reranker.load(tmp_path / "empty")


def test_arguments_reranker_cannot_take_are_refused(loaded):
  ours, labels = loaded["bert"][0], loaded["labels"][0]
  for pairs, words in [("a text", "pairs: a str"), ([("a", "b"), "c d"], "pairs[1]: 'c d'"),
                       ([("a", "b", "c")], "pairs[0]"), ([("a", 3)], "pairs[0]"),
                       (["a", "b"], "one pair: [(query, document)]")]:
    with pytest.raises(RerankerError, match=r"expected a|expected a list") as e:
      ours.predict(pairs)
    assert words in str(e.value)
  with pytest.raises(RerankerError, match="batch_tokens=0, expected an integer >= 1"):
    ours.predict(PAIRS, batch_tokens=0)
  with pytest.raises(RerankerError, match="prompt_name='nope', expected one of"):
    ours.predict(PAIRS, prompt_name="nope")
  with pytest.raises(RerankerError, match="the model has 3 labels, expected 1"):
    labels.rank("a", ["b"])
  with pytest.raises(RerankerError, match="top_k=-1, expected an integer >= 0 or None"):
    ours.rank("a", ["b"], top_k=-1)
  with pytest.raises(RerankerError, match="query: a list, expected a str"):
    ours.rank(["a"], ["b"])
  with pytest.raises(RerankerError, match="documents: a str, expected a list"):
    ours.rank("a", "b")
  assert ours.predict([]).shape == (0,) and labels.predict([]).shape == (0, 3)


def test_saving_what_cross_encoder_cannot_load_is_refused(folders, tmp_path):
  path = _hf_files(folders["plain"], tmp_path / "saved")
  with pytest.raises(RerankerError, match="activation='Hardtanh', expected one of"):
    save_cross_encoder_modules(path, 16, "Hardtanh")
  with pytest.raises(RerankerError, match="max_length=2, expected an integer >= 3"):
    save_cross_encoder_modules(path, 2)
  _edit(os.path.join(path, "config.json"), architectures=["RobertaForMaskedLM"])
  with pytest.raises(RerankerError, match="RobertaForMaskedLM.*ForSequenceClassification"):
    save_cross_encoder_modules(path, 16)
  assert not os.path.exists(os.path.join(path, "modules.json"))


@pytest.mark.filterwarnings("ignore:Implicit dimension choice")  # Softmax(), as CrossEncoder's
def test_the_activations_are_torchs():
  torch = pytest.importorskip("torch")
  x = np.linspace(-4, 4, 12, dtype=np.float32).reshape(4, 3)
  from flax_encoder.activations import torch_class
  for name in cross_encoder.ACTIVATIONS:
    fn = torch_class(name)
    want = getattr(torch.nn, name)()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(fn(x)), want, rtol=0, atol=1e-6, err_msg=name)
