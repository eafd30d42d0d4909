"""An encoder's dense layers computed in int8: post-training quantization by qwix (Google's
quantization library for JAX). Each kernel is stored in int8 with a float32 scale per output
channel; each activation it multiplies is quantized as it comes, a scale per token (dynamic:
no calibration); int8 x int8 products are summed in int32 and scaled back. The attention's
own products (queries by keys, weights by values), the norms, softmax and pooling stay in the
encoder's dtype.

    module = quantized(SentenceEmbedding(model), "int8")     # a linen module like the other
    params = quantized_params(module, params, tokens, segment_ids, positions)
    module.apply({"params": params}, tokens, segment_ids, positions)

Needs the `qwix` package (the `int8` extra).
"""

from __future__ import annotations

import flax.linen as nn
import jax

QUANTIZATIONS = ("int8",)  # what `quantize=` takes (None: the float weights as they are)
EXTRA = "pip install 'flax-encoder[int8]'"


class QuantizeError(ValueError):
  """A quantization this library does not compute, or qwix missing; one line."""


def check(quantize) -> str | None:
  if quantize is not None and quantize not in QUANTIZATIONS:
    raise QuantizeError(f"quantize={quantize!r}, expected one of {QUANTIZATIONS} or None")
  return quantize


def _qwix():
  try:
    import qwix
  except ModuleNotFoundError:
    raise QuantizeError(f"quantize='int8' needs qwix, which is not installed: {EXTRA}") from None
  return qwix


def quantized(module: nn.Module, quantize: str | None) -> nn.Module:
  """`module` whose weights' matrix products (nn.Dense's and the like: `lax.dot_general` of a
  parameter) run in `quantize`; `module` itself where None."""
  if check(quantize) is None:
    return module
  qwix = _qwix()
  rule = qwix.QtRule(module_path=".*", op_names=("dot_general",), weight_qtype="int8",
                     act_qtype="int8")
  return qwix.quantize_model(module, qwix.PtqProvider([rule]))


def quantized_params(module: nn.Module, params: dict, *args, **kwargs) -> dict:
  """The float `params` of the module `quantized` made, in its form: each quantized kernel an
  int8 array and its scales. `args`, `kwargs`: an example call's (shapes only: nothing runs)."""
  qwix = _qwix()
  abstract = jax.eval_shape(lambda: module.init(jax.random.key(0), *args, **kwargs))["params"]
  params = jax.tree_util.tree_map(jax.numpy.asarray, nn.unbox(params))
  return qwix.quantize_params(params, abstract)
