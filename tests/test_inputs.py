"""Bad input gets a clear error naming the argument, what came and what was expected."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_encoder import Encoder, checked_apply

pytestmark = pytest.mark.library  # the library's own: run on accelerators too


@pytest.fixture
def model_and_variables(tiny_config):
  model = Encoder(tiny_config)
  return model, model.init(jax.random.key(0), jnp.ones((2, 4), jnp.int32))


@pytest.mark.parametrize("bad_id", [37, -1, 1000])
def test_out_of_range_ids_raise_eagerly(model_and_variables, bad_id):
  model, variables = model_and_variables
  tokens = np.array([[1, 2, 3, 4], [5, 6, bad_id, 0]])
  with pytest.raises(ValueError, match=rf"vocab_size=37\).*got {bad_id} at index \(1, 2\)"):
    model.apply(variables, tokens)


def test_out_of_range_ids_raise_under_checked_jit(model_and_variables):
  model, variables = model_and_variables
  apply = checked_apply(model.apply)
  good = jnp.array([[1, 2, 3, 0]])
  np.testing.assert_allclose(apply(variables, good), model.apply(variables, good), atol=1e-6)
  with pytest.raises(Exception, match=r"vocab_size=37"):
    apply(variables, jnp.array([[1, 2, 37, 0]]))
  with pytest.raises(Exception, match=r"vocab_size=37"):
    apply(variables, jnp.array([[1, -2, 3, 0]]))
  # Around the user's own jitted function, as the docs show: its encoder calls are checked.
  step = checked_apply(jax.jit(lambda v, t: model.apply(v, t).sum()))
  assert np.isfinite(step(variables, good))
  with pytest.raises(ValueError, match=r"vocab_size=37"):
    step(variables, jnp.array([[1, 2, 37, 0]]))
  with pytest.raises(TypeError, match=r"inside a traced function.*outermost"):
    jax.jit(lambda v, t: checked_apply(model.apply)(v, t))(variables, good)
  # Plain jit cannot raise on values: that is what checked_apply is for. It gives NaN rows,
  # for negative ids too (a gather would count them back from the table's end: finite rows).
  for bad in (37, -1):
    out = np.asarray(jax.jit(model.apply)(variables, jnp.array([[1, bad]])))
    assert np.isnan(out[0, 1]).all(), bad  # (and every row that attends to it)


@pytest.mark.parametrize("tokens, error, words", [
    (np.ones((2, 4), np.float32), TypeError, ["integer ids", "float32"]),
    (np.ones((2, 3, 4), np.int32), ValueError, ["2-D", "(2, 3, 4)"]),
    (np.ones((4,), np.int32), ValueError, ["2-D", "(4,)"]),
    (np.ones((1, 25), np.int32), ValueError, ["25", "max_len=24"]),
    ([[1, 2]], TypeError, ["integer array", "list"]),
])
def test_bad_token_arrays(model_and_variables, tokens, error, words):
  model, variables = model_and_variables
  with pytest.raises(error) as e:
    model.apply(variables, tokens)
  for word in words:
    assert word in str(e.value)


@pytest.mark.parametrize("mask, error, words", [
    (np.ones((2, 1, 1, 5), bool), ValueError, ["(2, 1, 1, 5)", "[batch, heads, q, k]"]),
    (np.ones((3, 1, 4, 4), bool), ValueError, ["(3, 1, 4, 4)"]),
    (np.ones((2, 1, 1, 1, 4), bool), ValueError, ["(2, 1, 1, 1, 4)"]),
    (np.ones((2, 1, 1, 4), np.int32), TypeError, ["bool", "int32"]),
    (np.ones((2, 4), bool), ValueError, ["(2, 4)", "4-D", "mask[:, None, None, :]"]),
    (np.ones((2, 4, 4), bool), ValueError, ["(2, 4, 4)", "4-D", "mask[:, None]"]),
])
def test_bad_masks(model_and_variables, mask, error, words):
  model, variables = model_and_variables
  with pytest.raises(error) as e:
    model.apply(variables, np.ones((2, 4), np.int32), mask)
  for word in words:
    assert word in str(e.value)


def test_a_3d_mask_is_refused_even_where_batch_equals_the_head_count(model_and_variables):
  model, variables = model_and_variables  # 4 heads: [4, 4, 4] broadcast as [heads, q, k]
  tokens = np.ones((4, 4), np.int32)
  mask = np.tril(np.ones((4, 4), bool))[None].repeat(4, 0)
  with pytest.raises(ValueError, match=r"\(4, 4, 4\): expected 4-D"):
    model.apply(variables, tokens, mask)
  np.testing.assert_array_equal(model.apply(variables, tokens, mask[:, None]),
                                model.apply(variables, tokens, mask[:1, None]))


def test_good_masks_of_both_documented_shapes(model_and_variables):
  model, variables = model_and_variables
  tokens = np.array([[1, 2, 3, 0], [4, 5, 0, 0]])
  default = model.apply(variables, tokens)
  explicit = model.apply(variables, tokens, jnp.asarray(tokens != 0)[:, None, None, :])
  np.testing.assert_array_equal(default, explicit)
  square = jnp.broadcast_to(jnp.asarray(tokens != 0)[:, None, None, :], (2, 1, 4, 4))
  np.testing.assert_array_equal(model.apply(variables, tokens, square), default)
