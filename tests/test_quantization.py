"""Embeddings in fewer bytes against sentence-transformers: quantize_embeddings' precisions,
encode(precision=...) and truncate_dim."""

import numpy as np
import pytest

from flax_encoder import quantization
from flax_encoder.embeddings import EmbeddingError, SentenceEncoder
from flax_encoder.quantization import QuantizationError, int8_ranges, quantize
from tests.test_embeddings import TEXTS, folders  # noqa: F401 (a fixture)

st = pytest.importorskip("sentence_transformers", reason="the precisions' reference")
pytest.importorskip("torch", reason="sentence-transformers runs on it")


def _quantize_embeddings(*args, **kwargs):
  from sentence_transformers.util.quantization import quantize_embeddings
  return quantize_embeddings(*args, **kwargs)


@pytest.mark.parametrize("precision", quantization.PRECISIONS)
def test_each_precision_of_the_same_vectors_is_sentence_transformers(precision):
  rng = np.random.default_rng(0)
  # 13 dimensions: binary's last byte holds 5 bits; a dimension of one value (a range of 0)
  vectors = rng.standard_normal((40, 13)).astype(np.float32)
  vectors[:, 3] = 0.25
  sample = rng.standard_normal((100, 13)).astype(np.float32)
  for ranges in (None, int8_ranges(sample)):
    got = quantize(vectors, precision, ranges)
    want = _quantize_embeddings(vectors, precision=precision, ranges=ranges)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(int8_ranges(sample), np.vstack([sample.min(0), sample.max(0)]))


@pytest.fixture(scope="module")
def minilm():
  from tests import published
  folder = published.all_minilm_l6_v2()
  return SentenceEncoder.load(folder), st.SentenceTransformer(folder, device="cpu")


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_encode_in_a_precision_is_sentence_transformers(minilm, precision):
  # the float vectors agree to 1e-6, so a value on a bucket's edge may fall in the next one:
  # codes differ by at most one, and that in under 1% of the values (ranges taken from the
  # call's own vectors put each dimension's two extremes right on an edge)
  ours, theirs = minilm
  texts = TEXTS[:24]
  got = ours(texts, precision=precision)
  want = theirs.encode(texts, precision=precision)
  assert got.dtype == want.dtype and got.shape == want.shape
  if precision.endswith("binary"):
    bits = lambda codes: np.unpackbits(codes.view(np.uint8), axis=-1)
    assert (bits(got) != bits(want)).sum() <= 2
  else:
    differ = got.astype(np.int16) - want.astype(np.int16)
    assert np.abs(differ).max() <= 1 and (differ != 0).mean() < 1e-2


def test_the_ranges_of_a_sample_quantize_each_call_alike(minilm):
  ours, theirs = minilm
  ranges = int8_ranges(ours(TEXTS))
  got = np.concatenate([ours(TEXTS[:5], precision="int8", ranges=ranges),
                        ours.encode_query(TEXTS[5:9], precision="int8", ranges=ranges)])
  # sentence-transformers' encode takes no ranges: its vectors, then quantize_embeddings
  want = _quantize_embeddings(np.concatenate([theirs.encode(TEXTS[:5]),
                                              theirs.encode_query(TEXTS[5:9])]),
                              precision="int8", ranges=ranges)
  assert np.abs(got.astype(np.int16) - want).max() <= 1
  assert ours("one text", precision="int8", ranges=ranges).shape == (384,)


@pytest.mark.parametrize("name,dim", [("dense", 5), ("roberta", 32), ("modes", 100)])
def test_truncate_dim_is_sentence_transformers(folders, name, dim):  # noqa: F811
  # after the model's last module: the dense folder's Normalize, then cut
  ours = SentenceEncoder.load(folders[name], truncate_dim=dim)
  theirs = st.SentenceTransformer(folders[name], device="cpu", truncate_dim=dim)
  got, want = ours(TEXTS), theirs.encode(TEXTS)
  assert ours.dim == dim and got.shape == want.shape == (len(TEXTS), dim)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert ours(TEXTS[0]).shape == (dim,)


