"""From the config as given and the data to the typed values a run is built from; the checks
that come before anything is built.

The ConfigDict from the command line is read, never written back: what the run derives (the
vocabulary from the data, the encoder's config) is returned here as a value and passed to
whoever needs it, so no function depends on another having run first. `check` looks at every
field before the run builds anything; `check_resume` tells what differs from the config a
run's checkpoint records, and whether the run may resume with it. Which fields may change on
resume is said once, by each field (`train.task.Field`); the model's follow from the roles of
EncoderConfig's fields.
"""

from __future__ import annotations

import dataclasses
import json
import math
from fractions import Fraction

import ml_collections

from flax_encoder import ConfigError, EncoderConfig
from train.data.tokens import PAD_ID
from train.errors import RunError
from train.run import optim
from train.task import (CHANGES_RUN, FIXES_STATE, FREE, Definition, Field, boolean, choice,
                        integer, number, optional, string)


def encoder_config(model: ml_collections.ConfigDict, vocab_size: int, source: str,
                   seq_len: int, given: dict | None = None) -> EncoderConfig:
  """config.model (its fields that are set, over `given`) with the data's vocabulary ->
  EncoderConfig.

  An explicit config.model.vocab_size must agree with the data's (`source` names it), and the
  windows (`seq_len`) must fit the positional table.
  """
  fields = {**(given or {}), **{k: v for k, v in model.to_dict().items() if v is not None}}
  explicit = fields.pop("vocab_size", None)
  if explicit is not None and explicit != vocab_size:
    raise RunError(f"config.model.vocab_size: {explicit}, expected the data's {vocab_size} "
                   f"({source}); leave it unset to take the data's")
  return build_encoder(fields, vocab_size, PAD_ID, seq_len)


def build_encoder(fields: dict, vocab_size: int, pad_id: int, seq_len: int) -> EncoderConfig:
  """EncoderConfig(fields), its complaint about a field said as the config's field, for
  windows of `seq_len` ids (the positional table must hold them)."""
  try:
    cfg = EncoderConfig(vocab_size=vocab_size, pad_id=pad_id, **fields)
  except ConfigError as e:
    raise RunError(f"config.model.{e.field}: {e.value!r}, expected {e.expected}") from None
  check_seq_len(cfg, seq_len)
  return cfg


def check_seq_len(cfg: EncoderConfig, seq_len: int) -> None:
  """RunError unless windows of `seq_len` fit `cfg`'s positions and its attention kernel."""
  if seq_len > cfg.max_len:
    raise RunError(f"config.train.seq_len: {seq_len}, expected <= config.model.max_len "
                   f"({cfg.max_len})")
  _check_kernel(cfg, seq_len)


def _check_kernel(cfg: EncoderConfig, seq_len: int) -> None:
  """RunError if the attention kernel of `cfg` cannot run on this backend or take windows of
  `seq_len` (flax_encoder.kernels.KERNELS declares what each can)."""
  from flax_encoder.kernels import KERNELS
  kernel = KERNELS[cfg.attention_impl]
  try:
    kernel.check_backend(offer_interpret=False)
  except ValueError as e:
    raise RunError(f"config.model.attention_impl: {cfg.attention_impl!r} needs another "
                   f"backend: {e}") from None
  try:
    kernel.check_length(seq_len)
  except ValueError as e:
    raise RunError(f"config.train.seq_len: {seq_len}, expected one "
                   f"attention_impl={cfg.attention_impl!r} takes ({e})") from None


# ---------------------------------------------------------------------------------------------
# Every field's type and range, checked before anything is built, and what a change to it
# does to a run that resumes.


def _mesh_axis(value):
  ok = isinstance(value, int) and not isinstance(value, bool) and (value == -1 or value >= 1)
  return None if ok else "a positive integer, or -1 for the devices left over"


# The step lives in the state as an int32, as does optax's count that the schedules read: a
# run of more steps would overflow them (an OverflowError once the workdir is made).
MAX_STEPS = 2**31 - 1
_COUNTED = f"at most {MAX_STEPS:,} (the steps an int32 step counter holds)"


def _num_steps(value):
  expected = integer(1)(value)
  return expected or (f"an integer >= 1 and {_COUNTED}" if value > MAX_STEPS else None)


def _epochs(value):
  # A bound on the field alone, checked before anything is made; `length` checks the steps the
  # epochs come to once the data is counted.
  expected = number(0)(value)
  return expected or (f"a number > 0 and {_COUNTED}" if value > MAX_STEPS else None)


