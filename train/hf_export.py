"""A run as a Hugging Face directory (`python -m train.export --layout hf --out DIR`):
config.json, model.safetensors and, where the run's ids are a Hugging Face tokenizer's own,
its tokenizer files, which transformers' Auto classes load.

  fine-tuning (classify)   *ForSequenceClassification, the classes as id2label
  regression (regress)     *ForSequenceClassification, one output, problem_type "regression"
  tagging (tag)            *ForTokenClassification, the tags as id2label
  further pretraining      *ForMaskedLM: the encoder and BERT's masked-LM head
  (masked_lm from config.init.hf)
  pretraining from scratch the bare model (AutoModel): the encoder

The run's encoder must be one of the BERT family's or ModernBERT's
(`flax_encoder.pytorch.hf.hf_config` says what differs otherwise): a run started from a Hugging
Face directory is, and keeps its family; one trained from scratch exports where its
config.model has that architecture: with rotary positions as ModernBERT (Pre-LN without layer
0's attention norm, GeGLU, a final LayerNorm: configs/modern.py's); with learned positions,
an embedding LayerNorm and no final LayerNorm as RoBERTa with a position_offset, as BERT with
token types, as DistilBERT without. A ModernBERT classifier or tagger must have its prediction
head (the poolings "first_head" and "mean_head", the default from a ModernBERT directory) and
keeps the directory's special ids.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

from flax_encoder.classifier import HEAD_POOLINGS
from train import examples
from train.errors import RunError
from train.files import os_errors_of_safetensors, readable_as_umask_allows, temporary_directory
from train.load import load_config, load_encoder

# family -> (the encoder's prefix inside a *For… model, the model class's stem)
_MODELS = {"bert": ("bert.", "Bert"), "roberta": ("roberta.", "Roberta"),
           "distilbert": ("distilbert.", "DistilBert"), "modernbert": ("model.", "ModernBert")}
# The pooling each family's sequence classifier has, and where its two dense layers sit.
_CLASSIFIER = {"bert": ("pooler", "bert.pooler.dense", "classifier"),
               "roberta": ("pooler", "classifier.dense", "classifier.out_proj"),
               "distilbert": ("pre_classifier", "pre_classifier", "classifier")}
# The tasks whose heads transformers has (train.predict reads their runs back).
_FINE_TUNING = ("classify", "regress", "tag")
# What a ModernBERT export keeps of the config.json it started from (its pooling only where no
# sequence classifier says its own).
_CARRIED = ("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id", "classifier_pooling")
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


def _family(config, cfg) -> str:
  init = _start(config)
  if init:
    from flax_encoder.pytorch.hf import FAMILIES, read_hf_config
    try:
      return FAMILIES[read_hf_config(init)["model_type"]]
    except ValueError:
      pass  # the starting directory is gone: the architecture decides
  if cfg.position_embedding == "rotary":
    return "modernbert"
  if cfg.position_offset:
    return "roberta"
  return "bert" if cfg.type_vocab_size else "distilbert"  # DistilBERT has no token types


def export_hf(workdir: str, out: str) -> str:
  """Writes the run in `workdir` to the directory `out` (see the module docstring)."""
  import safetensors.numpy

  from flax_encoder.pytorch.hf import HFError, hf_config, to_hf_state_dict
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
  prefix, stem = _MODELS[family]
  try:
    hf_config(cfg, family)  # says what differs, before anything is converted
    if task in _FINE_TUNING:
      state, extra = _head(family, run, variables, prefix, stem)
    else:
      head = "heads" in variables
      state = to_hf_state_dict(variables, cfg, family, prefix=prefix if head else "")
      extra = {"architectures": [f"{stem}{'ForMaskedLM' if head else 'Model'}"]}
    contents = hf_config(cfg, family, **{**_carried(config, family), **extra})
  except HFError as e:
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


def _carried(config, family: str) -> dict:
  """The `_CARRIED` entries of the ModernBERT directory the run started from, if any."""
  init = _start(config)
  if family != "modernbert" or not init:
    return {}
  from flax_encoder.pytorch.hf import read_hf_config
  try:
    hf = read_hf_config(init)
  except ValueError:
    return {}  # the starting directory is gone: transformers' defaults
  return {k: hf[k] for k in _CARRIED if k in hf}


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


def _head(family, run, variables, prefix, stem):
  """The state dict and config.json entries of a fine-tuned run as transformers' model of its
  task: a sequence classifier (one output for regression) or a token classifier."""
  from flax_encoder.pytorch.hf import HFError, to_hf_state_dict
  params, cfg = run.params, run.model.config
  labels = [str(label) for label in run.labels or ["LABEL_0"]]
  extra = {"id2label": dict(enumerate(labels)),
           "label2id": {label: i for i, label in enumerate(labels)}}
  if family == "modernbert":  # its classifiers' prediction head, by the masked-LM head's names
    if run.task == "tag" and not run.model.head:
      raise HFError("the run tags without ModernBERT's prediction head (only a run from a "
                    "ModernBERT directory has one); transformers' "
                    "ModernBertForTokenClassification applies it")
    if run.task != "tag" and run.model.pooling not in HEAD_POOLINGS:
      raise HFError(f"the run pools by {run.model.pooling!r}; transformers' "
                    f"ModernBertForSequenceClassification pools through its prediction head "
                    f"(config.task.pooling='first_head' or 'mean_head')")
    variables = {**variables, "heads": {"prediction_head": params["head"]}}
  state = to_hf_state_dict(variables, cfg, family, prefix=prefix)
  if run.task == "tag":  # no pooler: BERT's token classifier is built without one
    denses = (("classifier", params["classifier"]),)
    extra["architectures"] = [f"{stem}ForTokenClassification"]
  elif family == "modernbert":
    denses = (("classifier", params["classifier"]),)
    extra["architectures"] = [f"{stem}ForSequenceClassification"]
    extra["classifier_pooling"] = {"first": "cls", "mean": "mean"}[
        HEAD_POOLINGS[run.model.pooling]]
  else:
    pooling, pooler_name, classifier_name = _CLASSIFIER[family]
    if run.model.pooling != pooling:
      raise HFError(f"the run pools by {run.model.pooling!r}; transformers' "
                    f"{stem}ForSequenceClassification pools by {pooling!r} "
                    f"(config.task.pooling={pooling!r})")
    denses = ((pooler_name, params["pooler"]["dense"]), (classifier_name, params["classifier"]))
    extra["architectures"] = [f"{stem}ForSequenceClassification"]
  if run.task == "regress":
    extra["problem_type"] = "regression"
  for name, dense in denses:
    state[name + ".weight"] = np.asarray(dense["kernel"]).T
    state[name + ".bias"] = np.asarray(dense["bias"])
  return state, extra


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
