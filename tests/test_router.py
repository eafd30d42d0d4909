"""flax_encoder.router and a Router folder's SentenceEncoder: asymmetric sentence-transformers
folders (a query route and a document route), saved here by sentence-transformers itself around
tiny random BERT and RoBERTa models (hidden 32), compute what `SentenceTransformer(folder)`'s
encode, encode_query and encode_document compute; the routes are picked as its Router picks
them; what is not a route of a Transformer, a Pooling, Dense and Normalize is refused in one
line."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from flax_encoder import embeddings
from flax_encoder.embeddings import EmbeddingError, SentenceEncoder
from flax_encoder.router import Router, read_router
from tests.test_embeddings import MAX_SEQ, TEXTS, _write

ROUTER = "sentence_transformers.base.modules.router.Router"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """name -> a sentence-transformers folder: "shared" (one Transformer, a route's pooling of
  its own, a Dense on the document side, a Normalize after the Router, prompts),
  "separate" (a Transformer a route), "plain" (no Router, prompts)."""
  pytest.importorskip("torch", reason="sentence-transformers saves the folders")
  pytest.importorskip("sentence_transformers")
  import torch
  from sentence_transformers import SentenceTransformer
  from sentence_transformers.base.modules import Dense, Normalize, Router, Transformer
  from sentence_transformers.sentence_transformer.modules import Pooling

  from tests import hf_models
  root = tmp_path_factory.mktemp("router")
  bert = hf_models.write(root / "bert", "bert", head="base")
  roberta = hf_models.write(root / "roberta", "roberta", head="base", seed=1)
  torch.manual_seed(0)
  shared = Transformer(bert, max_seq_length=MAX_SEQ)
  router = Router.for_query_document(
      # the prompt left out of the query's pooling; the document's of another width
      query_modules=[shared, Pooling(32, pooling_mode=("cls", "mean"), include_prompt=False)],
      document_modules=[shared, Pooling(32, pooling_mode="mean"), Dense(32, 24)])
  prompts = {"query": "the query: ", "other": "x y: "}
  SentenceTransformer(modules=[router, Normalize()], prompts=prompts, default_prompt_name="other",
                      device="cpu").save(str(root / "shared"))
  router = Router.for_query_document(
      query_modules=[Transformer(roberta, max_seq_length=MAX_SEQ),
                     Pooling(32, pooling_mode="mean")],
      document_modules=[Transformer(bert, max_seq_length=MAX_SEQ),
                        Pooling(32, pooling_mode="cls"), Normalize()])
  SentenceTransformer(modules=[router], device="cpu").save(str(root / "separate"))
  SentenceTransformer(modules=[Transformer(bert, max_seq_length=MAX_SEQ),
                               Pooling(32, pooling_mode="mean", include_prompt=False)],
                      prompts=prompts, default_prompt_name="other",
                      device="cpu").save(str(root / "plain"))
  return {name: str(root / name) for name in ("shared", "separate", "plain")}


@pytest.fixture(scope="module")
def loaded(folders):
  """name -> (SentenceEncoder, SentenceTransformer) of each folder."""
  from sentence_transformers import SentenceTransformer
  return {name: (SentenceEncoder.load(path), SentenceTransformer(path, device="cpu"))
          for name, path in folders.items()}


def _copy(folders, name, tmp_path) -> str:
  return str(shutil.copytree(folders[name], tmp_path / name))


def _edit_router(folder, **changes) -> dict:
  """router_config.json of `folder` with `changes` (top-level keys or, by their name,
  parameters), written back."""
  file = os.path.join(folder, "router_config.json")
  with open(file) as f:
    config = json.load(f)
  for key, value in changes.items():
    (config if key in ("types", "structure") else config["parameters"])[key] = value
  _write(folder, "router_config.json", config)
  return config


# ---------------------------------------------------------------------------------------------
# The vectors


CALLS = [("encode", {}), ("encode", {"task": "query"}), ("encode", {"task": "document"}),
         ("encode_query", {}), ("encode_document", {}), ("encode_document", {"prompt": "a b: "})]
PROMPTED = [("encode_query", {"prompt_name": "other"}), ("encode", {"prompt_name": "query"})]


@pytest.mark.parametrize("name, call, kwargs", [
    *((name, call, kwargs) for name in ("shared", "separate", "plain") for call, kwargs in CALLS),
    *(("shared", call, kwargs) for call, kwargs in PROMPTED),
    *(("plain", call, kwargs) for call, kwargs in PROMPTED)])
def test_the_vectors_are_sentence_transformers(loaded, name, call, kwargs):
  """Each call (the route of its task, its prompt: the folder's query prompt, "" for documents
  where the folder has no document prompt, the default prompt only in encode) is
  sentence-transformers'."""
  ours, theirs = loaded[name]
  got = (ours if call == "encode" else getattr(ours, call))(TEXTS, **kwargs)
  want = getattr(theirs, call)(TEXTS, **kwargs)
  assert got.dtype == np.float32 and got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_the_routes_differ_and_are_read(loaded):
  ours, _ = loaded["shared"]
  query, document = ours.router.routes["query"], ours.router.routes["document"]
  assert ours.router.default_route == "document" and ours.model == document.model
  assert (query.dim, document.dim, ours.dim) == (64, 24, 24)
  assert query.model.pooling == embeddings.Pooling(("cls", "mean"), include_prompt=False)
  assert [type(s).__name__ for s in document.model.steps] == ["Dense", "Normalize"]
  assert [type(s).__name__ for s in query.model.steps] == ["Normalize"]  # after the Router
  # one Transformer folder: its weights read and placed once, shared by both routes
  assert all(a is b for a, b in zip(jax.tree.leaves(query.params["encoder"]),
                                    jax.tree.leaves(document.params["encoder"])))
  separate, _ = loaded["separate"]
  assert separate.router.routes["query"].model.config != separate.router.routes[
      "document"].model.config
  # the folder's prompts are the router's; encode_query never takes the default prompt
  assert ours.prompts == {"query": "the query: ", "other": "x y: ", "document": ""}
  assert ours.default_prompt_name == "other"
  plain, _ = loaded["plain"]
  np.testing.assert_array_equal(plain.encode_document(TEXTS[:3]), plain(TEXTS[:3], prompt=""))
  assert np.abs(plain.encode_query(TEXTS[:3]) - plain(TEXTS[:3], prompt="")).max() > 1e-3


