"""flax_encoder.embeddings: sentence-transformers folders, saved here by sentence-transformers
itself around tiny random models (BERT, RoBERTa and MPNet, hidden 32, 2 layers), compute what
`SentenceTransformer(folder).encode` computes, packed many texts to a row; the published
all-MiniLM-L6-v2 too (tests/published.py; skipped offline)."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from flax_encoder import embeddings, packing
from flax_encoder.embeddings import EmbeddingError, SentenceEncoder
from tests.opens import assert_a_load_opens_each_file_once
from tests.test_hostile_inputs import LITERAL_SPECIALS

MAX_SEQ = 24  # ids a text is cut to: many of TEXTS are longer
WORDS = ("the quick brown fox jumps over lazy dog 0 1 2 3 4 5 6 7 8 9 0123 4567 89 a b c d e f g "
         "h i j abcd efgh ij + - * / = < > ! ? % +-*/ =<>!").split()


def _texts() -> list[str]:
  """Texts of 0 to 40 words (TEXTS of tests/hf_models, which the tokenizers were trained on),
  some with characters the tokenizers never saw."""
  rng = np.random.default_rng(0)
  texts = [" ".join(rng.choice(WORDS, n)) for n in (1, 2, 3, 5, 8, 13, 21, 34, 40, 4, 6, 9)]
  return texts + ["", "Zürich ☃ naïve", "dog", "THE QUICK Brown fox", *LITERAL_SPECIALS]


TEXTS = _texts()


def _save(path, transformer_dir, pooling, *after, **options) -> str:
  """A sentence-transformers folder at `path`: the Transformer of `transformer_dir` cut to
  MAX_SEQ ids, `pooling`, then the modules `after`, as SentenceTransformer.save writes it."""
  from sentence_transformers import SentenceTransformer
  from sentence_transformers.base.modules import Transformer
  modules = [Transformer(transformer_dir, max_seq_length=MAX_SEQ), pooling, *after]
  SentenceTransformer(modules=modules, device="cpu", **options).save(str(path))
  return str(path)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """name -> a sentence-transformers folder (each a different set of modules)."""
  pytest.importorskip("torch", reason="sentence-transformers saves the folders")
  pytest.importorskip("sentence_transformers")
  import torch
  from sentence_transformers.base.modules import Dense, Normalize
  from sentence_transformers.sentence_transformer.modules import Pooling

  from tests import hf_models
  root = tmp_path_factory.mktemp("st")
  bert = hf_models.write(root / "bert", "bert", head="base")
  roberta = hf_models.write(root / "roberta", "roberta", head="base", seed=1)
  # every parameter drawn, the relative position bias too; all-mpnet-base-v2's tokenizer
  mpnet = hf_models.write(root / "mpnet", "mpnet", head="base", seed=2)
  torch.manual_seed(0)
  out = {
      # every mode, in an order of its own (concatenated in it)
      "modes": _save(root / "modes", bert, Pooling(32, pooling_mode=(
          "lasttoken", "mean", "cls", "max", "weightedmean", "mean_sqrt_len_tokens"))),
      "prompt": _save(root / "prompt", bert, Pooling(32, pooling_mode=(
          "mean", "cls", "lasttoken", "max", "weightedmean"), include_prompt=False),
          prompts={"query": "the query: ", "empty": ""}, default_prompt_name="query"),
      # tanh; then no activation, no bias, and a residual through a Linear of its own
      "dense": _save(root / "dense", bert, Pooling(32, pooling_mode="mean"), Dense(32, 24),
                     Dense(24, 16, bias=False, activation_function=None, use_residual=True),
                     Normalize(), similarity_fn_name="dot"),
      "roberta": _save(root / "roberta-st", roberta, Pooling(32, pooling_mode="cls"),
                       Normalize()),
      # all-mpnet-base-v2's modules
      "mpnet": _save(root / "mpnet-st", mpnet, Pooling(32, pooling_mode="mean"), Normalize()),
      "mpnet-prompt": _save(root / "mpnet-prompt", mpnet, Pooling(32, pooling_mode=(
          "mean", "cls", "lasttoken", "max", "weightedmean"), include_prompt=False),
          prompts={"query": "the query: ", "empty": ""}, default_prompt_name="query"),
  }
  # sentence-transformers before 6: a flag per mode (concatenated cls, max, mean), the width
  # as word_embedding_dimension, max_seq_length in sentence_bert_config.json
  out["legacy"] = str(root / "legacy")
  shutil.copytree(out["modes"], out["legacy"])
  _write(out["legacy"], "1_Pooling/config.json", {
      "word_embedding_dimension": 32, "pooling_mode_mean_tokens": True,
      "pooling_mode_cls_token": True, "pooling_mode_max_tokens": True,
      "pooling_mode_mean_sqrt_len_tokens": False})
  _write(out["legacy"], "sentence_bert_config.json", {"max_seq_length": 12,
                                                      "do_lower_case": True})
  return out


def _write(folder, name, value) -> None:
  with open(os.path.join(folder, name), "w") as f:
    json.dump(value, f)


@pytest.fixture(scope="module")
def loaded(folders):
  """name -> (SentenceEncoder, SentenceTransformer) of each folder."""
  from sentence_transformers import SentenceTransformer
  return {name: (SentenceEncoder.load(path), SentenceTransformer(path, device="cpu"))
          for name, path in folders.items()}


@pytest.mark.parametrize("name", ["modes", "legacy", "dense", "roberta", "mpnet"])
def test_the_vectors_are_sentence_transformers(loaded, name):
  ours, theirs = loaded[name]
  got, want = ours(TEXTS), theirs.encode(TEXTS)
  assert got.dtype == np.float32 and got.shape == want.shape == (len(TEXTS), ours.dim)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["modes", "roberta", "mpnet"])
def test_texts_whose_first_characters_make_few_ids_are_sentence_transformers(loaded, name):
  """sentence-transformers tokenizes a text whole: thousands of spaces, tabs or zero-width
  spaces before the words, or a long run of one word, still end in the text's own ids."""
  from tests.test_hostile_inputs import SPARSE_STARTS
  ours, theirs = loaded[name]
  got, want = ours(SPARSE_STARTS), theirs.encode(SPARSE_STARTS)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_a_load_opens_each_file_of_the_folder_once(folders):
  """A load reads the folder's files through one FolderFiles: modules.json, the modules'
  config.json, the settings and the tokenizer's options each opened once (or looked for once,
  where absent)."""
  for name in ("dense", "legacy"):
    assert_a_load_opens_each_file_once(SentenceEncoder.load, folders[name])


