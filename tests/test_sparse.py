"""flax_encoder.sparse: SparseEncoder folders, saved here by sentence-transformers itself around
tiny random *ForMaskedLM models (BERT, RoBERTa, DistilBERT, ModernBERT, ALBERT, EuroBERT,
DeBERTa-v2; hidden 32), compute what `SparseEncoder(folder).encode` computes: the same values,
the same active dimensions, packed many texts to a row; the Router of an inference-free model
too; and folders written by `save_splade` load in sentence-transformers."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from flax_encoder import embeddings, modules_json, packing, sparse
from flax_encoder.embeddings import EmbeddingError
from flax_encoder.sparse import SparseEncoder, SparseError, SparseVectors, save_splade
from tests.opens import assert_a_load_opens_each_file_once
from tests.test_hostile_inputs import LITERAL_SPECIALS

MAX_SEQ = 24  # ids a text is cut to: several of TEXTS are longer
WORDS = ("the quick brown fox jumps over lazy dog 0 1 2 3 4 5 6 7 8 9 0123 4567 89 a b c d e f g "
         "h i j abcd efgh ij + - * / = < > ! ? % +-*/ =<>!").split()


def _texts() -> list[str]:
  """Texts of 1 to 40 words (tests/hf_models' tokenizers were trained on them), the empty
  text, and characters the tokenizers never saw."""
  rng = np.random.default_rng(0)
  texts = [" ".join(rng.choice(WORDS, n)) for n in (1, 2, 3, 5, 8, 13, 21, 34, 40, 4, 6, 9)]
  return texts + ["", "Zürich ☃ naïve", "dog", "THE QUICK Brown fox", *LITERAL_SPECIALS]


TEXTS = _texts()
# name -> (family, pooling_strategy, activation_function) of the folders compared
SPLADE = {"bert-max-relu": ("bert", "max", "relu"), "bert-sum-log1p": ("bert", "sum", "log1p_relu"),
          "roberta": ("roberta", "max", "log1p_relu"), "distilbert": ("distilbert", "sum", "relu"),
          "modernbert": ("modernbert", "max", "relu"), "albert": ("albert", "sum", "log1p_relu"),
          "eurobert": ("eurobert", "max", "log1p_relu"), "deberta": ("deberta-v2", "max", "relu")}


def _save(path, hf_dir, pooling, activation, **options) -> str:
  """A SparseEncoder folder at `path`: `hf_dir` as a fill-mask Transformer cut to MAX_SEQ ids,
  then SpladePooling, as SparseEncoder.save writes it."""
  from sentence_transformers import SparseEncoder as STSparseEncoder
  from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer
  modules = [Transformer(hf_dir, transformer_task="fill-mask", max_seq_length=MAX_SEQ),
             SpladePooling(pooling, activation)]
  STSparseEncoder(modules=modules, device="cpu", **options).save(str(path))
  return str(path)


def _write(folder, name, value) -> None:
  with open(os.path.join(folder, name), "w") as f:
    json.dump(value, f)


def _edited(folder, to, name, **changes) -> str:
  """A copy of `folder` at `to` whose JSON file `name` has `changes`."""
  shutil.copytree(folder, to)
  with open(os.path.join(to, name)) as f:
    value = json.load(f)
  _write(to, name, {**value, **changes})
  return str(to)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
  """family -> a tiny random *ForMaskedLM directory."""
  pytest.importorskip("torch", reason="sentence-transformers saves the folders")
  pytest.importorskip("sentence_transformers")
  from tests import hf_models
  root = tmp_path_factory.mktemp("hf")
  return {family: hf_models.write(root / family, family, head="masked_lm", seed=i)
          for i, family in enumerate(sorted({f for f, _, _ in SPLADE.values()}))}


@pytest.fixture(scope="module")
def folders(hf_dirs, tmp_path_factory):
  """name -> a SparseEncoder folder."""
  import torch
  from sentence_transformers import SparseEncoder as STSparseEncoder
  from sentence_transformers.sparse_encoder.modules import (Router, SparseStaticEmbedding,
                                                            SpladePooling, Transformer)
  root = tmp_path_factory.mktemp("sparse")
  out = {name: _save(root / name, hf_dirs[family], pooling, activation)
         for name, (family, pooling, activation) in SPLADE.items()}
  out["prompt"] = _save(root / "prompt", hf_dirs["bert"], "max", "relu",
                        prompts={"query": "the query: ", "document": "a b c: ", "other": "x: "},
                        default_prompt_name="other")
  out["max_active_dims"] = _save(root / "max_active_dims", hf_dirs["bert"], "sum", "relu",
                                 max_active_dims=5, similarity_fn_name="cosine")
  # An inference-free model: queries by a weight per id (some 0), documents by SPLADE.
  document = Transformer(hf_dirs["bert"], transformer_task="fill-mask", max_seq_length=MAX_SEQ)
  torch.manual_seed(0)
  weight = torch.rand(document.tokenizer.vocab_size) * (torch.arange(
      document.tokenizer.vocab_size) % 3 != 0)
  router = Router.for_query_document(
      query_modules=[SparseStaticEmbedding(document.tokenizer, weight, frozen=True)],
      document_modules=[document, SpladePooling("max", "log1p_relu")])
  STSparseEncoder(modules=[router], prompts={"query": "q: "}, similarity_fn_name="dot",
                  device="cpu").save(str(root / "router"))
  out["router"] = str(root / "router")
  # sentence-transformers 5's layout: an MLMTransformer (here in a folder of its own, which
  # the readers take whatever modules.json says), max_seq_length in sentence_bert_config.json
  legacy = root / "legacy"
  shutil.copytree(hf_dirs["bert"], legacy / "0_MLMTransformer")
  _write(legacy / "0_MLMTransformer", "sentence_bert_config.json",
         {"max_seq_length": 12, "do_lower_case": False})
  os.makedirs(legacy / "1_SpladePooling")
  _write(legacy / "1_SpladePooling", "config.json", {
      "pooling_strategy": "sum", "activation_function": "relu", "word_embedding_dimension":
      json.load(open(os.path.join(hf_dirs["bert"], "config.json")))["vocab_size"]})
  _write(legacy, "modules.json", [
      {"idx": 0, "name": "0", "path": "0_MLMTransformer",
       "type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
      {"idx": 1, "name": "1", "path": "1_SpladePooling",
       "type": "sentence_transformers.sparse_encoder.models.SpladePooling"}])
  _write(legacy, "config_sentence_transformers.json", {"model_type": "SparseEncoder"})
  out["legacy"] = str(legacy)
  return out


@pytest.fixture(scope="module")
def loaded(folders):
  """name -> (SparseEncoder, sentence-transformers' SparseEncoder) of each folder."""
  from sentence_transformers import SparseEncoder as STSparseEncoder
  return {name: (SparseEncoder.load(path), STSparseEncoder(path, device="cpu"))
          for name, path in folders.items()}


def _dense(theirs) -> np.ndarray:
  return theirs.to_dense().numpy()


def _assert_same(got: SparseVectors, want: np.ndarray) -> None:
  """Values within 1e-5, and the same active dimensions."""
  assert isinstance(got, SparseVectors) and got.shape == want.shape
  dense = got.toarray()
  np.testing.assert_allclose(dense, want, rtol=0, atol=1e-5)
  np.testing.assert_array_equal(dense != 0, want != 0)
  np.testing.assert_array_equal(got.active, (want != 0).sum(1))


@pytest.mark.parametrize("name", [*SPLADE, "legacy"])
def test_the_vectors_are_sentence_transformers(loaded, name):
  ours, theirs = loaded[name]
  want = _dense(theirs.encode(TEXTS))
  _assert_same(ours.encode(TEXTS), want)
  assert 0 < (want != 0).sum() < want.size  # relu leaves some dimensions out, not all


def test_a_load_opens_each_file_of_the_folder_once(folders):
  """A load reads the folder's files through one FolderFiles: modules.json, the modules'
  config.json, the settings and the tokenizer's options each opened once (or looked for once,
  where absent)."""
  for name in ("bert-max-relu", "router", "legacy"):
    assert_a_load_opens_each_file_once(SparseEncoder.load, folders[name])


def test_what_the_folders_say_is_read(loaded, hf_dirs):
  for name, (family, pooling, activation) in SPLADE.items():
    ours, theirs = loaded[name]
    assert (ours.model.pooling, ours.model.activation) == (pooling, activation), name
    # sentence-transformers knows SpladePooling's width once it has encoded (until then it
    # says the hidden size): its vectors' width
    width = theirs.encode(["a"], convert_to_tensor=True).shape[-1]
    assert ours.dim == width == ours.model.config.vocab_size, name
    assert ours.max_seq_length == MAX_SEQ == theirs.max_seq_length, name
    assert ours.model.untied_decoder == (family == "eurobert")
    assert ours.similarity_fn_name == "dot" and ours.max_active_dims is None
  legacy = loaded["legacy"][0]
  assert (legacy.model.pooling, legacy.model.activation, legacy.max_seq_length) == (
      "sum", "relu", 12)
  assert max(len(i) for i in loaded["bert-max-relu"][0].tokenize(TEXTS)) == MAX_SEQ  # cut
  capped = loaded["max_active_dims"][0]
  assert (capped.max_active_dims, capped.similarity_fn_name) == (5, "cosine")


def test_a_hugging_face_masked_lm_directory_is_max_pooled_through_relu(hf_dirs):
  from sentence_transformers import SparseEncoder as STSparseEncoder
  ours = SparseEncoder.load(hf_dirs["bert"])
  assert (ours.model.pooling, ours.model.activation) == ("max", "relu")
  _assert_same(ours.encode(TEXTS), _dense(STSparseEncoder(hf_dirs["bert"],
                                                          device="cpu").encode(TEXTS)))


@pytest.mark.parametrize("call,options", [
    ("encode", {}), ("encode", {"prompt_name": "query"}), ("encode", {"prompt": "free: "}),
    ("encode_query", {}), ("encode_document", {}), ("encode_query", {"prompt_name": "other"}),
    ("encode", {"prompt": " ".join(["0123456789"] * 3)})])  # a prompt of more than MAX_SEQ ids
def test_prompts_are_sentence_transformers(loaded, call, options):
  """encode takes the default prompt ("other"); encode_query the "query" prompt and
  encode_document the "document" one, unless told another."""
  ours, theirs = loaded["prompt"]
  _assert_same(getattr(ours, call)(TEXTS, **options),
               _dense(getattr(theirs, call)(TEXTS, **options)))


def test_a_prompt_changes_the_vectors(loaded):
  ours, _ = loaded["prompt"]
  assert ours.prompts == {"query": "the query: ", "document": "a b c: ", "other": "x: "}
  plain = loaded["bert-max-relu"][0].encode(TEXTS).toarray()
  assert np.abs(ours.encode_query(TEXTS).toarray() - plain).max() > 1e-3
  # without prompts of its own, a folder's query and document prompts are empty
  assert loaded["bert-max-relu"][0].prompts == {"query": "", "document": ""}


@pytest.mark.parametrize("call", ["encode", "encode_query", "encode_document"])
def test_the_router_routes_as_sentence_transformers(loaded, call):
  """Queries by the static weights (the "q: " prompt before them, no special ids, cut at
  MAX_SEQ ids), documents and encode by SPLADE (the default route is the document's)."""
  ours, theirs = loaded["router"]
  _assert_same(getattr(ours, call)(TEXTS), _dense(getattr(theirs, call)(TEXTS)))


def test_a_static_query_holds_each_ids_weight(loaded):
  ours, _ = loaded["router"]
  static = ours.router.routes["query"]
  assert ours.router.routes["document"] is None and ours.router.default_route == "document"
  assert static.max_length == MAX_SEQ
  got = ours.encode_query(TEXTS)
  for i, text in enumerate(TEXTS):
    ids = np.unique(static.tokenizer.encode_batch(["q: " + text])[0][:MAX_SEQ])
    ids = ids[static.weights[ids] != 0]
    np.testing.assert_array_equal(got.row(i)[0], ids)
    np.testing.assert_array_equal(got.row(i)[1], static.weights[ids])
  assert np.abs(got.toarray() - ours.encode_document(TEXTS).toarray()).max() > 1e-2
  with pytest.raises(SparseError, match=r"task='image': the Router has no route"):
    ours.encode(TEXTS, task="image")


def test_top_k_keeps_the_largest_as_max_active_dims(loaded):
  ours, theirs = loaded["bert-sum-log1p"]
  got = ours.encode(TEXTS, top_k=3)
  _assert_same(got, _dense(theirs.encode(TEXTS, max_active_dims=3)))
  dense = ours.encode(TEXTS).toarray()
  ids, weights = got.top(3)
  order = np.argsort(-dense, axis=1, kind="stable")[:, :3]
  np.testing.assert_array_equal(ids, order)
  np.testing.assert_array_equal(weights, np.take_along_axis(dense, order, 1))
  ids, weights = ours.encode(TEXTS).top(ours.dim + 2)  # more than a vector has: padded
  assert (ids[:, -2:] == -1).all() and (weights[:, -2:] == 0).all()
  np.testing.assert_array_equal((ids >= 0).sum(1), (dense != 0).sum(1))


def test_the_folders_max_active_dims_and_similarity_are_sentence_transformers(loaded):
  ours, theirs = loaded["max_active_dims"]
  got, want = ours.encode(TEXTS), theirs.encode(TEXTS)
  _assert_same(got, _dense(want))
  assert got.active.max() == 5
  # cosine, by the folder's similarity_fn_name
  np.testing.assert_allclose(ours.similarity(got, got), theirs.similarity(want, want).numpy(),
                             rtol=1e-5, atol=1e-6)
  _assert_same(ours.encode(TEXTS, top_k=7), _dense(theirs.encode(TEXTS, max_active_dims=7)))


def test_the_dot_product_is_sentence_transformers(loaded):
  ours, theirs = loaded["router"]
  queries, documents = ours.encode_query(TEXTS), ours.encode_document(TEXTS)
  want = theirs.similarity(theirs.encode_query(TEXTS), theirs.encode_document(TEXTS)).numpy()
  np.testing.assert_allclose(ours.similarity(queries, documents), want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(sparse.similarity(queries.toarray(), documents),
                             queries.toarray() @ documents.toarray().T, rtol=1e-5, atol=1e-6)


def test_sparse_vectors_are_csr():
  dense = np.array([[0, 2.5, 0, -1], [0, 0, 0, 0], [3, 0, 3, 0.5]], np.float32)
  vectors = SparseVectors.from_dense(dense)
  np.testing.assert_array_equal(vectors.indptr, [0, 2, 2, 5])
  np.testing.assert_array_equal(vectors.indices, [1, 3, 0, 2, 3])
  np.testing.assert_array_equal(vectors.toarray(), dense)
  np.testing.assert_array_equal(vectors.to_scipy().toarray(), dense)
  # of equal values the lowest dimension first; by magnitude, as sentence-transformers
  np.testing.assert_array_equal(vectors.keep_largest(1).toarray(),
                                [[0, 2.5, 0, 0], [0, 0, 0, 0], [3, 0, 0, 0]])
  ids, weights = vectors.top(2)
  np.testing.assert_array_equal(ids, [[1, 3], [-1, -1], [0, 2]])
  np.testing.assert_array_equal(weights, [[2.5, -1], [0, 0], [3, 3]])
  cosine = -0.5 / np.sqrt(7.25 * 18.25)  # a vector of no active dimension scores 0
  np.testing.assert_allclose(sparse.similarity(vectors, vectors, "cosine"),
                             [[1, 0, cosine], [0, 0, 0], [cosine, 0, 1]], atol=1e-6)
  np.testing.assert_allclose(sparse.similarity(vectors, dense[:2]), dense @ dense[:2].T)


@pytest.mark.parametrize("name", ["bert-max-relu", "modernbert"])
def test_packed_texts_come_out_as_each_alone(loaded, name, monkeypatch):
  ours, _ = loaded[name]
  alone = np.stack([ours.encode([text]).toarray()[0] for text in TEXTS])
  monkeypatch.setattr(embeddings, "CHUNK_TEXTS", 5)
  packed = ours.encode(TEXTS[::-1], batch_tokens=2 * MAX_SEQ).toarray()[::-1]
  np.testing.assert_allclose(packed, alone, rtol=0, atol=2e-6)
  assert np.abs(alone[:-1] - alone[1:]).max() > 1e-2  # not all the same vector


def test_splade_in_a_jit_of_ones_own(loaded):
  ours, _ = loaded["bert-sum-log1p"]
  rows = ours.pack(ours.tokenize(TEXTS))
  out = jax.jit(ours.apply)(ours.params, rows.tokens, rows.segment_ids, rows.positions)
  assert out.shape == (len(rows.tokens), MAX_SEQ // packing.LEAST_IDS["text"], ours.dim)
  assert out.dtype == np.float32
  np.testing.assert_allclose(np.asarray(out)[rows.where[:, 0], rows.where[:, 1]],
                             ours.encode(TEXTS).toarray(), rtol=0, atol=2e-6)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_a_written_folder_loads_in_sentence_transformers(hf_dirs, tmp_path, family):
  from sentence_transformers import SparseEncoder as STSparseEncoder
  path = shutil.copytree(hf_dirs[family], tmp_path / family)
  save_splade(path, "sum", "log1p_relu", max_seq_length=MAX_SEQ,
              prompts={"query": "the query: "}, similarity="cosine")
  theirs = STSparseEncoder(str(path), device="cpu")
  assert [type(m).__name__ for m in theirs] == ["Transformer", "SpladePooling"]
  assert theirs[0].transformer_task == "fill-mask"
  assert (theirs[1].pooling_strategy, theirs[1].activation_function) == ("sum", "log1p_relu")
  assert (theirs.max_seq_length, theirs.similarity_fn_name) == (MAX_SEQ, "cosine")
  assert theirs.prompts == {"query": "the query: ", "document": ""}
  ours = SparseEncoder.load(path)
  assert (ours.model.pooling, ours.model.activation, ours.max_seq_length) == (
      "sum", "log1p_relu", MAX_SEQ)
  for call in ("encode", "encode_query"):
    _assert_same(getattr(ours, call)(TEXTS), _dense(getattr(theirs, call)(TEXTS)))


def test_a_legacy_mlm_transformer_at_the_folders_top(folders, tmp_path):
  """sentence-transformers 5 saved its MLMTransformer in the folder itself: read where
  flax_encoder.modules_json takes it for the Transformer, else refused saying what to do."""
  from sentence_transformers import SparseEncoder as STSparseEncoder
  path = tmp_path / "top"
  shutil.copytree(os.path.join(folders["legacy"], "0_MLMTransformer"), path)
  shutil.copytree(os.path.join(folders["legacy"], "1_SpladePooling"), path / "1_SpladePooling")
  shutil.copy(os.path.join(folders["legacy"], "config_sentence_transformers.json"), path)
  modules = json.load(open(os.path.join(folders["legacy"], "modules.json")))
  modules[0]["path"] = ""
  _write(path, "modules.json", modules)
  if set(sparse.MLM_TRANSFORMERS) <= set(modules_json.TRANSFORMERS):
    _assert_same(SparseEncoder.load(path).encode(TEXTS),
                 _dense(STSparseEncoder(str(path), device="cpu").encode(TEXTS)))
  else:
    with pytest.raises(SparseError, match=r"modules.json: the first module is an "
                                          r"MLMTransformer .* save it again"):
      SparseEncoder.load(path)


# ---------------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize("name,changes,message", [
    ("1_SpladePooling/config.json", {"pooling_strategy": "mean"},
     r"1_SpladePooling/config.json: pooling_strategy='mean', expected one of \('max', 'sum'\)"),
    ("1_SpladePooling/config.json", {"activation_function": "gelu"},
     r"1_SpladePooling/config.json: activation_function='gelu', expected one of"),
    ("1_SpladePooling/config.json", {"embedding_dimension": 7},
     r"1_SpladePooling/config.json: embedding_dimension=7, expected the vocabulary's size"),
    ("sentence_bert_config.json", {"transformer_task": "feature-extraction"},
     r"sentence_bert_config.json: transformer_task='feature-extraction', expected 'fill-mask'"),
    ("config_sentence_transformers.json", {"max_active_dims": 0},
     r"config_sentence_transformers.json: max_active_dims=0, expected an integer >= 1"),
    # sentence-transformers would take it for a SentenceTransformer's and append an autoencoder
    ("config_sentence_transformers.json", {"model_type": "SentenceTransformer"},
     r"config_sentence_transformers.json: model_type='SentenceTransformer', expected "
     r"'SparseEncoder'"),
])
def test_a_folders_bad_setting_is_refused(folders, tmp_path, name, changes, message):
  path = _edited(folders["bert-max-relu"], tmp_path / "bad", name, **changes)
  with pytest.raises(SparseError, match=message):
    SparseEncoder.load(path)


@pytest.mark.parametrize("modules,message", [
    (["sentence_transformers.base.modules.transformer.Transformer",
      "sentence_transformers.sparse_encoder.modules.sparse_auto_encoder.SparseAutoEncoder"],
     r"module 1 is of type '.*SparseAutoEncoder', which SparseEncoder does not compute"),
    (["sentence_transformers.base.modules.transformer.Transformer",
      "sentence_transformers.models.Pooling"],
     r"module 1 is of type 'sentence_transformers.models.Pooling', which SparseEncoder does "
     r"not"),
    (["sentence_transformers.base.modules.transformer.Transformer",
      "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling",
      "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"],
     r"modules.json: modules \['Transformer', 'SpladePooling', 'SpladePooling'\], expected a "
     r"Transformer \(fill-mask\) then SpladePooling"),
])
def test_modules_it_does_not_compute_are_refused(folders, tmp_path, modules, message):
  path = shutil.copytree(folders["bert-max-relu"], tmp_path / "bad")
  _write(path, "modules.json", [{"idx": i, "name": str(i), "path": "" if i == 0 else
                                 "1_SpladePooling", "type": t} for i, t in enumerate(modules)])
  with pytest.raises(SparseError, match=message):
    SparseEncoder.load(path)


def test_a_folder_without_its_model_type_is_refused(folders, tmp_path):
  path = shutil.copytree(folders["bert-max-relu"], tmp_path / "bad")
  os.remove(path / "config_sentence_transformers.json")
  with pytest.raises(SparseError, match=r"config_sentence_transformers.json: model_type=None "
                                        r"\(no such file\), expected 'SparseEncoder'"):
    SparseEncoder.load(path)


def test_a_routers_bad_route_is_refused(folders, tmp_path):
  path = shutil.copytree(folders["router"], tmp_path / "bad")
  config = json.load(open(path / "router_config.json"))
  config["structure"]["query"] = ["document_0_Transformer"]
  _write(path, "router_config.json", config)
  with pytest.raises(SparseError, match=r"router_config.json: route 'query' holds "
                                        r"\['Transformer'\], expected SparseStaticEmbedding"):
    SparseEncoder.load(path)
  config["structure"]["query"] = ["../elsewhere"]
  config["types"]["../elsewhere"] = config["types"]["query_0_SparseStaticEmbedding"]
  _write(path, "router_config.json", config)
  with pytest.raises(SparseError, match=r"module '../elsewhere' leads out of"):
    SparseEncoder.load(path)


def test_a_static_embedding_of_an_idf_file_is_refused(folders, tmp_path):
  path = _edited(folders["router"], tmp_path / "idf", "query_0_SparseStaticEmbedding/config.json",
                 path="idf.json")
  with pytest.raises(SparseError, match=r"config.json: path='idf.json' \(weights from an idf "
                                        r"JSON file"):
    SparseEncoder.load(path)


def test_a_model_without_a_masked_lm_head_is_refused(folders, tmp_path):
  from tests import hf_models
  base = hf_models.write(tmp_path / "base", "bert", head="base")
  with pytest.raises(SparseError, match=r"config.json: architectures=\['BertModel'\], expected "
                                        r"a \*ForMaskedLM"):
    SparseEncoder.load(base)
  with pytest.raises(SparseError, match=r"architectures=\['BertModel'\], expected a "
                                        r"\*ForMaskedLM"):
    save_splade(base)
  # a folder of sparse modules around the bare encoder
  for name in ("modules.json", "sentence_bert_config.json", "1_SpladePooling"):
    source = os.path.join(folders["bert-max-relu"], name)
    (shutil.copytree if os.path.isdir(source) else shutil.copy)(source, os.path.join(base, name))
  with pytest.raises(SparseError, match=r"base: the weights hold no masked-LM head"):
    SparseEncoder.load(base)


@pytest.mark.parametrize("options,message", [
    ({"pooling": "mean"}, r"pooling='mean', expected one of \('max', 'sum'\)"),
    ({"activation": "gelu"}, r"activation='gelu', expected one of \('relu', 'log1p_relu'\)"),
    ({"max_seq_length": 2}, r"max_seq_length=2, expected an integer >= 3 or None"),
    ({"similarity": "maxsim"}, r"similarity='maxsim', expected one of"),
    ({"prompts": {"query": 3}}, r"prompts=\{'query': 3\}, expected names to texts"),
    ({"default_prompt_name": "query"}, r"default_prompt_name='query', expected one of the "
                                       r"prompts' names"),
])
def test_save_splades_bad_arguments_are_refused(hf_dirs, tmp_path, options, message):
  path = shutil.copytree(hf_dirs["bert"], tmp_path / "out")
  with pytest.raises(SparseError, match=message):
    save_splade(path, **options)
  assert not os.path.exists(path / "modules.json")


def test_bad_arguments_are_refused(loaded):
  ours, _ = loaded["bert-max-relu"]
  for call, message in [
      (lambda: ours.encode(TEXTS, top_k=0), r"top_k=0, expected an integer >= 1"),
      (lambda: ours.encode(["a", 3]), r"texts\[1\]: a int, expected a str"),
      (lambda: ours.encode(TEXTS, batch_tokens=0), r"batch_tokens=0, expected an integer"),
      (lambda: ours.encode(TEXTS, task=3), r"task=3, expected a str"),
      (lambda: ours.encode(TEXTS).top(0), r"k=0, expected an integer >= 1"),
      (lambda: sparse.similarity(ours.encode(TEXTS), ours.encode(TEXTS), "euclidean"),
       r"similarity 'euclidean', expected one of \('dot', 'cosine'\)"),
      (lambda: sparse.similarity(ours.encode(TEXTS), np.ones((1, 3))),
       r"vectors of \d+ and of 3 dimensions"),
      (lambda: sparse.SpladeModel(ours.model.config, "mean"), r"pooling='mean', expected"),
  ]:
    with pytest.raises(SparseError, match=message):
      call()
  with pytest.raises(EmbeddingError, match=r"prompt_name='nope', expected one of"):
    ours.encode(TEXTS, prompt_name="nope")