def test_a_text_alone_and_other_devices_route_alike(loaded):
  ours, _ = loaded["shared"]
  want = ours.encode_query(TEXTS)
  np.testing.assert_allclose(ours.encode_query(TEXTS[3]), want[3], rtol=0, atol=2e-6)
  moved = ours.on_devices(jax.local_devices()[:1])
  assert moved.router.routes["query"] is not ours.router.routes["query"]
  np.testing.assert_allclose(moved.encode_query(TEXTS), want, rtol=0, atol=2e-6)


# ---------------------------------------------------------------------------------------------
# Picking the route


def test_routes_are_picked_as_sentence_transformers_picks_them(tmp_path):
  """route_mappings of (task, modality), a route named for the task, the default route;
  without a default, a text without a task has no route; as Router._resolve_route."""
  pytest.importorskip("torch", reason="sentence-transformers' side of the comparison")
  pytest.importorskip("sentence_transformers")
  from sentence_transformers.base.modules import Normalize
  from sentence_transformers.base.modules import Router as STRouter
  cases = [
      dict(default_route=None, route_mappings={("query", "text"): "short", (None, None): "long"}),
      dict(default_route=None, route_mappings={("query", None): "long", (None, "image"): "a"}),
      dict(default_route="long", route_mappings={(None, "text"): "a"}),
      dict(default_route="a"), dict(default_route=None), dict(default_route=None,
                                                             allow_empty_key=False)]
  for i, case in enumerate(cases):
    theirs = STRouter({name: [Normalize()] for name in ("a", "query", "short", "long")}, **case)
    theirs.eval()
    theirs.save(str(tmp_path / str(i)))
    ours = read_router(str(tmp_path / str(i)), EmbeddingError)
    for task in (None, "query", "document", "a", "image"):
      try:
        want = theirs._resolve_route(task=task, modality="text")
      except ValueError:
        with pytest.raises(EmbeddingError, match=rf"task={task!r}: the Router has no route"):
          ours.resolve(task)
      else:
        assert ours.resolve(task) == want, (case, task)


def test_a_route_named_text_takes_any_task():
  router = Router({"text": 1, "image": 2}, None, {}, EmbeddingError)
  assert router.resolve("query") == router.resolve(None) == "text"
  assert router.with_routes({"text": 3, "image": 4}).routes["text"] == 3


# ---------------------------------------------------------------------------------------------
# Refusals


def _refused(folder, pattern: str, call=SentenceEncoder.load):
  with pytest.raises(EmbeddingError, match=pattern) as e:
    call(folder)
  assert "\n" not in str(e.value)