COMMON: dict[str, Field] = {
    "task.name": Field(string, FIXES_STATE),
    "train.num_steps": Field(optional(_num_steps), FREE),
    "train.epochs": Field(optional(_epochs), FREE),
    "train.batch_size": Field(integer(1)),
    "train.seq_len": Field(integer(2)),
    "train.seed": Field(integer(0)),
    "train.log_every": Field(integer(1), FREE),
    "train.eval_every": Field(optional(integer(1)), FREE),
    "train.eval_at_start": Field(boolean, FREE),
    "train.checkpoint_every": Field(optional(integer(1)), FREE),
    "train.keep_checkpoints": Field(integer(1), FREE),
    "train.grad_accum_steps": Field(integer(1), FREE),
    "train.profile_start": Field(integer(1), FREE),
    "train.profile_steps": Field(integer(0), FREE),
    "data.workers": Field(integer(0), FREE),
    # Unset: the recipe's for where the encoder starts (train.run.optim.resolve).
    "optim.recipe": Field(optional(choice(optim.RECIPES))),
    "optim.warmup_steps": Field(optional(integer(1))),
    "optim.learning_rate": Field(optional(number(0))),
    "optim.weight_decay": Field(optional(number(0, low_open=False))),
    "optim.lr_scale": Field(number(0)),
    "optim.b1": Field(number(0, 1, low_open=False, high_open=True)),
    "optim.b2": Field(number(0, 1, low_open=False, high_open=True)),
    "optim.eps": Field(number(0)),
    "optim.label_smoothing": Field(number(0, 1, low_open=False, high_open=True)),
    "optim.clip_norm": Field(optional(number(0))),
    "mesh.data": Field(_mesh_axis, FREE),
    "mesh.fsdp": Field(_mesh_axis, FREE),
}

# The model's fields by what their role in EncoderConfig makes a change on resume: how the
# step runs is free, what training does changes the run, what the model is and how its
# parameters are stored is the checkpoint's. pad_id is the data's, never the config's.
_MODEL_RESUME = {"execution": FREE, "training": CHANGES_RUN, "architecture": FIXES_STATE,
                 "parameters": FIXES_STATE}
MODEL: dict[str, str] = {f"model.{name}": resume for role, resume in _MODEL_RESUME.items()
                         for name in EncoderConfig.fields(role) if name != "pad_id"}


def flatten(config: ml_collections.ConfigDict | dict) -> dict:
  """{'section.field': value} of a config two levels deep (sequences as tuples)."""
  config = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
  flat = {}
  for section, fields in config.items():
    for name, value in fields.items():
      flat[f"{section}.{name}"] = tuple(value) if isinstance(value, list) else value
  return flat


def check(config: ml_collections.ConfigDict, task: Definition) -> None:
  """Raises RunError naming the first field whose type or range is wrong, or that the program
  does not know (a field the model does not have, say). `task`: config.task.name's
  (`train.tasks.checked` finds it and calls this)."""
  flat = flatten(config)
  fields = {**COMMON, **task.fields}
  for field in flat:
    if field not in fields and field not in MODEL:
      raise RunError(f"config.{field}: unknown field, expected one of the fields "
                     f"configs/default.py defines")
  for field, spec in fields.items():
    if field not in flat:
      raise RunError(f"config.{field}: missing, expected a value (configs/default.py's is "
                     f"a start)")
    expected = spec.check(flat[field])
    if expected is not None:
      raise RunError(f"config.{field}: {flat[field]!r}, expected {expected}")
  check_length(config.train)
  if config.train.batch_size % config.train.grad_accum_steps:
    raise RunError(f"config.train.grad_accum_steps: {config.train.grad_accum_steps}, expected a "
                   f"divisor of config.train.batch_size ({config.train.batch_size})")
  if task.check is not None:
    task.check(config)
  _check_model(config)


def _check_model(config) -> None:
  """The model's fields, where the config sets them all; a task whose encoder comes from a
  checkpoint leaves some unset, and its setup checks them with what the checkpoint brings."""
  model = config.model.to_dict()
  vocab_size = model.pop("vocab_size", None)
  if vocab_size is not None and integer(1)(vocab_size):
    raise RunError(f"config.model.vocab_size: {vocab_size!r}, expected unset (the data's) or "
                   f"a positive integer")
  if any(value is None for value in model.values()):
    return
  build_encoder(model, vocab_size or PAD_ID + 1, PAD_ID, config.train.seq_len)


# ---------------------------------------------------------------------------------------------
# How long a run is and how often it evaluates and saves.

# Where a config leaves config.train.num_steps, eval_every and checkpoint_every unset
# (configs/classify.py does) and gives no epochs: a fine-tuning's 800 steps, evaluated and
# saved every 200.
STEPS = 800
EVERY = 200


@dataclasses.dataclass(frozen=True)
class Length:
  """A run's steps, and the steps between its evaluations and checkpoints (it also evaluates
  and saves at its last); `epochs` passes over `examples` training rows in batches of
  `batch_size` where it is so given."""

  num_steps: int
  eval_every: int
  checkpoint_every: int
  epochs: float | None = None
  examples: int | None = None
  batch_size: int | None = None

  def __str__(self) -> str:
    counted = ""
    if self.epochs is not None:
      epochs = f"{self.epochs:g} epoch{'' if self.epochs == 1 else 's'}"
      counted = f" ({epochs} of {self.examples:,} examples in batches of {self.batch_size})"
    if self.eval_every == self.checkpoint_every:
      every = f"evaluation and checkpoint every {self.eval_every} steps and at the last"
    else:
      every = (f"evaluation every {self.eval_every} steps, checkpoint every "
               f"{self.checkpoint_every}, both at the last")
    return f"{self.num_steps} step{'' if self.num_steps == 1 else 's'}{counted}, {every}"