def test_bad_precisions_ranges_and_dims_are_one_line(minilm, folders):  # noqa: F811
  ours, _ = minilm
  cases = [
      (lambda: ours(TEXTS[:2], precision="int4"), "precision='int4', expected one of"),
      (lambda: ours(TEXTS[:1], precision="int8"), "ranges=None with vectors of shape (1, 384)"),
      (lambda: ours(TEXTS[:2], precision="int8", ranges=np.zeros((2, 5))),
       "ranges: shape (2, 5), expected (2, 384)"),
      (lambda: SentenceEncoder.load(folders["dense"], truncate_dim=17),
       "truncate_dim=17, expected an integer from 1 to the model's dimensions 16"),
      (lambda: SentenceEncoder.load(folders["dense"], truncate_dim=0), "truncate_dim=0"),
  ]
  for call, words in cases:
    with pytest.raises((EmbeddingError, QuantizationError)) as raised:
      call()
    assert words in str(raised.value) and "\n" not in str(raised.value)
  with pytest.raises(QuantizationError, match="expected floats"):
    quantize(np.zeros((2, 3), np.int8), "binary")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  return np.sum(a * b, -1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.mark.slow  # the published model in int8 and float32, and sentence-transformers
def test_int8_vectors_of_the_published_minilm_are_within_their_cosine(minilm):
  # the dense layers in int8 (weights a scale per output channel, activations a scale per
  # token): each real paragraph's vector within a cosine of 0.99 of sentence-transformers'
  # float32, 0.995 on average; odd texts (random words, characters never seen, "") within
  # 0.97; the kernels held in int8
  from benchmarks.finetune_packed import paragraphs
  from tests import published
  _, theirs = minilm
  ours = SentenceEncoder.load(published.all_minilm_l6_v2(), quantize="int8")
  texts = paragraphs()[0][::16][:64]
  cosine = _cosines(ours(texts), theirs.encode(texts))
  assert len(texts) == 64 and cosine.min() >= 0.99 and cosine.mean() >= 0.995, cosine
  assert _cosines(ours(TEXTS), theirs.encode(TEXTS)).min() >= 0.97
  kernel = ours.params["encoder"]["layers_0"]["feed_forward"]["w_1"]["kernel"]
  assert kernel.array.qvalue.dtype == np.int8
  assert ours.model.quantize == "int8" and "xi8>" in _lowered(ours)  # int8 tensors


def test_int8_of_a_tiny_model_and_of_a_loaded_one_agree(folders):  # noqa: F811
  # load(quantize=) and quantized() are the same model; a Dense module after the pooling is
  # quantized too
  loaded = SentenceEncoder.load(folders["dense"], quantize="int8")
  plain = SentenceEncoder.load(folders["dense"])
  later = plain.quantized("int8")
  np.testing.assert_array_equal(loaded(TEXTS), later(TEXTS))
  assert _cosines(loaded(TEXTS), plain(TEXTS)).min() >= 0.99
  assert loaded.params["dense_0"]["kernel"].array.qvalue.dtype == np.int8


def test_what_int8_does_not_compute_is_refused_in_one_line(folders):  # noqa: F811
  cases = [(lambda: SentenceEncoder.load(folders["dense"], quantize="int4"),
            "quantize='int4', expected one of ('int8',) or None"),
           (lambda: SentenceEncoder.load(folders["dense"], quantize="int8").quantized("int8"),
            "quantize='int8': expected one of ('int8',) of an encoder of float weights")]
  for call, words in cases:
    with pytest.raises(ValueError) as raised:
      call()
    assert words in str(raised.value) and "\n" not in str(raised.value)


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
  """kind -> (its encoder class, a tiny folder of it): the other three types a folder holds."""
  from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

  from flax_encoder.cross_encoder import Reranker
  from flax_encoder.multi_vector import MultiVectorEncoder
  from flax_encoder.sparse import SparseEncoder
  from tests import hf_models
  root = tmp_path_factory.mktemp("kinds")
  base = hf_models.write(root / "base", "bert", head="base")
  STMultiVectorEncoder(base, device="cpu").save(str(root / "colbert"))
  return {"sparse": (SparseEncoder, hf_models.write(root / "mlm", "bert", head="masked_lm")),
          "reranker": (Reranker, hf_models.write(root / "ce", "bert",
                                                 head="sequence_classification", num_labels=3)),
          "multi_vector": (MultiVectorEncoder, str(root / "colbert"))}


@pytest.mark.parametrize("kind", ["sparse", "reranker", "multi_vector"])
def test_each_type_computes_in_int8_near_its_float32(kinds, kind):
  # the same mechanism as SentenceEncoder's: each type's module quantized, its dense layers'
  # kernels held in int8; its outputs near float32's (each text's SPLADE vector, each pair's
  # labels, the token vectors: a cosine of 0.9998 or more on these tiny random models)
  cls, folder = kinds[kind]
  plain, int8 = cls.load(folder), cls.load(folder, quantize="int8")
  assert int8.model.quantize == "int8" and "xi8>" in _lowered(int8, kind)
  texts = TEXTS[:12]
  if kind == "sparse":
    got, want = int8(texts).toarray(), plain(texts).toarray()
  elif kind == "reranker":
    pairs = list(zip(texts, texts[::-1]))
    got, want = int8.predict(pairs), plain.predict(pairs)
  else:
    got, want = (np.concatenate(side.encode_document(texts)) for side in (int8, plain))
  assert got.shape == want.shape
  assert _cosines(got, want).min() >= 0.999, _cosines(got, want)


def _lowered(encoder, kind: str | None = None) -> str:
  """The HLO of one call of `encoder` on a row of ones (a reranker's: ids and segments)."""
  import jax
  import jax.numpy as jnp
  rows = jnp.ones((1, 16), jnp.int32)
  args = (rows, rows) if kind == "reranker" else (rows, rows, rows)
  return jax.jit(encoder.apply).lower(encoder.params, *args).as_text()
