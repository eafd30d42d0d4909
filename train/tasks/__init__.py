"""The registry of the tasks `python -m train` runs, chosen by config.task.name.

  masked_lm  pretraining: masked-token prediction on windows of text (train.tasks.masked_lm)
  classify   fine-tuning: a label for each text or pair of texts (train.tasks.classify)
  regress    fine-tuning: a number for each text or pair of texts (train.tasks.regress)
  tag        fine-tuning: a tag for each word of a text (train.tasks.tag)
  contrastive fine-tuning: sentence embeddings from pairs of texts (train.tasks.contrastive)
  rerank     fine-tuning: a cross-encoder's relevance score of (query, document) pairs
  sparse     fine-tuning: SPLADE's sparse vectors from pairs of texts (train.tasks.sparse)
  multi_vector fine-tuning: ColBERT's token vectors from pairs (train.tasks.multi_vector)

Each task's module defines its `DEFINITION` (`train.task.Definition`); a new task adds its
module here, and the program learns of it from that alone.
"""

from __future__ import annotations

from train.errors import RunError
from train.run import settings
from train.task import Definition
from train.tasks import (classify, contrastive, masked_lm, multi_vector, regress, rerank, sparse,
                         tag)

DEFINITIONS: dict[str, Definition] = {
    module.DEFINITION.name: module.DEFINITION
    for module in (masked_lm, classify, regress, tag, contrastive, rerank, sparse, multi_vector)}


def definition(name) -> Definition:
  """The task config.task.name names; RunError naming the field for any other."""
  try:
    return DEFINITIONS[name]
  except (KeyError, TypeError):
    raise RunError(f"config.task.name: {name!r}, expected one of {tuple(DEFINITIONS)}") from None


def checked(config) -> Definition:
  """The task of `config`, after every field of `config` is checked against it (RunError
  naming the first wrong one)."""
  task = definition(config.task.get("name") if "task" in config else None)
  if task.defaults:
    task.defaults(config)
  settings.check(config, task)
  return task
