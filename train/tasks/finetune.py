"""What the fine-tuning tasks share: their config fields, and their examples prepared once into
WORKDIR/data with the encoder config they make.

The tasks (`train.tasks.classify`: a class per text, `train.tasks.regress`: a number per text,
`train.tasks.tag`: a tag per word) differ in their examples' labels, their head and their metrics.
Where the encoder starts is `train.tasks.start`'s; the tokenizer, `train.tasks.tokenizing`'s.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable

import jax

from flax_encoder import EncoderConfig
from flax_encoder.classifier import POOLINGS, segments_per_row
from train.data import dataset, examples
from train.errors import RunError
from train.task import Field, Resume, boolean, choice, integer, optional, string
from train.tasks import tokenizing
from train.tasks.start import Start, check_init, encoder_config, ids, start_of

# The config fields of every fine-tuning task: its data files, tokenizer and ids, and where
# the encoder starts from.
FIELDS = {
    "data.train": Field(string),
    "data.eval": Field(string),
    "data.tokenizer": Field(optional(string)),
    "data.vocab_size": Field(integer(2)),
    "data.id_offset": Field(integer(0)),
    "data.pad_id": Field(integer(0)),
    "init.run": Field(optional(string)),
    "init.torch_checkpoint": Field(optional(string)),
    "init.n_heads": Field(optional(integer(1))),
    "init.prefix": Field(lambda value: None if isinstance(value, str) else "a string"),
    "init.hf": Field(optional(string)),
    # Several short examples a row (classify only: `packed_rows`); a change prepares the
    # examples again and changes what a step holds, so resuming with it needs --allow_changes.
    "task.packed": Field(boolean),
}
# The fields of the tasks that label a text or a pair of texts (classify, regress).
TEXT_FIELDS = {
    "task.pooling": Field(optional(choice(POOLINGS))),
    "data.text_field": Field(string),
    "data.pair_field": Field(string),
    "data.label_field": Field(string),
    "data.separator_id": Field(integer(0)),
    "init.torch_head": Field(optional(string)),
}


# ---------------------------------------------------------------------------------------------
# The examples, prepared once.


@dataclasses.dataclass(frozen=True)
class Prepared:
  """A task's examples as the loop reads them, and the encoder they make."""
  start: Start
  loaded: dict  # examples.load_examples: 'train', 'eval', 'meta', 'identity'
  encoder: EncoderConfig
  pad_id: int

  @property
  def meta(self) -> dict:
    """The examples' dataset.json."""
    return self.loaded["meta"]


Build = Callable[..., dict]  # (directory, tokenizer, tokenizer file, pad id, template) -> meta


def prepare(config, workdir: str, resume: Resume, paths: dict, texts: tokenizing.Texts,
            build: Build, request: dict,
            load: Callable[[str], dict] = examples.load_examples) -> Prepared:
  """The examples of `paths` ({'train': …, 'eval': …}) in WORKDIR/data, prepared by `build`
  unless they are there already for the same `request` (the task's fields, its label kind …,
  beside the tokenizer, ids and seq_len said here) and read back by `load`, and the encoder's
  config."""
  start = start_of(config, workdir)
  tokenizer, tokenizer_file = tokenizing.tokenizer_of(config, start, paths["train"], texts, workdir)
  _, pad_id = ids(config, start)
  template = tokenizing.template_of(tokenizer) if start.hf is not None else None
  directory = os.path.join(workdir, "data")
  request = {**request, "seq_len": config.train.seq_len,
             "tokenizer": {"kind": tokenizer.spec.kind, "file": tokenizer_file,
                           "offset": tokenizer.offset},
             "vocab_size": tokenizer.vocab_size, "pad_id": pad_id,
             "template": template.to_dict() if template else None}
  same_request = lambda meta: (all(meta.get(k) == v for k, v in request.items()) and
                               [i["path"] for i in meta["inputs"]] == list(paths.values()) and
                               tokenizing.same_tokenizer_file(directory, tokenizer_file, tokenizer))
  dataset.prepare_once(directory, same_request,
                       lambda d: build(d, tokenizer, tokenizer_file, pad_id, template),
                       resume.resuming, resume.allow_changes, "config.data")
  loaded = load(directory)
  cfg = encoder_config(config, start, loaded["meta"]["vocab_size"], pad_id)
  return Prepared(start, loaded, cfg, pad_id)


def prepare_texts(config, workdir: str, resume: Resume, paths: dict,
                  label_kind: str) -> Prepared:
  """The texts (and pairs) of `paths` with their labels (`label_kind`: "class" or "number"),
  laid out as the starting encoder's tokenizer lays them out, prepared once."""
  fields = {"text": config.data.text_field, "pair": config.data.pair_field,
            "label": config.data.label_field}

  packed = packed_rows(config)

  def build(directory, tokenizer, tokenizer_file, pad_id, template):
    return examples.prepare_examples(paths, directory, tokenizer, tokenizer_file,
                                     config.train.seq_len, fields, pad_id,
                                     config.data.separator_id, template, label_kind,
                                     packed and packed["max_segments"])

  return prepare(
      config, workdir, resume, paths, lambda record: [record.get(f) for f in
                                                      (fields["text"], fields["pair"])],
      build, {"fields": fields, "separator_id": config.data.separator_id,
              # unrecorded (None) for classes, as in the data directories prepared before
              "label_kind": examples.recorded_kind(label_kind),
              # unrecorded (None) unpacked, likewise
              "packed": packed})


def packed_rows(config) -> dict | None:
  """What dataset.json records of packed examples (config.task.packed): the most a row of
  config.train.seq_len ids holds; None unpacked."""
  if not config.task.get("packed"):
    return None
  return {"max_segments": segments_per_row(config.train.seq_len)}


def say_prepared(prepared: Prepared, what: str, seq_len: int, note: str = "") -> None:
  """Prints (process 0) where the encoder starts, `what` the labels are, the examples and how
  many of them were truncated."""
  if jax.process_index() != 0:
    return
  meta = prepared.meta
  counted = lambda counts: ", ".join(f"{n} {s}" for s, n in counts.items() if n)
  truncated = counted(meta["truncated"])
  print(f"fine-tuning from {prepared.start.source}: {what}, {meta['examples']['train']} "
        f"training and {meta['examples']['eval']} held-out examples"
        + (f"; truncated to {seq_len} ids: {truncated}" if truncated else "")
        + note, file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# Checks and readers.


def check(config) -> None:
  """The cross-field checks of a fine-tuning config (RunError naming the field)."""
  check_init(config.init)
  if config.task.get("packed") and config.task.name != "classify":
    raise RunError(f"config.task.packed: True, expected False for the {config.task.name} task: "
                   f"only classify packs its examples")
  given = config.data.tokenizer
  if (given is not None and given not in ("bytes", *tokenizing.TRAINED)
      and not os.path.isfile(given)):
    tokenizing.as_spec(given)  # the one-line refusal
