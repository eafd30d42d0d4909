"""Activation functions by name: the library's one registry of them, and the names each
format gives them. A new one is an entry of `FUNCTIONS` and of the formats that name it.

    FUNCTIONS[config.activation]             # the encoder's feed-forward and heads
    FUNCTIONS[TORCH["Tanh"]]                 # a sentence-transformers module's torch.nn class
    TRANSFORMERS["gelu_new"] == "gelu_tanh"  # a config.json's hidden_act
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

FUNCTIONS = {
    "relu": jax.nn.relu,
    # PyTorch's nn.GELU default is the exact erf form; jax.nn.gelu defaults to the tanh one.
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),  # GPT-2's, "gelu_new"
    "silu": jax.nn.silu,  # x * sigmoid(x): SwiGLU's gate (NomicBERT)
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
    "identity": lambda x: x,
    "softmax": lambda x: jax.nn.softmax(x, axis=-1),  # over the last axis, as torch's Softmax()
}
# What the encoder's feed-forward takes (EncoderConfig.activation).
FEED_FORWARD = ("relu", "gelu", "gelu_tanh", "silu")
# torch.nn's activation classes, as a sentence-transformers module names them (Dense's
# activation_function, a CrossEncoder's activation_fn: torch.nn.modules.*.<class>) -> ours.
TORCH = {"Tanh": "tanh", "Identity": "identity", "ReLU": "relu", "GELU": "gelu",
         "Sigmoid": "sigmoid", "SiLU": "silu", "Softmax": "softmax"}
# transformers' hidden_act (a config.json's) -> ours.
TRANSFORMERS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "relu": "relu", "silu": "silu", "swish": "silu"}
# ours -> the hidden_act a config.json is written with.
HIDDEN_ACTS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def torch_class(name: str):
  """The function of the torch.nn activation class `name` (TORCH)."""
  return FUNCTIONS[TORCH[name]]