def test_a_static_embedding_route_is_refused(folders, tmp_path):
  folder = _copy(folders, "shared", tmp_path)
  static = "sentence_transformers.sentence_transformer.modules.static_embedding.StaticEmbedding"
  os.makedirs(os.path.join(folder, "query_0_StaticEmbedding"))
  types = json.load(open(os.path.join(folder, "router_config.json")))["types"]
  _edit_router(folder, types={**types, "query_0_StaticEmbedding": static},
               structure={"query": ["query_0_StaticEmbedding"],
                          "document": ["query_0_Transformer", "document_1_Pooling"]})
  _refused(folder, r"router_config.json: module 'query_0_StaticEmbedding' \(route 'query'\) is "
                   r"of type '.*StaticEmbedding', which SentenceEncoder does not compute")


@pytest.mark.parametrize("edit, named", [
    (dict(structure={"query": ["query_0_Transformer"],
                     "document": ["query_0_Transformer", "document_1_Pooling"]}),
     r"route 'query' runs \['Transformer', 'Normalize'\] \(its own, then modules.json's after "
     r"the Router\), expected a Transformer, a Pooling"),
    (dict(structure={"query": ["query_1_Pooling", "query_0_Transformer"],
                     "document": ["query_0_Transformer", "document_1_Pooling"]}),
     r"route 'query' runs \['Pooling', 'Transformer', 'Normalize'\]"),
    (dict(default_route="passage"), r"default_route='passage', expected one of its routes"),
    (dict(allow_empty_key="yes"), r"allow_empty_key='yes', expected true or false"),
    (dict(route_mappings={"query": "query"}), r"route_mappings key 'query', expected "
                                              r"'\(task, modality\)'"),
    (dict(route_mappings={"('query', None)": "passage"}),
     r"route_mappings maps \"\('query', None\)\" to 'passage', expected one of"),
    (dict(structure={"query": ["missing"]}), r"expected 'types' \(module -> type\), 'structure'"),
    (dict(types={"../bert": ROUTER}, structure={"query": ["../bert"]}),
     r"module '../bert' leads out of"),
])
def test_a_bad_router_config_is_refused(folders, tmp_path, edit, named):
  folder = _copy(folders, "shared", tmp_path)
  _edit_router(folder, **edit)
  _refused(folder, r"router_config.json: " + named)


def test_a_transformer_after_the_router_is_refused(folders, tmp_path):
  folder = _copy(folders, "separate", tmp_path)
  modules = json.load(open(os.path.join(folder, "modules.json")))
  modules.append({"idx": 1, "name": "1", "path": "query_0_Transformer",
                  "type": "sentence_transformers.base.modules.transformer.Transformer"})
  _write(folder, "modules.json", modules)
  _refused(folder, r"route 'query' runs \['Transformer', 'Pooling', 'Transformer'\] \(its own, "
                   r"then modules.json's after the Router\)")


def test_training_and_export_refuse_a_router_in_one_line(folders):
  """They read modules.json as a Transformer's modules (read_modules)."""
  _refused(folders["shared"], r"modules.json: module 0 is a Router \(modules picked by the "
                              r"task: SentenceEncoder.load computes it, training and export do "
                              r"not\)", embeddings.read_modules)


def test_a_tasks_own_length_is_refused_for_that_task(folders, tmp_path):
  """sentence-transformers cuts a task's texts to the Transformer's query_length: not
  computed here, so refused where that task is asked for (and only there)."""
  folder = _copy(folders, "shared", tmp_path)
  config = os.path.join(folder, "query_0_Transformer", "sentence_bert_config.json")
  _write(os.path.dirname(config), os.path.basename(config),
         {**json.load(open(config)), "query_length": 8})
  ours = SentenceEncoder.load(folder)
  _refused(TEXTS, r"task='query': .*sentence_bert_config.json: query_length=8, which "
                  r"sentence-transformers applies to that task's texts", ours.encode_query)
  assert ours.encode_document(TEXTS[:2]).shape == (2, 24)


@pytest.mark.parametrize("call, named", [
    (dict(task="image"), r"task='image': the Router has no route for it; its routes are "
                         r"\['document', 'query'\]"),
    (dict(task=["query"]), r"task=\['query'\], expected a str"),
    (dict(prompt_name="passage"), r"prompt_name='passage', expected one of the folder's"),
])
def test_bad_arguments_are_refused(loaded, call, named):
  ours, _ = loaded["shared"]
  _refused(["a"], named, lambda texts: ours(texts, **call))


def test_a_routers_encoder_is_not_saved_as_one_route(loaded, tmp_path):
  ours, _ = loaded["shared"]
  _refused(str(tmp_path), r"a Router's encoder, whose routes save_modules does not write",
           ours.save_modules)
