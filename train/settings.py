"""From the config as given and the data to the typed values a run is built from; the checks
that come before anything is built.

The ConfigDict from the command line is read, never written back: what the run derives (the
vocabulary from the data, the encoder's config) is returned here as a value and passed to
whoever needs it, so no function depends on another having run first. `check` looks at every
field before the run builds anything; `changes` tells what differs from the config a run's
checkpoint records.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable

import ml_collections
import numpy as np

from flax_encoder import EncoderConfig
from train.errors import RunError
from train.optim import RECIPES
from train.tokens import BYTE_VOCAB_SIZE, PAD_ID


def encoder_config(model: ml_collections.ConfigDict, vocab_size: int, source: str,
                   seq_len: int) -> EncoderConfig:
  """config.model with the data's vocabulary -> EncoderConfig.

  An explicit config.model.vocab_size must agree with the data's (`source` names it), and the
  windows (`seq_len`) must fit the positional table.
  """
  fields = model.to_dict()
  given = fields.pop("vocab_size", None)
  if given is not None and given != vocab_size:
    raise RunError(f"config.model.vocab_size: {given}, expected the data's {vocab_size} "
                   f"({source}); leave it unset to take the data's")
  cfg = _encoder(fields, vocab_size)
  if seq_len > cfg.max_len:
    raise RunError(f"config.train.seq_len: {seq_len}, expected <= config.model.max_len "
                   f"({cfg.max_len})")
  return cfg


def _encoder(fields: dict, vocab_size: int) -> EncoderConfig:
  """EncoderConfig(fields), its complaints about a field said as the config's field."""
  try:
    return EncoderConfig(vocab_size=vocab_size, pad_id=PAD_ID, **fields)
  except ValueError as e:
    message = str(e)
    named = re.match(r"EncoderConfig\.(\w+)", message)
    if named is None:
      raise RunError(f"config.model: {message}") from None
    field = named.group(1)
    rest = message[named.end():]
    must = re.match(r" must (?:be )?(.*?)(?:, got .*)?$", rest)
    expected = f"expected {must.group(1)}" if must else rest.lstrip("=").split(" ", 1)[-1]
    raise RunError(f"config.model.{field}: {fields.get(field)!r}, {expected}") from None


def encoder_record(cfg: EncoderConfig) -> dict:
  """An EncoderConfig as JSON-able fields (dtypes by name); EncoderConfig(**record) rebuilds it."""
  fields = dataclasses.asdict(cfg)
  return {k: np.dtype(v).name if k in ("dtype", "param_dtype") else v for k, v in fields.items()}


# ---------------------------------------------------------------------------------------------
# Every field's type and range, checked before anything is built.

Check = Callable[[object], "str | None"]  # value -> what was expected, or None if it is fine


def _integer(minimum: int) -> Check:
  def check(value):
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= minimum
    return None if ok else f"an integer >= {minimum}"
  return check


