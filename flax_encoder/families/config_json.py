"""config.json <-> EncoderConfig, through the family of its model_type.

Each config.json field read is of the kind transformers' config class takes, with transformers'
default where it is absent (else an HFError naming the field and the file); a `model_type` or
an option transformers computes otherwise is refused, naming it: never a silently different
model.
"""

from __future__ import annotations

from collections.abc import Mapping

from flax_encoder.families import registry
from flax_encoder.config import EncoderConfig
from flax_encoder.families.family import ACTIVATIONS, HIDDEN_ACTS, Family, Fields, HFError
from flax_encoder.kernels import KERNELS


def config_from_hf(hf: Mapping, *, file: str = "config.json", **settings) -> EncoderConfig:
  """The EncoderConfig of a config.json's contents (`hf`, read from `file`, which errors
  name), run as `settings` say (dtype, param_dtype, attention_impl, scan_layers, remat,
  dropout …). The checkpoint's dropout rates are the defaults; attention dropout only with
  an attention implementation that has it."""
  fields = Fields(hf, file)
  model_type = fields.choice("model_type", None, registry.MODEL_TYPES)
  family = registry.MODEL_TYPES[model_type]
  where = f"{file} ({model_type})"

  def refuse(option, value, expected):
    raise HFError(f"{where}: {option}={value!r} is not supported (expected {expected}); "
                  f"flax-encoder would compute another model")

  for option in ("is_decoder", "add_cross_attention"):
    if fields.flag(option, False):
      refuse(option, True, False)
  for option, (default, value) in family.fixed.items():
    fields.choice(option, default, (value,))
  fields.flag("tie_word_embeddings", True)  # read with the masked-LM head (tensors._check_tied)
  names = family.sizes
  d_model, n_heads, d_ff, n_layers = (fields.integer(name) for name in names)
  if d_model % n_heads:
    raise fields.error(names[0], f"a multiple of {names[1]}={n_heads}")
  sizes = dict(vocab_size=fields.integer("vocab_size"), d_model=d_model, n_heads=n_heads,
               d_ff=d_ff, n_layers=n_layers)
  sizes["pad_id"] = _pad_id(fields, family, sizes["vocab_size"])
  act, arch, rates = family.read(fields, refuse, model_type, sizes)
  kernel = KERNELS.get(settings.get("attention_impl", "reference"))
  if kernel is not None and not kernel.has_dropout:
    rates["attention_dropout"] = 0.0
  settings = {**rates, **settings}
  try:
    return family.preset(activation=ACTIVATIONS[act], **sizes, **arch, **settings)
  except ValueError as e:  # ConfigError: a combination of fields, or a setting
    raise HFError(f"{where}: {e}") from None


def _pad_id(fields: Fields, family: Family, vocab_size: int) -> int:
  """The padding id: config.json's pad_token_id, transformers' default where it has none, 0
  where it is null (transformers then has no padding row; the caller's mask decides)."""
  if "pad_token_id" in fields.hf and fields.get("pad_token_id") is None and family.null_pad_id:
    return 0
  return fields.integer("pad_token_id", family.pad_id,
                        f"an id in [0, vocab_size={vocab_size})", lambda i: 0 <= i < vocab_size)


def hf_config(config: EncoderConfig, family: str, **extra) -> dict:
  """The config.json contents of `config` as a transformers `family` model ('bert',
  'roberta', 'distilbert', 'modernbert', 'albert'); `extra` entries (architectures, id2label
  …) are added. HFError naming the fields that differ where `config` is not such a model."""
  family = registry.get(family)
  want = family.expected(config)
  if family.token_types and config.type_vocab_size < 1:
    raise HFError(f"this model is not a {family.name} model: it has type_vocab_size=0, a "
                  f"{family.name} model at least 1")
  wrong = {k: getattr(config, k) for k, v in want.items() if getattr(config, k) != v}
  if wrong:
    raise HFError(f"this model is not a {family.name} model: it has "
                  f"{', '.join(f'{k}={v!r}' for k, v in wrong.items())}, a {family.name} model "
                  f"{', '.join(f'{k}={want[k]!r}' for k in wrong)}")
  out = family.write(config, HIDDEN_ACTS[config.activation])
  return {"tie_word_embeddings": True, **out, **extra}  # EuroBERT's write says it is not
