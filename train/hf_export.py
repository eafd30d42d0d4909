"""A run as a Hugging Face directory (`python -m train.export --layout hf --out DIR`):
config.json, model.safetensors and, where the run's ids are a Hugging Face tokenizer's own,
its tokenizer files, which transformers' Auto classes load.

  fine-tuning (classify)   *ForSequenceClassification, the classes as id2label
  regression (regress)     *ForSequenceClassification, one output, problem_type "regression"
  tagging (tag)            *ForTokenClassification, the tags as id2label
  further pretraining      *ForMaskedLM: the encoder and BERT's masked-LM head
  (masked_lm from config.init.hf)
  pretraining from scratch the bare model (AutoModel): the encoder

The run's encoder must be one of a Hugging Face family's (`flax_encoder.families`;
`hf_config` says what differs otherwise): a run started from a Hugging Face directory is, and
keeps its family; one trained from scratch exports as the family its architecture derives
(`families.of_architecture`: rotary positions ModernBERT, an offset RoBERTa, token types BERT,
else DistilBERT). A classifier exports as its family's (`Family.classifier`: the pooling it
must have, its dense layers, the prediction head where the family's has one), and keeps the
starting directory's entries the family carries (`Family.carried`: ModernBERT's special ids).
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

from flax_encoder import families
from train import examples
from train.errors import RunError
from train.files import os_errors_of_safetensors, readable_as_umask_allows, temporary_directory
from train.load import load_config, load_encoder

# The tasks whose heads transformers has (train.predict reads their runs back).
_FINE_TUNING = ("classify", "regress", "tag")
# The files of a tokenizer directory besides tokenizer.json, copied where the run started.
_TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json")


def check_out(out: str) -> str | None:
  """Why `out` cannot be the directory written, or None. A link to a new or empty directory
  is written through: its target is the directory written."""
  real = os.path.realpath(out)
  if os.path.isdir(real) and os.listdir(real):
    return f"--out {out}: a directory that holds files, expected a new or empty directory"
  if os.path.exists(real) and not os.path.isdir(real):
    return f"--out {out}: a file, expected a new or empty directory (--layout hf writes one)"
  if not os.path.isdir(os.path.dirname(real)):
    return f"--out {out}: no directory {os.path.dirname(real)} to write it in"
  return None


def _start(config) -> str | None:
  """The Hugging Face directory the run started from (config.init.hf), or None."""
  return config.init.get("hf") if "init" in config else None


def _family(config, cfg) -> families.Family:
  """The family the run exports as: the starting directory's, else its architecture's."""
  init = _start(config)
  if init:
    try:
      return families.of_directory(init)
    except ValueError:
      pass  # the starting directory is gone: the architecture decides
  return families.of_architecture(cfg)


def export_hf(workdir: str, out: str) -> str:
  """Writes the run in `workdir` to the directory `out` (see the module docstring)."""
  import safetensors.numpy

  config = load_config(workdir)
  task = config.task.get("name", "masked_lm")
  if task in _FINE_TUNING:
    from train.predict import read_run
    run = read_run(workdir)
    cfg, variables = run.model.config, {"params": run.params["encoder"]}
  elif _start(config):
    cfg, variables = _masked_lm(workdir)
  else:
    cfg, variables = load_encoder(workdir)
  family = _family(config, cfg)
  prefix, stem = family.prefix, family.stem
  try:
    families.hf_config(cfg, family.name)  # says what differs, before anything is converted
    if task in _FINE_TUNING:
      state, extra = _head(family.name, run, variables, prefix, stem)
    else:
      head = "heads" in variables
      state = families.to_hf_state_dict(variables, cfg, family.name,
                                        prefix=prefix if head else "")
      extra = {"architectures": [f"{stem}{'ForMaskedLM' if head else 'Model'}"]}
    contents = families.hf_config(cfg, family.name, **{**_carried(config, family), **extra})
  except families.HFError as e:
    raise RunError(f"--layout hf: {e}") from None
  with temporary_directory(out) as tmp, os_errors_of_safetensors():
    # Contiguous: safetensors writes an array's buffer as it lies (a transposed view's too).
    safetensors.numpy.save_file({k: np.ascontiguousarray(v, np.float32 if v.dtype.name ==
                                                         "bfloat16" else v.dtype)
                                 for k, v in state.items()},
                                os.path.join(tmp, "model.safetensors"),
                                metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(contents, f, indent=2)
    _tokenizer(workdir, config, task, tmp)
    readable_as_umask_allows(tmp)
  return out


def _carried(config, family: families.Family) -> dict:
  """The entries of the directory the run started from that its family carries."""
  init = _start(config)
  if not family.carried or not init:
    return {}
  try:
    hf = families.read_hf_config(init)
  except ValueError:
    return {}  # the starting directory is gone: transformers' defaults
  return {k: hf[k] for k in family.carried if k in hf}


def _masked_lm(workdir: str):
  """(EncoderConfig, {'params': the encoder's, 'heads': {'masked_lm': …}}) of a further
  pretraining run's newest verified checkpoint."""
  import jax
  import jax.numpy as jnp

  from flax_encoder import Encoder
  from flax_encoder.heads import MaskedLMHead
  from train.load import load_params, recorded_encoder_config

  def init_for(meta):
    cfg = recorded_encoder_config(meta)
    key, hidden = jax.random.PRNGKey(0), jnp.ones((1, cfg.d_model), cfg.dtype)
    return lambda: {
        "encoder": Encoder(cfg).init(key, jnp.ones((1, 1), jnp.int32))["params"],
        "masked_lm": MaskedLMHead(cfg).init(key, hidden, jnp.ones((cfg.vocab_size,
                                                                   cfg.d_model)))["params"]}

  params, meta = load_params(workdir, init_for)
  return recorded_encoder_config(meta), {"params": params["encoder"],
                                         "heads": {"masked_lm": params["masked_lm"]}}


def _head(name: str, run, variables, prefix, stem):
  """The state dict and config.json entries of a fine-tuned run as transformers' model of its
  task, for the family `name`: a sequence classifier (one output for regression) or a token
  classifier."""
  family = families.get(name)
  params, cfg = run.params, run.model.config
  labels = [str(label) for label in run.labels or ["LABEL_0"]]
  extra = {"id2label": dict(enumerate(labels)),
           "label2id": {label: i for i, label in enumerate(labels)}}
  if run.task == "tag" and family.tags_through_head and not run.model.head:
    raise families.HFError(
        f"the run tags without {family.title}'s prediction head (only a run from a "
        f"{family.title} directory has one); transformers' {stem}ForTokenClassification "
        f"applies it")
  if run.task != "tag":
    family.classifier.check(run.model.pooling, stem)
  if family.prediction_head:  # its classifiers', by the masked-LM head's names
    variables = {**variables, "heads": {"prediction_head": params["head"]}}
  state = families.to_hf_state_dict(variables, cfg, name, prefix=prefix)
  if run.task == "tag":  # no pooler: BERT's token classifier is built without one
    denses = (("classifier", params["classifier"]),)
    extra["architectures"] = [f"{stem}ForTokenClassification"]
  else:
    denses = tuple((key, _at(params, path)) for key, path in family.classifier.denses)
    extra["architectures"] = [f"{stem}ForSequenceClassification"]
    extra.update(family.classifier.config(run.model.pooling))
  if run.task == "regress":
    extra["problem_type"] = "regression"
  for key, dense in denses:
    state[key + ".weight"] = np.asarray(dense["kernel"]).T
    state[key + ".bias"] = np.asarray(dense["bias"])
  return state, extra


def _at(params: dict, path: tuple):
  """The run's parameters at `path` ('pooler', 'dense')."""
  for key in path:
    params = params[key]
  return params


def _tokenizer(workdir: str, config, task: str, out: str) -> None:
  """Copies the run's tokenizer where its ids are a Hugging Face tokenizer's own."""
  start = _start(config)
  if task in _FINE_TUNING:
    meta = examples.load_examples(os.path.join(workdir, "data"))["meta"]
    tokenizer, directory = meta["tokenizer"], os.path.join(workdir, "data")
    if tokenizer["kind"] != "huggingface" or tokenizer["offset"] != 0:
      return
    file = os.path.join(directory, tokenizer["file"])
  elif start:  # trained on the checkpoint's own ids (train.masked_lm checked the file)
    file = os.path.join(start, "tokenizer.json")
  else:
    return  # a pretraining run's ids carry this project's offset
  shutil.copyfile(file, os.path.join(out, "tokenizer.json"))
  for name in _TOKENIZER_FILES:
    if start and os.path.isfile(os.path.join(start, name)):
      shutil.copyfile(os.path.join(start, name), os.path.join(out, name))