def test_what_the_folders_say_is_read(loaded):
  modes, legacy, dense = (loaded[n][0] for n in ("modes", "legacy", "dense"))
  assert modes.model.pooling.modes == ("lasttoken", "mean", "cls", "max", "weightedmean",
                                       "mean_sqrt_len_tokens")
  assert legacy.model.pooling.modes == ("cls", "max", "mean")  # the flags' fixed order
  assert (modes.dim, legacy.dim, dense.dim) == (6 * 32, 3 * 32, 16)
  # tokenizer_config.json's model_max_length (sentence-transformers 6), else
  # sentence_bert_config.json's max_seq_length
  assert (modes.max_seq_length, legacy.max_seq_length) == (MAX_SEQ, 12)
  assert [type(s).__name__ for s in dense.model.steps] == ["Dense", "Dense", "Normalize"]
  assert [(s.activation, s.bias, s.residual) for s in dense.model.steps[:2]] == [
      ("Tanh", True, False), ("Identity", False, True)]
  assert (dense.similarity, modes.similarity) == ("dot", "cosine")
  assert np.allclose(np.linalg.norm(dense(TEXTS), axis=1), 1, atol=1e-6)
  assert max(len(i) for i in modes.tokenize(TEXTS)) == MAX_SEQ  # the long texts are cut


@pytest.mark.parametrize("name", ["prompt", "mpnet-prompt"])
@pytest.mark.parametrize("prompt", [{}, {"prompt_name": "empty"}, {"prompt": "a b c: "},
                                    {"prompt": " ".join("0123456789" * 3)}])
def test_a_prompt_is_left_out_of_the_pooling_as_sentence_transformers_leaves_it(loaded, name,
                                                                                prompt):
  """The default prompt ("query"), none, others; the last of more than MAX_SEQ ids: no id of
  the texts is left, and only the [SEP] (</s>) after what is left of the prompt is pooled."""
  ours, theirs = loaded[name]
  assert ours.prompts["query"] == "the query: " and ours.default_prompt_name == "query"
  np.testing.assert_allclose(ours(TEXTS, **prompt), theirs.encode(TEXTS, **prompt), rtol=0,
                             atol=1e-5)


@pytest.mark.parametrize("name", ["prompt", "mpnet-prompt"])
def test_a_prompt_changes_the_vectors(loaded, name):
  ours, theirs = loaded[name]
  # the prompt's ids with [CLS] (<s>), less the [SEP] (</s>) after it
  assert ours.prompt_length("the query: ") == len(theirs.tokenizer("the query: ").input_ids) - 1
  assert np.abs(ours(TEXTS[:4]) - ours(TEXTS[:4], prompt_name="empty")).max() > 1e-3