def check_length(train) -> None:
  """RunError where config.train gives the run's length twice: as epochs and as steps."""
  if train.epochs is not None and train.num_steps is not None:
    raise RunError(f"config.train.epochs: {train.epochs!r} and config.train.num_steps: "
                   f"{train.num_steps!r} are both set, expected one of them (the run's length "
                   f"in passes over the training examples, or in steps)")


def length(train, examples: int) -> Length:
  """config.train's length and cadence, its unset fields following the run: `epochs` passes
  over the `examples` training rows in steps of batch_size rows (rounded up), evaluating and
  saving once per epoch; else num_steps (STEPS if unset), every EVERY steps."""
  check_length(train)
  epochs = train.epochs
  if epochs is None:
    num_steps, every = train.num_steps or STEPS, EVERY
  else:
    # Exact: 0.1 * 30 / 3 in floats is 1.0000000000000002, which would round up to 2.
    num_steps = math.ceil(Fraction(str(epochs)) * examples / train.batch_size)
    every = math.ceil(examples / train.batch_size)
    if num_steps > MAX_STEPS:
      most = math.floor(Fraction(MAX_STEPS * train.batch_size, examples))
      raise RunError(f"config.train.epochs: {epochs!r}, expected at most {most:,} epochs of "
                     f"the {examples:,} examples in batches of {train.batch_size} "
                     f"({num_steps:,} steps; an int32 step counter holds {MAX_STEPS:,})")
  return Length(num_steps, train.eval_every or every, train.checkpoint_every or every,
                epochs, examples, train.batch_size)


# ---------------------------------------------------------------------------------------------
# What may change when a run resumes.


@dataclasses.dataclass(frozen=True)
class Change:
  field: str
  recorded: object
  current: object

  def __str__(self) -> str:
    return f"config.{self.field}: {self.current!r} (the checkpoint has {self.recorded!r})"


def _as_run(config: dict) -> dict:
  """flatten(config), the optimizer's fields it leaves unset as its recipe sets them: a run
  recorded with those values (as every run was before the recipes) resumes with them unset."""
  recipe, _ = optim.recipe_for(config)
  return {**flatten(config), **{f"optim.{f}": recipe.value(f) for f in optim.unset(config)}}


# Fields added after runs were recorded, with the value that gives those runs' behaviour: a
# recorded config without one resumes as if it held it.
ADDED = {"task.packed": False, "init.fresh_head": False,
         "train.eval_at_start": False}


def changes(recorded_json: str, config: ml_collections.ConfigDict) -> list[Change]:
  """The fields of `config` that differ from the config a checkpoint recorded (as JSON)."""
  current = _as_run(json.loads(config.to_json()))
  recorded = {**{f: v for f, v in ADDED.items() if f in current},
              **_as_run(json.loads(recorded_json))}
  return [Change(field, recorded.get(field), current.get(field))
          for field in sorted(set(recorded) | set(current))
          if recorded.get(field) != current.get(field)]


def resume_kind(field: str, task: Definition) -> str:
  """What changing `field` does to a resumed run (FREE, CHANGES_RUN or FIXES_STATE)."""
  spec = COMMON.get(field) or task.fields.get(field)
  return spec.resume if spec is not None else MODEL.get(field, CHANGES_RUN)


def check_resume(recorded_json: str, config: ml_collections.ConfigDict, step: int,
                 allow_changes: bool, task: Definition) -> list[Change]:
  """The changes a resumed run makes to the checkpoint's config; RunError for a change that
  cannot resume, or that changes the run without `allow_changes`."""
  # task.name first: another task's fields all differ, and the name says why.
  found = sorted((c for c in changes(recorded_json, config)
                  if resume_kind(c.field, task) != FREE), key=lambda c: c.field != "task.name")
  more = lambda rest: f" (and {len(rest)} more: {', '.join(c.field for c in rest)})" if rest else ""
  fixed = [c for c in found if resume_kind(c.field, task) == FIXES_STATE]
  if fixed:
    raise RunError(f"{fixed[0]}{more(fixed[1:])}: the run's checkpoints (step {step}) cannot "
                   f"resume with it; use the run's value, or train in a new workdir")
  if found and not allow_changes:
    raise RunError(f"{found[0]}{more(found[1:])}: resuming would change the run its checkpoint "
                   f"(step {step}) belongs to; use the run's value, train in a new workdir, or "
                   f"pass --allow_changes to resume with the change")
  return found
