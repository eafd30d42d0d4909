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
from typing import Any

import jax.numpy as jnp
import numpy as np

from flax_encoder import relative
from flax_encoder.activations import FEED_FORWARD
from flax_encoder.kernels import KERNELS, Kernel

NORM_POSITIONS = ("post", "pre")
NORM_TYPES = ("layer", "rms")  # LayerNorm; RMSNorm (no centring, no bias: T5's, Llama's)
POSITION_EMBEDDINGS = ("sinusoidal", "learned", "rotary", "none")
# The layer's dense modules, by name, and an untied masked-LM decoder's (EuroBERT's): what
# `EncoderConfig.unbiased` may list.
LAYER_DENSES = ("w_q", "w_k", "w_v", "w_o", "w_1", "w_2")
UNBIASED = (*LAYER_DENSES, "decoder")
ATTENTION_IMPLS = tuple(KERNELS)  # what each can do: kernels.KERNELS[name]
REMAT_POLICIES = ("none", "full", "save_dots")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


ROLES = ("architecture", "parameters", "training", "execution")
# Fields records held that are no longer fields, which `read_former_fields` reads as today's
# fields say them: runs saved then load as the model they were.
FORMER_FIELDS = ("relative_attention_buckets",)
# relative_attention_buckets = n > 0 (MPNet's bias): the relative attention part it is now.
FORMER_BUCKETS = "t5_bias,buckets={}"


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
  # Grouped-query attention: keys and values of this many heads, each shared by n_heads //
  # kv_heads query heads (EuroBERT's); 0: one per query head.
  kv_heads: int = _field(0, "architecture")
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
  # A relative attention scheme a family brings (flax_encoder.relative.PARTS), as its spec:
  # "t5_bias,buckets=32" (MPNet's), "disentangled,buckets=256,…" (DeBERTa's). "": none. Only
  # kernels that take a bias run it.
  relative_attention: str = _field("", "architecture")
  embedding_scale: bool = _field(True, "architecture")  # embeddings * sqrt(d_model) (paper)
  embedding_norm: bool = _field(False, "architecture")  # LayerNorm on the embeddings' sum (BERT)
  # ALBERT's switches. embedding_size > 0: the tables are that wide, and a dense layer
  # ("embedding_projection") maps their normalised sum to d_model (0: d_model wide, no
  # projection). shared_layers: one layer's parameters applied at every depth.
  embedding_size: int = _field(0, "architecture")
  shared_layers: bool = _field(False, "architecture")
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
  # The layers' dense modules that have no bias where dense_bias gives the others one, as a
  # comma-separated list of UNBIASED ("w_1": GTE's gate; "w_q,w_k,w_v,w_o,w_1,w_2":
  # NomicBERT's layers, whose heads have biases; "decoder": EuroBERT's masked-LM decoder).
  # `has_bias` says it for a module.
  unbiased: str = _field("", "architecture")
  norm_bias: bool = _field(True, "architecture")  # biases of every LayerNorm
  first_attention_norm: bool = _field(True, "architecture")  # Pre-LN: layer 0 normalises its
  #                                                             input (ModernBERT's does not)
  norm_position: str = _field("post", "architecture")  # "post": Add & Norm; "pre": x + f(norm(x))
  norm_type: str = _field("layer", "architecture")  # every norm's: one of NORM_TYPES
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
    if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, (int, np.integer)) or not (
        0 <= self.pad_id < self.vocab_size):
      raise ConfigError("pad_id", self.pad_id, f"an id in [0, vocab_size={self.vocab_size})")
    for name in ("position_offset", "type_vocab_size", "local_attention", "embedding_size",
                 "kv_heads"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ConfigError(name, value, "an integer >= 0")
    if self.n_heads % self.key_value_heads:
      raise ConfigError("kv_heads", self.kv_heads,
                        f"0 or a divisor of n_heads ({self.n_heads}): each key and value head "
                        f"serves as many query heads")
    if self.embedding_width % 2 and self.position_embedding == "sinusoidal":
      width = "embedding_size" if self.embedding_size else "d_model"
      raise ConfigError(width, getattr(self, width),
                        "an even number (sin/cos pairs of the positional encoding)")
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
    for name, allowed in (("norm_position", NORM_POSITIONS), ("norm_type", NORM_TYPES),
                          ("position_embedding", POSITION_EMBEDDINGS),
                          ("activation", FEED_FORWARD),
                          ("attention_impl", ATTENTION_IMPLS), ("remat", REMAT_POLICIES)):
      value = getattr(self, name)
      if value not in allowed:
        raise ConfigError(name, value, f"one of {allowed}")
    for name in ("final_norm", "embedding_scale", "embedding_norm", "glu", "dense_bias",
                 "norm_bias", "first_attention_norm", "scan_layers", "shared_layers"):
      if not isinstance(getattr(self, name), (bool, np.bool_)):
        raise ConfigError(name, getattr(self, name), "True or False")
    unknown = [n for n in self.unbiased_denses if n not in UNBIASED] if isinstance(
        self.unbiased, str) else [self.unbiased]
    if unknown:
      raise ConfigError("unbiased", self.unbiased,
                        f"a comma-separated list of {UNBIASED} (the layers' dense modules, "
                        f"an untied masked-LM decoder)")
    if self.relative_attention:
      try:
        spec = relative.part(self.relative_attention).spec() if isinstance(
            self.relative_attention, str) else None
      except ValueError as e:
        raise ConfigError("relative_attention", self.relative_attention, str(e)) from None
      if spec is None:
        raise ConfigError("relative_attention", self.relative_attention, "a string")
      object.__setattr__(self, "relative_attention", spec)
    self._check_together()
    object.__setattr__(self, "dtype", _canonical_dtype("dtype", self.dtype))
    object.__setattr__(self, "param_dtype", _canonical_dtype("param_dtype", self.param_dtype))
    self._check_kernel(KERNELS[self.attention_impl])

  def _check_together(self) -> None:
    """ConfigError for switches that only mean something together, set apart: a model nobody
    has, or one the layers' scan cannot run. One rule a line, naming the fields."""
    for field, wrong, expected in (
        ("position_offset", self.position_offset and self.position_embedding != "learned",
         "0 with position_embedding='sinusoidal' (an offset is a row of a learned table)"),
        ("norm_bias", self.norm_bias and self.norm_type == "rms",
         "False with norm_type='rms' (RMSNorm has a scale only)"),
        ("first_attention_norm", not self.first_attention_norm and self.norm_position != "pre",
         "True with norm_position='post' (a layer 0 without its attention norm is Pre-LN's)"),
        ("scan_layers", self.scan_layers and not self.first_attention_norm,
         "False: first_attention_norm=False makes layer 0 unlike the others, so the layers "
         "cannot be stacked for nn.scan"),
        ("scan_layers", self.scan_layers and self.shared_layers,
         "False with shared_layers=True (one layer's parameters: no stack of layers to scan)"),
        ("shared_layers", self.shared_layers and not self.first_attention_norm,
         "False with first_attention_norm=False (a layer 0 unlike the others shares nothing)"),
    ):
      if wrong:
        raise ConfigError(field, getattr(self, field), expected)

  def _check_kernel(self, kernel: Kernel) -> None:
    """ConfigError for what the attention kernel cannot do, as `kernels.KERNELS` declares it."""
    missing = kernel.unavailable()
    if missing:
      raise ConfigError("attention_impl", kernel.name, f"{kernel.fallback!r} here: {missing}")
    if kernel.dtypes and self.dtype.name not in kernel.dtypes:
      raise ConfigError(
          "attention_impl", kernel.name,
          f"{kernel.fallback!r} for dtype {self.dtype.name}: {kernel.title} ({kernel.name!r}) "
          f"needs dtype {' or '.join(kernel.dtypes)}")
    if self.local_attention and not kernel.takes_window:
      raise ConfigError("attention_impl", kernel.name,
                        f"{kernel.alternatives(lambda other: other.takes_window)} with "
                        f"local_attention: {kernel.title} takes no window")
    if self.relative_attention and not kernel.takes_bias:
      raise ConfigError("attention_impl", kernel.name,
                        f"{kernel.alternatives(lambda other: other.takes_bias)} with "
                        f"relative_attention={self.relative_attention.split(',')[0]!r}: "
                        f"{kernel.title} takes no bias on the attention scores")
    if not kernel.has_dropout and self.attention_dropout > 0:
      with_dropout = " or ".join(repr(k.name) for k in KERNELS.values() if k.has_dropout)
      raise ConfigError(
          "attention_dropout", self.attention_dropout,
          f"0 with attention_impl={kernel.name!r}: the fused kernels have no dropout on the "
          f"weights (attention_impl={with_dropout} has)")

  @classmethod
  def fields(cls, role: str) -> tuple[str, ...]:
    """The names of the fields of `role` (one of ROLES), in declaration order."""
    if role not in ROLES:
      raise ValueError(f"role: {role!r}, expected one of {ROLES}")
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata["role"] == role)

  @classmethod
  def defaults(cls) -> dict:
    """Each field that has a default (all but vocab_size) -> it, JSON-able (dtypes by name):
    what a program's config starts from (configs/default.py)."""
    plain = lambda v: v if isinstance(v, (bool, int, float, str)) else jnp.dtype(v).name  # noqa: E731
    return {f.name: plain(f.default) for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING}

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
    library's. A field records held before (FORMER_FIELDS) is read as today's fields say it;
    a setting of another role, or a field the record should not hold, is a ConfigError naming
    it."""
    own = set(cls.record_fields()) | set(FORMER_FIELDS)
    free = set(cls.fields("training") + cls.fields("execution"))
    for name, value in settings.items():
      if name not in free:
        raise ConfigError(name, value, f"one of the settings a reader picks {sorted(free)}: "
                                       f"what the model is comes from its record")
    for name, value in record.items():
      if name not in own:
        raise ConfigError(name, value, f"a record of the fields {sorted(own)} only")
    return cls(**read_former_fields(record), **settings)

  @property
  def embedding_width(self) -> int:
    """The width of the embedding tables: embedding_size where factorised, else d_model."""
    return self.embedding_size or self.d_model

  @property
  def unbiased_denses(self) -> tuple[str, ...]:
    """The layer's dense modules without a bias, as `unbiased` lists them."""
    return tuple(n.strip() for n in self.unbiased.split(",") if n.strip())

  def has_bias(self, dense: str) -> bool:
    """Whether the dense module named `dense` ('w_q' … 'w_2', a head's) has a bias."""
    return self.dense_bias and dense not in self.unbiased_denses

  @property
  def key_value_heads(self) -> int:
    """The heads of the keys and values: kv_heads, or n_heads where 0."""
    return self.kv_heads or self.n_heads

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads

  def is_global(self, layer: int) -> bool:
    """Whether `layer` attends to the whole sequence (else to its local window)."""
    return not self.local_attention or layer % self.global_attention_every == 0

  @property
  def global_layers(self) -> tuple[bool, ...]:
    """Per layer, whether it is global (`is_global`): which layers are, as data
    (transformers' `layer_types`, full_attention or sliding_attention)."""
    return tuple(self.is_global(i) for i in range(self.n_layers))

  @classmethod
  def base(cls, vocab_size: int, **overrides) -> EncoderConfig:
    """The paper's base model: d_model 512, 8 heads, d_ff 2048, 6 layers, dropout 0.1."""
    return cls(vocab_size=vocab_size, **overrides)

  @classmethod
  def big(cls, vocab_size: int, **overrides) -> EncoderConfig:
    """The paper's big model: d_model 1024, 16 heads, d_ff 4096, 6 layers, dropout 0.3."""
    sizes = dict(d_model=1024, n_heads=16, d_ff=4096, n_layers=6, dropout=0.3)
    return cls(vocab_size=vocab_size, **{**sizes, **overrides})


def read_former_fields(fields: dict) -> dict:
  """`fields` (EncoderConfig's, by name) with those of FORMER_FIELDS read as today's: a
  relative_attention_buckets of n > 0 as relative_attention FORMER_BUCKETS of n, 0 as none.
  ConfigError naming the field where its value says no model."""
  fields = dict(fields)
  buckets = fields.pop("relative_attention_buckets", 0)
  if isinstance(buckets, bool) or not isinstance(buckets, (int, np.integer)) or buckets < 0:
    raise ConfigError("relative_attention_buckets", buckets, "an integer >= 0")
  if buckets:
    spec = FORMER_BUCKETS.format(buckets)
    try:
      relative.part(spec)
    except ValueError as e:
      raise ConfigError("relative_attention_buckets", buckets, f"0, or N of {e}") from None
    if fields.get("relative_attention"):
      raise ConfigError("relative_attention", fields["relative_attention"],
                        "'' with relative_attention_buckets > 0 (one relative position scheme)")
    fields["relative_attention"] = spec
  return fields