@pytest.mark.parametrize("name", ["modes", "mpnet"])
def test_packed_texts_come_out_as_each_alone(loaded, name, monkeypatch):
  """Many texts a row, in calls of few rows, over chunks tokenized while the device runs: each
  text's vector is the one it has alone in its row (MPNet's relative position bias too)."""
  ours, _ = loaded[name]
  alone = np.stack([ours([text])[0] for text in TEXTS])
  monkeypatch.setattr(embeddings, "CHUNK_TEXTS", 5)
  packed = ours(TEXTS[::-1], batch_tokens=2 * MAX_SEQ)[::-1]
  np.testing.assert_allclose(packed, alone, rtol=0, atol=2e-6)
  assert np.abs(alone[:-1] - alone[1:]).max() > 1e-2  # not all the same vector


def test_calls_take_a_few_shapes(loaded):
  ours, _ = loaded["dense"]
  ours.shapes.clear()
  for n in range(1, len(TEXTS) + 1):
    ours(TEXTS[:n])
  rows_per_call = embeddings.BATCH_TOKENS // MAX_SEQ
  assert ours.shapes <= {(4 ** i, MAX_SEQ) for i in range(4)} | {(rows_per_call, MAX_SEQ)}
  assert len(ours.shapes) <= 3  # 16 texts, 16 rows at most: 1, 4 or 16 a call


