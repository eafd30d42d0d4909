"""flax_encoder.multi_vector: sentence-transformers 6 MultiVectorEncoder folders, saved here by
sentence-transformers itself around tiny random BERT and RoBERTa models (hidden 32, 2 layers),
give the token vectors `encode_query` and `encode_document` give, packed many texts to a row,
and MaxSim scores equal to `MultiVectorEncoder.similarity`'s; a folder written back loads in
sentence-transformers as the same model."""

import dataclasses
import json
import os
import shutil
import string

import jax
import numpy as np
import pytest

from flax_encoder.embeddings import Dense, EmbeddingError
from flax_encoder.multi_vector import (EMPTY_DOCUMENT_SCORE, Expansion, MultiVectorEncoder,
                                       MultiVectorError, MultiVectorModel, ScoringMask, maxsim,
                                       maxsim_pairwise, save_multi_vector)
from tests.opens import assert_a_load_opens_each_file_once
from tests.test_hostile_inputs import LITERAL_SPECIALS

MAX_SEQ = 24  # ids a text is cut to where a side sets no length: many texts are longer
WORDS = ("the quick brown fox jumps over lazy dog 0 1 2 3 4 5 6 7 8 9 0123 4567 89 a b c d e f g "
         "h i j abcd efgh ij + - * / = < > ! ? % +-*/ =<>!").split()


def _texts() -> list[str]:
  """Texts of 0 to 34 words (of those the tokenizers were trained on; punctuation among them),
  some with characters the tokenizers never saw."""
  rng = np.random.default_rng(0)
  texts = [" ".join(rng.choice(WORDS, n)) for n in (1, 2, 3, 5, 8, 13, 21, 34, 4, 6, 9)]
  return texts + ["", "Zürich ☃ naïve", "dog", "THE QUICK Brown fox ! ?", *LITERAL_SPECIALS]


TEXTS = _texts()
SIDES = ("query", "document", None)


def _save(path, transformer_dir, transformer=None, denses=((32, 16, False, None),), mask=None,
          **options) -> str:
  """A MultiVectorEncoder folder at `path`, as sentence-transformers saves it: the Transformer of
  `transformer_dir` cut to MAX_SEQ ids (its `transformer` settings: query_length,
  query_expansion …), a token-level Dense per (in, out, bias, activation) of `denses`, a
  MultiVectorMask of `mask`, a token-level Normalize."""
  import torch
  from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder
  from sentence_transformers.base.modules import Dense, Normalize, Transformer
  from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
  modules = [Transformer(transformer_dir, max_seq_length=MAX_SEQ, **(transformer or {}))]
  for width, out, bias, activation in denses:
    modules.append(Dense(width, out, bias=bias, activation_function=activation or
                         torch.nn.Identity(), module_input_name="token_embeddings"))
  modules += [MultiVectorMask(**(mask or {})), Normalize(module_input_name="token_embeddings")]
  STMultiVectorEncoder(modules=modules, device="cpu", **options).save(str(path))
  return str(path)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """name -> (a MultiVectorEncoder folder, the Hugging Face directory of its Transformer)."""
  pytest.importorskip("torch", reason="sentence-transformers saves the folders")
  pytest.importorskip("sentence_transformers")
  import torch
  from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

  from tests import hf_models
  root = tmp_path_factory.mktemp("mv")
  bert = hf_models.write(root / "bert", "bert", head="base")
  roberta = hf_models.write(root / "roberta", "roberta", head="base", seed=1)
  torch.manual_seed(0)
  # what MultiVectorEncoder(hf_dir) makes: a Dense of 128, no prompts, no expansion
  STMultiVectorEncoder(bert, device="cpu").save(str(root / "default"))
  punctuation = {"skiplist_words": list(string.punctuation)}
  out = {
      "default": str(root / "default"),
      # ColBERT's prefixes as text; the default prompt, which encode_query and encode_document
      # pass over (they take "query" and "document")
      "prompts": _save(root / "prompts", bert, prompts={
          "query": "[Q] ", "document": "[D] ", "other": "x y: "}, default_prompt_name="other"),
      # classic ColBERT: queries of 16 ids, the encoder not attending to the [MASK]s; documents
      # cut to 12 ids, their punctuation not scored
      "expansion": _save(root / "expansion", bert, transformer={
          "document_length": 12, "query_expansion": {"strategy": "fixed", "length": 16}},
          mask=punctuation, prompts={"query": "q: ", "document": "d: "}),
      # expansion up to 12 ids only, attended to; queries cut to 20; a Dense of tanh with a bias
      # before the projection; scores averaged over the query's tokens
      "attend": _save(root / "attend", bert, transformer={
          "query_length": 20, "query_expansion": {"strategy": "min", "length": 12,
                                                  "attend": True}},
          denses=((32, 24, True, torch.nn.Tanh()), (24, 16, False, None)),
          similarity_fn_name="meanmaxsim"),
      # RoBERTa's <mask> and positions; the skiplist on both sides, documents scored only on
      # the even ids
      "roberta": _save(root / "roberta-mv", roberta, transformer={
          "query_expansion": {"strategy": "fixed", "length": 16}},
          mask={**punctuation, "skiplist_tasks": ["query", "document"],
                "keep_only_token_ids": list(range(0, 300, 2))}),
  }
  return {name: (path, roberta if name == "roberta" else bert) for name, path in out.items()}