def _number(low: float, high: float | None = None, low_open=True, high_open=False) -> Check:
  if high is None:
    wanted = f"a number {'>' if low_open else '>='} {low:g}"
  else:
    wanted = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

  def check(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      return wanted
    above = value > low if low_open else value >= low
    below = high is None or (value < high if high_open else value <= high)
    return None if above and below else wanted
  return check


def _choice(allowed: tuple[str, ...]) -> Check:
  return lambda value: None if value in allowed else f"one of {allowed}"


def _optional(check: Check) -> Check:
  return lambda value: None if value is None else check(value)


def _boolean(value):
  return None if isinstance(value, bool) else "True or False"


def _mesh_axis(value):
  ok = isinstance(value, int) and not isinstance(value, bool) and (value == -1 or value >= 1)
  return None if ok else "a positive integer, or -1 for the devices left over"


def _string(value):
  return None if isinstance(value, str) and value else "a non-empty string"


def _paths(value):
  ok = isinstance(value, (tuple, list)) and all(isinstance(p, str) and p for p in value)
  return None if ok else "a tuple of file paths"


_COMMON: dict[str, Check] = {
    "train.num_steps": _integer(1),
    "train.batch_size": _integer(1),
    "train.seq_len": _integer(2),
    "train.seed": _integer(0),
    "train.log_every": _integer(1),
    "train.eval_every": _integer(1),
    "train.checkpoint_every": _integer(1),
    "train.keep_checkpoints": _integer(1),
    "train.grad_accum_steps": _integer(1),
    "train.profile_start": _integer(1),
    "train.profile_steps": _integer(0),
    "data.workers": _integer(0),
    "optim.recipe": _choice(RECIPES),
    "optim.warmup_steps": _integer(1),
    "optim.learning_rate": _number(0),
    "optim.weight_decay": _number(0, low_open=False),
    "optim.lr_scale": _number(0),
    "optim.b1": _number(0, 1, low_open=False, high_open=True),
    "optim.b2": _number(0, 1, low_open=False, high_open=True),
    "optim.eps": _number(0),
    "optim.label_smoothing": _number(0, 1, low_open=False, high_open=True),
    "optim.clip_norm": _optional(_number(0)),
    "mesh.data": _mesh_axis,
    "mesh.fsdp": _mesh_axis,
}

_TASKS: dict[str, dict[str, Check]] = {
    "masked_lm": {
        "task.name": _string,
        "task.mask_rate": _number(0, 1),
        "task.max_predictions_per_seq": _optional(_integer(1)),
        "task.tie_embeddings": _boolean,
        "task.cross_document_attention": _boolean,
        "data.prepared": _optional(_string),
        "data.weights": _optional(_string),
        "data.paths": _paths,
        "data.eval_fraction": _number(0, 1, high_open=True),
        "data.max_eval_windows": _integer(1),
    },
    "classify": {
        "task.name": _string,
        "task.pooling": _choice(("mean", "first")),
        "data.train": _string,
        "data.eval": _string,
        "data.tokenizer": _optional(_string),
        "data.text_field": _string,
        "data.pair_field": _string,
        "data.label_field": _string,
        "data.id_offset": _integer(0),
        "data.pad_id": _integer(0),
        "data.separator_id": _integer(0),
        "init.run": _optional(_string),
        "init.torch_checkpoint": _optional(_string),
        "init.n_heads": _optional(_integer(1)),
        "init.prefix": lambda value: None if isinstance(value, str) else "a string",
        "init.torch_head": _optional(_string),
    },
}


def flatten(config: ml_collections.ConfigDict | dict) -> dict:
  """{'section.field': value} of a config two levels deep (sequences as tuples)."""
  config = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
  flat = {}
  for section, fields in config.items():
    for name, value in fields.items():
      flat[f"{section}.{name}"] = tuple(value) if isinstance(value, list) else value
  return flat


def check(config: ml_collections.ConfigDict) -> None:
  """Raises RunError naming the first field whose type or range is wrong, or that the program
  does not know (a field the model does not have, say)."""
  flat = flatten(config)
  task = flat.get("task.name")
  if task not in _TASKS:
    raise RunError(f"config.task.name: {task!r}, expected one of {tuple(_TASKS)}")
  checks = {**_COMMON, **_TASKS[task]}
  model_fields = {f"model.{f.name}" for f in dataclasses.fields(EncoderConfig)} - {"model.pad_id"}
  for field in flat:
    if field not in checks and field not in model_fields:
      raise RunError(f"config.{field}: unknown field, expected one of the fields "
                     f"configs/default.py defines")
  for field, check_value in checks.items():
    if field not in flat:
      raise RunError(f"config.{field}: missing, expected a value (configs/default.py's is "
                     f"a start)")
    expected = check_value(flat[field])
    if expected is not None:
      raise RunError(f"config.{field}: {flat[field]!r}, expected {expected}")
  if config.optim.recipe == "adamw" and config.optim.warmup_steps >= config.train.num_steps:
    raise RunError(f"config.optim.warmup_steps: {config.optim.warmup_steps}, expected fewer "
                   f"than config.train.num_steps ({config.train.num_steps}) for the linear decay")
  if config.train.batch_size % config.train.grad_accum_steps:
    raise RunError(f"config.train.grad_accum_steps: {config.train.grad_accum_steps}, expected a "
                   f"divisor of config.train.batch_size ({config.train.batch_size})")
  if task == "classify":
    _check_init(config.init)
  # Unset fields: the data's, a pretrained encoder's, or the defaults (train.classify).
  model = {k: v for k, v in config.model.to_dict().items() if v is not None}
  vocab_size = model.pop("vocab_size", None)
  if vocab_size is not None and _integer(1)(vocab_size):
    raise RunError(f"config.model.vocab_size: {vocab_size!r}, expected unset (the data's) or "
                   f"a positive integer")
  cfg = _encoder(model, vocab_size or BYTE_VOCAB_SIZE)
  if "max_len" in model and config.train.seq_len > cfg.max_len:
    raise RunError(f"config.train.seq_len: {config.train.seq_len}, expected <= "
                   f"config.model.max_len ({cfg.max_len})")


def _check_init(init) -> None:
  if init.run and init.torch_checkpoint:
    raise RunError(f"config.init.torch_checkpoint: {init.torch_checkpoint!r}, expected unset "
                   f"with config.init.run ({init.run!r}): the encoder starts from one of them")
  if init.torch_checkpoint and init.n_heads is None:
    raise RunError("config.init.n_heads: unset, expected the PyTorch encoder's number of heads "
                   "(the weights' shapes do not show it)")
  if init.torch_head and not init.torch_checkpoint:
    raise RunError(f"config.init.torch_head: {init.torch_head!r}, expected it only with "
                   f"config.init.torch_checkpoint")


# ---------------------------------------------------------------------------------------------
# What may change when a run resumes.

# Settings a resumed run may change without a word: how long it runs, how often it logs,
# evaluates, saves and profiles, and how the same step is laid out on the hardware (mesh,
# microbatches, rematerialisation, attention kernel). Every other field changes what the run
# computes, so a change needs --allow_changes.
MAY_CHANGE = frozenset({
    "train.num_steps", "train.log_every", "train.eval_every", "train.checkpoint_every",
    "train.keep_checkpoints", "train.grad_accum_steps", "train.profile_start",
    "train.profile_steps", "data.workers", "data.max_eval_windows", "mesh.data", "mesh.fsdp",
    "model.remat", "model.attention_impl",
})
# Fields that fix the shapes or structure of the saved state: a change cannot resume at all.
SHAPES = frozenset({
    "model.vocab_size", "model.d_model", "model.d_ff", "model.n_layers", "model.scan_layers",
    "model.param_dtype", "model.final_norm", "task.name", "task.tie_embeddings",
})


@dataclasses.dataclass(frozen=True)
class Change:
  field: str
  recorded: object
  current: object

  def __str__(self) -> str:
    return f"config.{self.field}: {self.current!r} (the checkpoint has {self.recorded!r})"


def changes(recorded_json: str, config: ml_collections.ConfigDict) -> list[Change]:
  """The fields of `config` that differ from the config a checkpoint recorded (as JSON)."""
  recorded = flatten(json.loads(recorded_json))
  current = flatten(json.loads(config.to_json()))
  return [Change(field, recorded.get(field), current.get(field))
          for field in sorted(set(recorded) | set(current))
          if recorded.get(field) != current.get(field)]


def check_resume(recorded_json: str, config: ml_collections.ConfigDict, step: int,
                 allow_changes: bool) -> list[Change]:
  """The changes a resumed run makes to the checkpoint's config; RunError for a change that
  cannot resume, or that changes the run without `allow_changes`."""
  found = [c for c in changes(recorded_json, config) if c.field not in MAY_CHANGE]
  more = lambda rest: f" (and {len(rest)} more: {', '.join(c.field for c in rest)})" if rest else ""
  fixed = [c for c in found if c.field in SHAPES]
  if fixed:
    raise RunError(f"{fixed[0]}{more(fixed[1:])}: the run's checkpoints (step {step}) cannot "
                   f"resume with it; use the run's value, or train in a new workdir")
  if found and not allow_changes:
    raise RunError(f"{found[0]}{more(found[1:])}: resuming would change the run its checkpoint "
                   f"(step {step}) belongs to; use the run's value, train in a new workdir, or "
                   f"pass --allow_changes to resume with the change")
  return found
