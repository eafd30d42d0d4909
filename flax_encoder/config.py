"""EncoderConfig: every size and switch of the encoder in one frozen dataclass.

Each field has one role:

  architecture  what the model computes and the shapes of its parameters
  parameters    how the parameters are stored (their dtype, layers stacked for nn.scan)
  training      what training adds (dropout)
  execution     how the model runs on the hardware (compute dtype, attention kernel, remat)

What a model *is* (`record()`: architecture and parameters) travels with its weights; each
reader picks how it runs (`from_record(record, dtype=..., attention_impl=...)`), so a model
trained with cuDNN attention in bfloat16 loads, exports and predicts on a CPU.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

NORM_POSITIONS = ("post", "pre")
POSITION_EMBEDDINGS = ("sinusoidal", "learned", "rotary")
ACTIVATIONS = {
    "relu": jax.nn.relu,
    # PyTorch's nn.GELU default is the exact erf form; jax.nn.gelu defaults to the tanh one.
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),  # GPT-2's, "gelu_new"
}
ATTENTION_IMPLS = ("reference", "xla", "cudnn", "splash", "triton")
REMAT_POLICIES = ("none", "full", "save_dots")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


ROLES = ("architecture", "parameters", "training", "execution")


class ConfigError(ValueError):
  """A field of EncoderConfig with a value it cannot take: `field`, the `value` given, and
  what was `expected`, for callers to say as their own setting."""

  def __init__(self, field: str, value: Any, expected: str):
    super().__init__(f"EncoderConfig.{field}: {value!r}, expected {expected}")
    self.field, self.value, self.expected = field, value, expected


def _canonical_dtype(field: str, value: Any) -> np.dtype:
  try:
    dtype = jnp.dtype(value)
  except TypeError:
    dtype = None
  if dtype is None or dtype.name not in FLOAT_DTYPES:
    raise ConfigError(field, value, f"one of {FLOAT_DTYPES}")
  return dtype


def _field(default, role: str):
  return dataclasses.field(default=default, metadata={"role": role})


def _plain(value):
  return value.name if isinstance(value, np.dtype) else value


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """Sizes and options of the Transformer encoder ("Attention Is All You Need", section 3.1)."""

  vocab_size: int = dataclasses.field(metadata={"role": "architecture"})
  d_model: int = _field(512, "architecture")
  n_heads: int = _field(8, "architecture")
  d_ff: int = _field(2048, "architecture")
  n_layers: int = _field(6, "architecture")
  max_len: int = _field(5000, "architecture")
  pad_id: int = _field(0, "architecture")
  # "sinusoidal": the paper's fixed table; "learned": a table of max_len + position_offset
  # trained rows (BERT's). With position_offset > 0 (RoBERTa: pad_id + 1), position p reads
  # row p + position_offset, padding reads row position_offset - 1 and, by default, positions
  # count the real tokens only (transformers' RoBERTa).
  position_embedding: str = _field("sinusoidal", "architecture")
  position_offset: int = _field(0, "architecture")
  type_vocab_size: int = _field(0, "architecture")  # > 0: token-type (segment A/B) embeddings
  embedding_scale: bool = _field(True, "architecture")  # embeddings * sqrt(d_model) (paper)
  embedding_norm: bool = _field(False, "architecture")  # LayerNorm on the embeddings' sum (BERT)
  # ModernBERT's switches. "rotary" positions rotate each head's queries and keys by their
  # position (RoFormer, halves rotated as transformers has it), with base rope_theta in the
  # global layers and local_rope_theta in the local ones. With local_attention = w > 0, layer i
  # is global when i % global_attention_every == 0, and local otherwise: a token sees those
  # at most w / 2 positions away.
  rope_theta: float = _field(10000.0, "architecture")
  local_rope_theta: float = _field(10000.0, "architecture")
  local_attention: int = _field(0, "architecture")
  global_attention_every: int = _field(1, "architecture")
  glu: bool = _field(False, "architecture")  # GeGLU: act(x W_a) * (x W_b), one w_1 of 2 d_ff
  dense_bias: bool = _field(True, "architecture")  # biases of every dense layer
  norm_bias: bool = _field(True, "architecture")  # biases of every LayerNorm
  first_attention_norm: bool = _field(True, "architecture")  # Pre-LN: layer 0 normalises its
  #                                                             input (ModernBERT's does not)
  norm_position: str = _field("post", "architecture")  # "post": Add & Norm; "pre": x + f(norm(x))
  final_norm: bool = _field(True, "architecture")
  # PyTorch's LayerNorm uses eps=1e-5; Flax defaults to 1e-6.
  layer_norm_eps: float = _field(1e-5, "architecture")
  activation: str = _field("relu", "architecture")
  param_dtype: Any = _field(jnp.float32, "parameters")
  scan_layers: bool = _field(False, "parameters")  # layers stacked for nn.scan: compile time
  #                                                   independent of depth
  dropout: float = _field(0.1, "training")  # on embeddings + positions and each sub-layer's output
  attention_dropout: float = _field(0.0, "training")  # on the attention weights (the port has none)
  dtype: Any = _field(jnp.float32, "execution")  # compute dtype
  attention_impl: str = _field("reference", "execution")
  remat: str = _field("none", "execution")  # rematerialise each layer in the backward pass

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ConfigError(name, value, "a positive integer")
    if self.d_model % self.n_heads:
      raise ConfigError("d_model", self.d_model,
                        f"a number divisible by n_heads ({self.n_heads})")
    if self.d_model % 2 and self.position_embedding == "sinusoidal":
      raise ConfigError("d_model", self.d_model,
                        "an even number (sin/cos pairs of the positional encoding)")
    if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, (int, np.integer)) or not (
        0 <= self.pad_id < self.vocab_size):
      raise ConfigError("pad_id", self.pad_id, f"an id in [0, vocab_size={self.vocab_size})")
    for name in ("position_offset", "type_vocab_size", "local_attention"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ConfigError(name, value, "an integer >= 0")
    if self.position_offset and self.position_embedding != "learned":
      raise ConfigError("position_offset", self.position_offset,
                        "0 with position_embedding='sinusoidal' (an offset is a row of a "
                        "learned table)")
    if isinstance(self.global_attention_every, bool) or not isinstance(
        self.global_attention_every, (int, np.integer)) or self.global_attention_every < 1:
      raise ConfigError("global_attention_every", self.global_attention_every,
                        "a positive integer")
    for name in ("rope_theta", "local_rope_theta"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(name, value, "a number > 0")
    if self.position_embedding == "rotary" and self.head_dim % 2:
      raise ConfigError("n_heads", self.n_heads, f"a count that leaves an even head_dim for "
                        f"rotary positions (d_model {self.d_model})")
    for name in ("dropout", "attention_dropout"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(name, value, "a number in [0, 1)")
    if isinstance(self.layer_norm_eps, bool) or not isinstance(
        self.layer_norm_eps, (int, float)) or not self.layer_norm_eps > 0:
      raise ConfigError("layer_norm_eps", self.layer_norm_eps, "a number > 0")
    for name, allowed in (("norm_position", NORM_POSITIONS),
                          ("position_embedding", POSITION_EMBEDDINGS),
                          ("activation", tuple(ACTIVATIONS)),
                          ("attention_impl", ATTENTION_IMPLS), ("remat", REMAT_POLICIES)):
      value = getattr(self, name)
      if value not in allowed:
        raise ConfigError(name, value, f"one of {allowed}")
    for name in ("final_norm", "embedding_scale", "embedding_norm", "glu", "dense_bias",
                 "norm_bias", "first_attention_norm", "scan_layers"):
      if not isinstance(getattr(self, name), (bool, np.bool_)):
        raise ConfigError(name, getattr(self, name), "True or False")
    object.__setattr__(self, "dtype", _canonical_dtype("dtype", self.dtype))
    object.__setattr__(self, "param_dtype", _canonical_dtype("param_dtype", self.param_dtype))
    if self.attention_impl == "cudnn" and self.dtype.name not in ("bfloat16", "float16"):
      raise ConfigError(
          "attention_impl", "cudnn",
          f"'xla' for dtype {self.dtype.name}: cuDNN flash attention ('cudnn') needs dtype "
          f"bfloat16 or float16")
    if self.local_attention and self.attention_impl == "triton":
      raise ConfigError("attention_impl", self.attention_impl,
                        "'xla' or 'cudnn' with local_attention: JAX's Triton attention kernel "
                        "takes no window")
    if self.attention_impl != "reference" and self.attention_dropout > 0:
      raise ConfigError(
          "attention_dropout", self.attention_dropout,
          f"0 with attention_impl={self.attention_impl!r}: the fused kernels have no dropout "
          f"on the weights (attention_impl='reference' has)")

  @classmethod
  def fields(cls, role: str) -> tuple[str, ...]:
    """The names of the fields of `role` (one of ROLES), in declaration order."""
    if role not in ROLES:
      raise ValueError(f"role: {role!r}, expected one of {ROLES}")
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata["role"] == role)

  @classmethod
  def record_fields(cls) -> tuple[str, ...]:
    """What a record holds: the architecture and parameters fields."""
    return cls.fields("architecture") + cls.fields("parameters")

  def to_dict(self) -> dict:
    """Every field, JSON-able (dtypes by name)."""
    return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

  def record(self) -> dict:
    """What the model is: its architecture and parameters fields, JSON-able. The weights of a
    model and this record rebuild it, whatever ran it (`from_record`)."""
    return {name: _plain(getattr(self, name)) for name in self.record_fields()}

  @classmethod
  def from_record(cls, record: dict, **settings) -> EncoderConfig:
    """The config of a model of `record` (`record()`), run as `settings` say: training and
    execution fields (dropout, dtype, attention_impl, remat), each defaulting to the
    library's. A setting of another role, or a field the record should not hold, is a
    ConfigError naming it."""
    own = set(cls.record_fields())
    free = set(cls.fields("training") + cls.fields("execution"))
    for name, value in settings.items():
      if name not in free:
        raise ConfigError(name, value, f"one of the settings a reader picks {sorted(free)}: "
                                       f"what the model is comes from its record")
    for name, value in record.items():
      if name not in own:
        raise ConfigError(name, value, f"a record of the fields {sorted(own)} only")
    return cls(**record, **settings)

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads

  def is_global(self, layer: int) -> bool:
    """Whether `layer` attends to the whole sequence (else to its local window)."""
    return not self.local_attention or layer % self.global_attention_every == 0

  @classmethod
  def base(cls, vocab_size: int, **overrides) -> EncoderConfig:
    """The paper's base model: d_model 512, 8 heads, d_ff 2048, 6 layers, dropout 0.1."""
    return cls(vocab_size=vocab_size, **overrides)

  @classmethod
  def big(cls, vocab_size: int, **overrides) -> EncoderConfig:
    """The paper's big model: d_model 1024, 16 heads, d_ff 4096, 6 layers, dropout 0.3."""
    sizes = dict(d_model=1024, n_heads=16, d_ff=4096, n_layers=6, dropout=0.3)
    return cls(vocab_size=vocab_size, **{**sizes, **overrides})