@pytest.fixture(scope="module")
def loaded(folders):
  """name -> (MultiVectorEncoder, sentence-transformers' MultiVectorEncoder) of each folder."""
  from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder
  return {name: (MultiVectorEncoder.load(path), STMultiVectorEncoder(path, device="cpu"))
          for name, (path, _) in folders.items()}


def _encode(model, side, texts):
  """`side`'s vectors of `texts` by either encoder (numpy arrays)."""
  method = {"query": "encode_query", "document": "encode_document", None: "encode"}[side]
  out = getattr(model, method)(texts, **({} if isinstance(model, MultiVectorEncoder) else
                                          {"convert_to_numpy": True}))
  return [np.asarray(v) for v in out]


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", ["default", "prompts", "expansion", "attend", "roberta"])
def test_the_token_vectors_are_sentence_transformers(loaded, name, side):
  ours, theirs = loaded[name]
  got, want = _encode(ours, side, TEXTS), _encode(theirs, side, TEXTS)
  assert [v.shape for v in got] == [v.shape for v in want]
  assert all(v.dtype == np.float32 and v.shape[1] == ours.dim for v in got)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["expansion", "attend", "roberta"])
def test_the_scores_are_sentence_transformers_similarity(loaded, name):
  ours, theirs = loaded[name]
  queries, documents = ours.encode_query(TEXTS[:9]), ours.encode_document(TEXTS)
  their_queries = theirs.encode_query(TEXTS[:9])
  their_documents = theirs.encode_document(TEXTS)
  want = theirs.similarity(their_queries, their_documents).numpy()
  np.testing.assert_allclose(ours.similarity(queries, documents), want, rtol=1e-5, atol=1e-5)
  # the same vectors, scored by both: only the scoring differs
  as_numpy = lambda vectors: [v.numpy() for v in vectors]
  np.testing.assert_allclose(
      ours.similarity(as_numpy(their_queries), as_numpy(their_documents)), want, rtol=1e-6,
      atol=1e-6)
  pairs = theirs.similarity_pairwise(their_queries, their_documents[:9]).numpy()
  np.testing.assert_allclose(ours.similarity_pairwise(queries, documents[:9]), pairs,
                             rtol=1e-5, atol=1e-5)


def test_maxsim_is_the_sum_over_query_tokens_of_the_best_document_token():
  rng = np.random.default_rng(1)
  queries = rng.normal(size=(2, 3, 4)).astype(np.float32)
  documents = rng.normal(size=(3, 5, 4)).astype(np.float32)
  query_mask = np.array([[1, 1, 0], [1, 1, 1]], bool)
  document_mask = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], bool)
  # the masked tokens would win every max: they must not count
  documents[~document_mask] = 100.0
  want = np.zeros((2, 3), np.float32)
  for i in range(2):
    for j in range(3):
      tokens = documents[j][document_mask[j]]
      want[i, j] = sum(max(q @ d for d in tokens) for q in queries[i][query_mask[i]]) if len(
          tokens) else EMPTY_DOCUMENT_SCORE
  got = jax.jit(maxsim)(queries, query_mask, documents, document_mask)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert want[0, 1] < 0 or want[1, 1] < 0  # a negative best product stays negative, not 0
  mean = jax.jit(maxsim, static_argnames="mean")(queries, query_mask, documents, document_mask,
                                                 mean=True)
  np.testing.assert_allclose(mean, want / query_mask.sum(1)[:, None], rtol=1e-6)
  pairs = jax.jit(maxsim_pairwise)(queries, query_mask, documents[:2], document_mask[:2])
  np.testing.assert_allclose(pairs, np.diag(want[:, :2]), rtol=1e-6)


