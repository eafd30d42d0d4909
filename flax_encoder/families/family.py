"""What a Hugging Face model family supplies (`Family`), and the config.json field reader the
families share (`Fields`).

A family is one module of this folder holding one `Family`: the model_types it reads, its
preset (`bert.preset` …) and which of its fields make a model of the family, config.json
both ways, its tensor names both ways, its heads, its default fine-tuning pooling, its
sequence classifier's layout, its parity stages and its tokenizers (`Tokenizers`). Code
outside the folder asks the family (`families.get(name)`) and never compares a family's name.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from flax_encoder import activations
from flax_encoder.config import EncoderConfig

# transformers' hidden_act -> EncoderConfig.activation, and back
ACTIVATIONS, HIDDEN_ACTS = activations.TRANSFORMERS, activations.HIDDEN_ACTS


class HFError(ValueError):
  """A directory, or an option in its config.json, that load_hf cannot take."""


class Fields:
  """The fields of a config.json (or of one object in it, `within`), each read as the kind of
  value transformers' config class holds there: anything else is an HFError naming the field
  and the file, never a value transformers would read differently."""

  def __init__(self, hf: Mapping, file: str, within: str = ""):
    self.hf, self.file, self.within = hf, file, within

  def error(self, key: str, expected: str) -> HFError:
    got = f"={self.hf[key]!r}" if key in self.hf else " missing"
    return HFError(f"{self.file}: {self.within}{key}{got}, expected {expected}")

  def get(self, key: str, default=None):
    return self.hf.get(key, default)

  def integer(self, key: str, default=None, expected: str = "an integer >= 1",
              ok=lambda n: n >= 1) -> int:
    value = self.hf.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not ok(value):
      raise self.error(key, expected)
    return value

  def number(self, key: str, default, expected: str = "a number > 0",
             ok=lambda x: x > 0) -> float:
    value = self.hf.get(key, default)
    if (isinstance(value, bool) or not isinstance(value, (int, float))
        or not abs(value) <= sys.float_info.max or not ok(value)):  # NaN and inf fail too
      raise self.error(key, expected)
    return float(value)

  def rate(self, key: str, default: float) -> float:
    return self.number(key, default, "a number in [0, 1)", lambda x: 0 <= x < 1)

  def flag(self, key: str, default: bool) -> bool:
    value = self.hf.get(key, default)
    if not isinstance(value, bool):
      raise self.error(key, "true or false")
    return value

  def choice(self, key: str, default, allowed) -> str:
    value = self.hf.get(key, default)
    if not isinstance(value, str) or value not in allowed:
      raise self.error(key, f"one of {sorted(allowed)}")
    return value


# refuse(option, value, expected): an HFError saying transformers computes another model.
Refuse = Callable[[str, Any, str], None]
@dataclasses.dataclass(frozen=True)
class Chunks:
  """A dense module stored as `name` with its outputs in equal chunks of another order: ours
  are its chunks `order[0]`, `order[1]` … (GTE's up_gate_proj holds the gated feed-forward's
  up projection first, the encoder's w_1 the gate first: order (1, 0))."""
  name: str
  order: tuple[int, ...]


# (flax path under params, module name within the encoder) of each of the encoder's modules;
# a tuple of names for a dense module whose outputs are those modules' stacked (NomicBERT's
# w_1: its fc12's, the gate, then its fc11's), or Chunks.
Names = Callable[[EncoderConfig], Iterator[tuple[tuple, str | tuple[str, ...] | Chunks]]]
# (stage, Flax module path, transformers module name) of a model of n_layers, in forward order;
# a transformers module that runs at several depths (ALBERT's shared layer) is named once per
# call, its k-th stage compared with its k-th call.
Stages = Callable[[int], list[tuple[str, str, str]]]


def post_ln_stages(layers: str, attention: str) -> Stages:
  """The parity stages of a Post-LN family whose layer i is f"{layers}{i}" and whose attention
  sub-layer, after its LayerNorm, is that layer's `attention` module: the embeddings, then per
  layer the attention sub-layer and the layer."""

  def stages(n_layers: int) -> list[tuple[str, str, str]]:
    points = [("embeddings", "embedding_norm", "embeddings")]
    for i in range(n_layers):
      layer = f"{layers}{i}"
      points += [(f"{layer}.{attention}", f"layers_{i}/norm1", f"{layer}.{attention}"),
                 (layer, f"layers_{i}", layer)]
    return points

  return stages


@dataclasses.dataclass(frozen=True)
class SequenceClassifier:
  """transformers' *ForSequenceClassification of a family: the run's poolings it computes and
  where its dense layers sit."""
  poolings: tuple[str, ...]  # config.task.pooling values it computes
  pools: str  # how it pools, as an error says it: "by 'pooler'"
  # (its state dict name, the run's path under its params) of each dense layer, in order
  denses: tuple[tuple[str, tuple[str, ...]], ...]
  from_pooler: bool = False  # the checkpoint's pooler is its first dense (BERT's)
  # config.json entries that say the run's pooling (ModernBERT's classifier_pooling)
  config: Callable[[str], dict] = lambda pooling: {}

  def check(self, pooling: str, stem: str) -> None:
    """HFError where the run's `pooling` is not one transformers' classifier computes."""
    if pooling not in self.poolings:
      raise HFError(f"the run pools by {pooling!r}; transformers' "
                    f"{stem}ForSequenceClassification pools {self.pools} "
                    f"(config.task.pooling={' or '.join(map(repr, self.poolings))})")


@dataclasses.dataclass(frozen=True)
class SlowTokenizer:
  """A tokenizer transformers builds from files of a family's own where a directory has no
  tokenizer.json (DeBERTa's spm.model): the files, all present, and the builder of its
  tokenizer.json from the directory holding them (flax_encoder.hf_tokenizer asks for it)."""
  files: tuple[str, ...]
  build: Callable[[str], bytes]  # directory -> tokenizer.json's bytes (TokenizerError)


@dataclasses.dataclass(frozen=True)
class Tokenizers:
  """transformers 5's tokenizers of a family's models (flax_encoder.cross_encoder reads them
  for a pair's token types)."""
  # model_type -> the class (tokenizer_config.json's tokenizer_class, less "Fast") transformers
  # picks where a directory names none (its TOKENIZER_MAPPING_NAMES), for each type it reads
  classes: Mapping[str, str]
  # the classes the family claims -> whether they give the model token_type_ids (their
  # model_input_names); a class shared by families (BertTokenizer) is claimed by one
  token_types: Mapping[str, bool]
  slow: SlowTokenizer | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Family:
  """One Hugging Face model family: a preset of EncoderConfig plus all the family knows."""
  name: str  # the model_type it writes
  title: str  # as its paper spells it: "RoBERTa"
  stem: str  # of transformers' classes: "Roberta" (RobertaModel, RobertaForMaskedLM …)
  # Each model_type it reads -> the encoder's prefix inside that type's *For… models.
  model_types: Mapping[str, str]

  # config.json -> EncoderConfig
  preset: Callable[..., EncoderConfig]  # (vocab_size, **overrides): the family's switches
  sizes: tuple[str, str, str, str]  # config.json's names of d_model, n_heads, d_ff, n_layers
  pad_id: int  # transformers' pad_token_id where config.json has none
  null_pad_id: bool = True  # a null pad_token_id reads as 0 (RoBERTa's positions need one)
  # Options read first, each of which only one value computes this model: name -> (default,
  # the value).
  fixed: Mapping[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)
  # config.json -> (activation, the preset's fields besides sizes and pad_id, dropout rates)
  read: Callable[[Fields, Refuse, str, dict], tuple[str, dict, dict]]

  # EncoderConfig -> config.json
  switches: tuple[str, ...]  # the fields a model of the family has as its preset has them
  token_types: bool = False  # its models have token-type embeddings (at least one type)
  write: Callable[[EncoderConfig, str], dict]  # (config, hidden_act) -> its config.json fields
  carried: tuple[str, ...] = ()  # entries an export keeps of the config.json it started from

  # tensors, by their names in transformers' state dicts
  names: Names  # the encoder's modules
  word_embeddings: str  # the table the masked-LM decoder is tied to
  layers: str  # where layer i's modules are: f"{layers}{i}." (ALBERT's shared one: i = 0)
  qkv: str | None = None  # layer {i}'s q, k and v in one matrix (ModernBERT's Wqkv)
  # the masked-LM head's dense, norm and output bias (BERT's head); or, with untied_decoder,
  # its one dense layer to the vocabulary ({("decoder",): …}: EuroBERT's lm_head)
  masked_lm: Mapping[tuple, str]
  untied_decoder: bool = False
  decoder: str  # the masked-LM decoder, tied to the word embeddings
  decoder_bias: bool = False  # the decoder holds the output bias too (BERT's)
  prediction_head: Mapping[tuple, str] | None = None  # ModernBERT's dense and norm
  pooler: str = "pooler.dense"  # the pooler's dense layer, under the encoder's prefix
  # Parts of tensor names that make another model than transformers' (Jina v3's task LoRA
  # adapters): weights holding one are refused, naming it.
  refused_weights: tuple[str, ...] = ()

  # fine-tuning
  pooling: Callable[[Mapping], str]  # the default config.task.pooling, of its config.json
  classifier: SequenceClassifier
  tags_through_head: bool = False  # its token classifier applies the prediction head

  # parity against transformers (flax_encoder.pytorch.hf_parity)
  stages: Stages

  # transformers' tokenizers of its models
  tokenizers: Tokenizers

  @property
  def prefix(self) -> str:
    """The encoder's prefix inside the family's *For… models ('bert.')."""
    return self.model_types[self.name]

  def expected(self, config: EncoderConfig) -> dict:
    """The switches' values of a model of the family with `config`'s ids."""
    preset = self.preset(config.vocab_size, pad_id=config.pad_id)
    return {name: getattr(preset, name) for name in self.switches}