def test_embed_in_a_jit_of_ones_own(loaded):
  ours, _ = loaded["prompt"]
  rows = ours.pack(ours.tokenize(TEXTS, "the query: "))
  out = jax.jit(ours.apply)(ours.params, rows.tokens, rows.segment_ids, rows.positions,
                            ours.prompt_length("the query: "))
  assert out.shape == (len(rows.tokens), MAX_SEQ // packing.LEAST_IDS["text"], ours.dim)
  np.testing.assert_allclose(np.asarray(out)[rows.where[:, 0], rows.where[:, 1]], ours(TEXTS),
                             rtol=0, atol=2e-6)


def test_the_published_minilm_is_sentence_transformers():
  pytest.importorskip("torch", reason="sentence-transformers' side of the comparison")
  st = pytest.importorskip("sentence_transformers")
  from tests import published
  folder = published.all_minilm_l6_v2()
  texts = ["A man is eating food.", "Héllo, wörld: naïve café.", "",
           "Two dogs play in the snow near a small wooden house. " * 40,  # cut at 256 ids
           "a [PAD] b", "[PAD] [SEP] the dog [PAD]"]
  ours = SentenceEncoder.load(folder)
  got, want = ours(texts), st.SentenceTransformer(folder, device="cpu").encode(texts)
  cosine = np.sum(got * want, 1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
  assert ours.max_seq_length == 256 and got.shape == (6, 384)
  assert cosine.min() >= 0.99999 and np.abs(got - want).max() < 1e-5


# ---------------------------------------------------------------------------------------------
# Packing


def test_rows_are_filled_first_fit_longest_first():
  # 5 opens a row of 8; 4 does not fit (3 left): a second row; 3 fills the first; 2 finds the
  # first out of segments (2 a row): the second
  row_of, kinds = embeddings.assign_rows([5, 3, 4, 2], [8], [2])
  assert row_of.tolist() == [0, 0, 1, 1] and kinds.tolist() == [0, 0]
  # 12 opens a row of 16, which 3 fills after it; the 2s open a row of 4, the shorter
  row_of, kinds = embeddings.assign_rows([2, 12, 3, 2], [4, 16], [4, 4])
  assert row_of.tolist() == [1, 0, 0, 1] and kinds.tolist() == [1, 0]


def test_the_rows_past_whole_calls_go_in_calls_of_powers_of_four():
  assert embeddings.call_rows(38, 16) == [16, 16, 4, 1, 1]
  assert embeddings.call_rows(32, 16) == [16, 16]
  assert embeddings.call_rows(13, 32) == [4, 4, 4, 1] and embeddings.call_rows(1, 16) == [1]


class _Device:
  """What default_batch_tokens reads of a device."""

  def __init__(self, platform: str, memory: int | None):
    self.platform, self.memory = platform, memory

  def memory_stats(self):
    return None if self.memory is None else {"bytes_limit": self.memory}


def test_the_default_token_budget_is_the_cpus_or_what_a_quarter_of_the_memory_holds():
  from flax_encoder.config import EncoderConfig
  base = EncoderConfig(vocab_size=30522, d_model=768, n_heads=12, d_ff=3072, n_layers=12)
  budget = lambda device: embeddings.default_batch_tokens(base, device, 512)  # noqa: E731
  assert budget(jax.devices("cpu")[0]) == embeddings.BATCH_TOKENS
  assert budget(_Device("gpu", None)) == embeddings.BATCH_TOKENS  # a device that does not say
  # an id of BERT-base at 512: 4 * (8*768 + 2*3072 + 2*12*512) = 98,304 bytes
  assert budget(_Device("gpu", 80 << 30)) == 131072  # 218,453 fit a quarter: capped
  assert budget(_Device("gpu", 16 << 30)) == 32768  # 43,690 fit: the power of two below
  assert budget(_Device("tpu", 1 << 30)) == embeddings.BATCH_TOKENS  # 2,730: never below


@pytest.mark.parametrize("name", ["legacy", "dense", "modes", "mpnet-prompt"])
def test_a_folder_written_back_is_the_same_model_to_both(loaded, folders, name, tmp_path):
  # save_modules beside the Transformer's files: what sentence-transformers and load read back
  from sentence_transformers import SentenceTransformer

  from flax_encoder.embeddings import save_modules
  ours, theirs = loaded[name]
  out = str(tmp_path / "written")
  os.makedirs(out)
  for entry in os.listdir(folders[name]):  # the Hugging Face model directory alone
    if os.path.isfile(os.path.join(folders[name], entry)) and entry not in (
        "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
      shutil.copy(os.path.join(folders[name], entry), out)
  save_modules(out, ours.model, ours.params, ours.max_seq_length, ours.similarity, ours.prompts,
               ours.default_prompt_name, do_lower_case=name == "legacy")
  texts = _texts()
  again = SentenceTransformer(out, device="cpu")
  np.testing.assert_allclose(again.encode(texts), theirs.encode(texts), atol=1e-6)
  assert (again.max_seq_length, again.similarity_fn_name, again.prompts) == (
      theirs.max_seq_length, theirs.similarity_fn_name, theirs.prompts)
  reread = SentenceEncoder.load(out)
  assert reread.model == ours.model and reread.max_seq_length == ours.max_seq_length
  np.testing.assert_allclose(reread(texts), ours(texts), atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Refusals: one line, naming the file or argument


def _copy(folders, name, tmp_path) -> str:
  folder = str(tmp_path / name)
  shutil.copytree(folders[name], folder)
  return folder


def test_a_module_it_does_not_compute_is_refused(folders, tmp_path):
  folder = _copy(folders, "modes", tmp_path)
  with open(os.path.join(folder, "modules.json")) as f:
    modules = json.load(f)
  modules.append({"idx": 2, "name": "2", "path": "2_LSTM",
                  "type": "sentence_transformers.sentence_transformer.modules.lstm.LSTM"})
  _write(folder, "modules.json", modules)
  with pytest.raises(EmbeddingError, match=r"modules.json: module 2 is of type "
                                           r"'sentence_transformers.*lstm.LSTM'") as e:
    SentenceEncoder.load(folder)
  assert "\n" not in str(e.value)


def test_a_dense_module_without_weights_is_refused(folders, tmp_path):
  folder = _copy(folders, "dense", tmp_path)
  os.remove(os.path.join(folder, "2_Dense", "model.safetensors"))
  with pytest.raises(EmbeddingError, match=r"2_Dense: the Dense module's weights: .*no weights"):
    SentenceEncoder.load(folder)


@pytest.mark.parametrize("config, named", [
    ({"embedding_dimension": 32, "pooling_mode": "median"}, r"pooling_mode='median', expected"),
    ({"embedding_dimension": 32, "pooling_mode": []}, r"pooling_mode=\[\], expected"),
    ({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": "yes"},
     r"pooling_mode_mean_tokens='yes', expected true or false"),
    ({"embedding_dimension": 16, "pooling_mode": "mean"},
     r"embedding_dimension=16, expected the Transformer's hidden size 32"),
    ({"embedding_dimension": 32, "include_prompt": 0}, r"include_prompt=0, expected true"),
])
def test_a_bad_pooling_config_is_refused(folders, tmp_path, config, named):
  folder = _copy(folders, "modes", tmp_path)
  _write(folder, "1_Pooling/config.json", config)
  with pytest.raises(EmbeddingError, match=r"1_Pooling/config.json: " + named):
    SentenceEncoder.load(folder)


def test_a_folder_without_pooling_is_refused(folders, tmp_path):
  folder = _copy(folders, "modes", tmp_path)
  with open(os.path.join(folder, "modules.json")) as f:
    _write(folder, "modules.json", json.load(f)[:1])
  with pytest.raises(EmbeddingError, match=r"modules.json: expected a Pooling module"):
    SentenceEncoder.load(folder)


@pytest.mark.parametrize("call, named", [
    (dict(prompt_name="passage"), r"prompt_name='passage', expected one of .*'query'"),
    (dict(prompt="q: ", prompt_name="query"), r"prompt='q: ' and prompt_name='query'"),
    (dict(texts=["a", 3]), r"texts\[1\]: a int, expected a str"),
    (dict(batch_tokens=0), r"batch_tokens=0, expected an integer >= 1"),
])
def test_bad_arguments_are_refused(loaded, call, named):
  ours, _ = loaded["prompt"]
  call = {"texts": ["a"], **call}
  with pytest.raises(EmbeddingError, match=named):
    ours(call.pop("texts"), **call)