def test_a_load_opens_each_file_of_the_folder_once(folders):
  """A load reads the folder's files through one FolderFiles: modules.json, the modules'
  config.json, the settings and the tokenizer's options each opened once (or looked for once,
  where absent)."""
  for name in ("expansion", "attend"):
    assert_a_load_opens_each_file_once(MultiVectorEncoder.load, folders[name][0])


def test_what_the_folders_say_is_read(loaded):
  default, prompts, expansion, attend, roberta = (
      loaded[n][0] for n in ("default", "prompts", "expansion", "attend", "roberta"))
  assert (default.dim, default.model.expansion, default.model.mask) == (128, None, ScoringMask())
  assert prompts.prompts["query"] == "[Q] " and prompts.default_prompt_name == "other"
  assert expansion.model.expansion == Expansion(16, "fixed", attend=False)
  assert expansion.lengths == {None: MAX_SEQ, "query": 16, "document": 12}
  assert attend.model.expansion == Expansion(12, "min", attend=True)
  # "min" cuts queries to the larger of query_length and the expansion's length
  assert attend.lengths == {None: MAX_SEQ, "query": 20, "document": MAX_SEQ}
  assert [type(s).__name__ for s in attend.model.steps] == ["Dense", "Dense", "Normalize"]
  assert (attend.similarity_fn_name, expansion.similarity_fn_name) == ("meanmaxsim", "maxsim")
  # the skiplist's single-token words only (sentence-transformers drops the others)
  calls = expansion.task_calls
  assert calls["query"].skip_ids == () and len(calls["document"].skip_ids) > 5
  assert calls["document"] == calls[None]
  assert calls["query"].expansion_id == 4 and not calls["query"].attend  # [MASK]
  assert roberta.task_calls["query"].skip_ids == roberta.task_calls["document"].skip_ids != ()
  assert roberta.task_calls["query"].keep_ids is None
  assert roberta.task_calls["document"].keep_ids == tuple(range(0, 300, 2))
  assert all(len(v) == 16 for v in expansion.encode_query(TEXTS))  # every query expanded


def test_whether_the_encoder_attends_to_the_expansion_matters(loaded):
  """The same weights with the expansion attended to give other vectors: the parity above
  checks the mask that keeps them out of the keys."""
  ours, _ = loaded["expansion"]
  model = dataclasses.replace(ours.model, expansion=Expansion(16, "fixed", attend=True))
  other = MultiVectorEncoder(model, ours.params, ours.tokenizer, ours.max_seq_length,
                             ours.prompts, expansion_id=4,
                             skip_ids=ours.task_calls["document"].skip_ids)
  texts = TEXTS[:4]
  for a, b in zip(ours.encode_query(texts), other.encode_query(texts)):
    assert a.shape == b.shape and np.abs(a - b).max() > 1e-3
  for a, b in zip(ours.encode_document(texts), other.encode_document(texts)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_expanded_queries_packed_to_a_row_are_sentence_transformers(loaded, folders,
                                                                   monkeypatch):
  """Rows of 64 ids hold four expanded queries of 16 (those of 24 above, one each)."""
  _, theirs = loaded["expansion"]
  ours = MultiVectorEncoder.load(folders["expansion"][0], row_lengths=(64,))
  texts_a_row = []
  encode = MultiVectorEncoder._encode

  def counting(self, tokens, segment_ids, *args):
    texts_a_row.append(int(np.asarray(segment_ids).max()))
    return encode(self, tokens, segment_ids, *args)

  monkeypatch.setattr(MultiVectorEncoder, "_encode", counting)
  for side in ("query", "document"):
    for a, b in zip(_encode(ours, side, TEXTS), _encode(theirs, side, TEXTS)):
      np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    assert max(texts_a_row) == 4 if side == "query" else max(texts_a_row) > 4


def _hf_copy(hf_dir, out) -> str:
  shutil.copytree(hf_dir, out)
  return str(out)


@pytest.mark.parametrize("name", ["expansion", "attend", "roberta", "prompts"])
def test_a_folder_written_back_is_the_same_model_to_both(loaded, folders, name, tmp_path):
  from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder
  ours, theirs = loaded[name]
  out = _hf_copy(folders[name][1], tmp_path / "written")
  save_multi_vector(out, ours.model, ours.params, ours.prompts, ours.default_prompt_name,
                    ours.similarity_fn_name, max_seq_length=ours.max_seq_length)
  again = STMultiVectorEncoder(out, device="cpu")
  for side in SIDES:
    for a, b in zip(_encode(again, side, TEXTS), _encode(theirs, side, TEXTS)):
      np.testing.assert_allclose(a, b, atol=1e-6)
  assert (again.similarity_fn_name, again.prompts, again.default_prompt_name) == (
      theirs.similarity_fn_name, theirs.prompts, theirs.default_prompt_name)
  reread = MultiVectorEncoder.load(out)
  assert reread.model == ours.model and reread.lengths == ours.lengths
  assert reread.task_calls == ours.task_calls


# ---------------------------------------------------------------------------------------------
# Refusals: one line, naming the file or argument


def _edit(folder, name, change) -> None:
  """The JSON file `name` of `folder` changed by `change` (value -> value; None: removed)."""
  file = os.path.join(folder, name)
  with open(file) as f:
    value = json.load(f)
  value = change(value)
  if value is None:
    os.remove(file)
    return
  with open(file, "w") as f:
    json.dump(value, f)


def _set(**items):
  return lambda config: {**config, **items}


def _without(*keys):
  return lambda config: {k: v for k, v in config.items() if k not in keys}


def _expansion(**items):
  return lambda c: {**c, "query_expansion": {**c["query_expansion"], **items}}


POOLING = {"idx": 4, "name": "4", "path": "", "type": "sentence_transformers.models.Pooling"}


@pytest.mark.parametrize("name, change, named", [
    ("config_sentence_transformers.json", _set(model_type="ColBERT"),
     r"config_sentence_transformers.json: model_type='ColBERT', a PyLate 3 save"),
    ("config_sentence_transformers.json", _without("model_type"),
     r"config_sentence_transformers.json: model_type=None, expected 'MultiVectorEncoder'"),
    ("config_sentence_transformers.json", _set(query_prefix="[unused0]", skiplist_words=[]),
     r"config_sentence_transformers.json: query_prefix, skiplist_words: PyLate's settings"),
    ("config_sentence_transformers.json", _set(prompts={"query": 3}),
     r"config_sentence_transformers.json: prompts=\{'query': 3\}, expected"),
    ("modules.json", lambda m: m + [POOLING],
     r"modules.json: module 4 is of type 'sentence_transformers.models.Pooling'"),
    ("modules.json", lambda m: [x for x in m if "Mask" not in x["type"]],
     r"modules.json: 0 MultiVectorMask modules, expected one"),
    ("1_Dense/config.json", _set(module_input_name="sentence_embedding"),
     r"1_Dense/config.json: module_input_name='sentence_embedding', expected 'token_embeddings'"),
    ("3_Normalize/config.json", lambda c: None,
     r"3_Normalize/config.json: module_input_name=None, expected 'token_embeddings'"),
    ("2_MultiVectorMask/config.json", _set(skiplist_words="!?"),
     r"2_MultiVectorMask/config.json: skiplist_words='!\?', expected a list of strings"),
    ("2_MultiVectorMask/config.json", _set(keep_only_token_ids=[-1]),
     r"2_MultiVectorMask/config.json: keep_only_token_ids=\(-1,\), expected a list of token"),
    ("2_MultiVectorMask/config.json", _set(pool_factor=2),
     r"2_MultiVectorMask/config.json: keys \['pool_factor'\], expected only"),
    ("sentence_bert_config.json", _set(transformer_task="fill-mask"),
     r"sentence_bert_config.json: transformer_task='fill-mask', expected 'feature-extraction'"),
    ("sentence_bert_config.json", _set(processing_kwargs={"text": {"max_length": 8}}),
     r"sentence_bert_config.json: processing_kwargs=.*expected none"),
    ("sentence_bert_config.json", _expansion(strategy="always"),
     r"sentence_bert_config.json: query_expansion strategy='always', expected one of"),
    ("sentence_bert_config.json", _expansion(pad=True),
     r"sentence_bert_config.json: query_expansion=.*expected an object of strategy"),
    ("sentence_bert_config.json", _expansion(length=1000),
     r"sentence_bert_config.json: query_expansion length=1000: longer than the encoder's"),
    ("sentence_bert_config.json", _set(query_length=8),
     r"sentence_bert_config.json: query_length=8 is below query_expansion length=16"),
    ("sentence_bert_config.json", _set(document_length=0),
     r"sentence_bert_config.json: document_length=0, expected an integer >= 3"),
    ("sentence_bert_config.json", _expansion(token="[NOPE]"),
     r"query_expansion token='\[NOPE\]' is not in the tokenizer's vocabulary"),
    ("tokenizer_config.json", _without("mask_token", "eos_token"),
     r"names no mask_token or eos_token, expected one"),
    ("modules.json", lambda m: None, r"no modules.json, expected a MultiVectorEncoder's folder"),
])
def test_a_folder_it_does_not_read_is_refused(folders, tmp_path, name, change, named):
  folder = str(tmp_path / "folder")
  shutil.copytree(folders["expansion"][0], folder)
  _edit(folder, name, change)
  with pytest.raises(MultiVectorError, match=named) as e:
    MultiVectorEncoder.load(folder)
  assert "\n" not in str(e.value) and isinstance(e.value, EmbeddingError)
  if name != "tokenizer_config.json" and "token=" not in named:
    assert name.split("/")[0] in str(e.value)  # the file it comes of


@pytest.mark.parametrize("call, named", [
    (lambda m: m.encode(["a"], task="passage"), r"task='passage', expected one of"),
    (lambda m: m.encode_query(["a", 3]), r"texts\[1\]: a int, expected a str"),
    (lambda m: m.encode_document(["a"], batch_tokens=0), r"batch_tokens=0, expected an integer"),
    (lambda m: m.encode_query(["a"], prompt="q: ", prompt_name="query"),
     r"prompt='q: ' and prompt_name='query'"),
    (lambda m: m.encode_query(["a"], prompt_name="passage"), r"prompt_name='passage', expected"),
    (lambda m: m.similarity([np.zeros((2, 16))], [np.zeros((3, 8))]),
     r"query vectors of width 16 and document vectors of width 8"),
    (lambda m: m.similarity(np.zeros((2, 3, 16)), [np.zeros((3, 16))]),
     r"queries: an array of shape \(2, 3, 16\), expected a list"),
    (lambda m: m.similarity([np.zeros((2, 16)), np.zeros((2, 8))], [np.zeros((3, 16))]),
     r"queries\[1\]: shape \(2, 8\), expected \[tokens, 16\]"),
    (lambda m: m.similarity_pairwise([np.zeros((2, 16))], []), r"1 queries and 0 documents"),
])
def test_bad_arguments_are_refused(loaded, call, named):
  ours, _ = loaded["expansion"]
  with pytest.raises(MultiVectorError, match=named) as e:
    call(ours)
  assert "\n" not in str(e.value)


def test_what_cannot_be_written_is_refused(loaded, folders, tmp_path):
  ours, _ = loaded["expansion"]
  out = _hf_copy(folders["expansion"][1], tmp_path / "out")
  config = ours.model.config
  for call, named in [
      (lambda: save_multi_vector(out, ours.model, ours.params, similarity="cosine"),
       r"similarity='cosine', expected one of \('maxsim', 'meanmaxsim'\)"),
      (lambda: save_multi_vector(out, ours.model, {"encoder": ours.params["encoder"]}),
       r"params: no 'dense_0', expected the weights of model.steps\[0\]"),
      (lambda: save_multi_vector(out, ours.model, ours.params, {"query": "q: "}, "document"),
       r"default_prompt_name='document', expected one of the prompts' names \['query'\]"),
      (lambda: save_multi_vector(tmp_path, ours.model, ours.params),
       r"no config.json, expected a Hugging Face model directory"),
      (lambda: MultiVectorModel(config, (Dense(24, 16, activation="Identity"),)),
       r"steps\[0\]: a Dense of in_features=24, expected the width before it, 32"),
      (lambda: MultiVectorModel(config, query_length=8, expansion=Expansion(16)),
       r"query_length=8 is below query_expansion length=16"),
      (lambda: Expansion(16, "longest"), r"query_expansion strategy='longest', expected one of"),
      (lambda: ScoringMask(skiplist_words=["!", 3]),
       r"skiplist_words=\('!', 3\), expected a list of strings"),
  ]:
    with pytest.raises(MultiVectorError, match=named):
      call()
  assert not os.path.exists(os.path.join(out, "modules.json"))  # nothing written on refusal
