"""Where a fine-tuning's encoder starts: a pretraining run's newest verified checkpoint
(`config.init.run`: its sizes and tokenizer), a PyTorch checkpoint (`config.init.torch_checkpoint`,
sizes read off the weights), a Hugging Face directory (`config.init.hf`: its family's encoder and
heads, its tokenizer.json with its own ids and padding), or scratch; and the encoder config and
starting parameters that follow from it.

What of a Hugging Face directory outlives the start is taken into WORKDIR/start when the run
starts (`START_COPIED`): the files its exports give on and BERT's pooler, which a contrastive run
exports untrained. The exports read that copy, never the directory, which may have changed or
gone since. Each file the run reads of the directory is one of its own (a link within it, or
into huggingface_hub's cache it lies in) and a regular file: a link leading out of it is
refused, since the run, and whatever it exports, would hold another file (a private one, say).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os

import jax
import numpy as np
from flax import serialization

from flax_encoder import EncoderConfig, families
from flax_encoder.classifier import HEAD_POOLINGS
from flax_encoder.families.directory import lies_within
from flax_encoder.modules_json import FolderFiles, file_signature, not_a_file
from train.data import dataset
from train.data.tokens import TokenizerSpec, hf_tokenizer_file
from train.errors import RunError
from train.run import settings

# The encoder's fields a pretrained encoder brings (what it is and how its parameters are
# stored): a config that gives one must agree with it. The others (dropout, dtype, attention,
# remat) are the fine-tuning run's own. pad_id is the data's.
ARCHITECTURE = tuple(name for role in ("architecture", "parameters")
                     for name in EncoderConfig.fields(role) if name != "pad_id")

START = "start"  # WORKDIR/start: what the run took of its Hugging Face directory
# The files of the directory an export gives on (config.json's carried entries and dropout
# rates, the tokenizer's settings), copied as they are; each must hold a JSON object.
START_COPIED = ("config.json", "tokenizer_config.json", "special_tokens_map.json",
                "sentence_bert_config.json")  # its max_seq_length, which an export compares
POOLER = "pooler.msgpack"  # the directory's pooler (BERT's), which a contrastive run exports
# The files of a Hugging Face or sentence-transformers directory the run reads (the shards an
# index names are checked where they are read: flax_encoder.families.directory._shard).
START_READ = (*START_COPIED, *families.WEIGHT_FILES, "tokenizer.json", "vocab.txt",
              "vocab.json", "merges.txt", "modules.json", "sentence_bert_config.json")


@dataclasses.dataclass
class Start:
  """The encoder's architecture fields, its parameters (or None) and its tokenizer."""
  fields: dict
  params: dict | None
  tokenizer: TokenizerSpec | None  # None: config.data.tokenizer decides
  source: str
  head: dict | None = None  # the classifier's parameters, from a PyTorch Linear
  # A Hugging Face checkpoint's, read once: its ids as they are (offset 0), its padding id, its
  # family, its config.json ("config"), its pooler's parameters (BERT's), its prediction
  # head's (ModernBERT's, "head"), its masked-LM head's, and, where it is a
  # *ForSequenceClassification, its classifier ("classifier": labels, pooling, parameters);
  # None for any other start.
  hf: dict | None = None
  tokenizer_bytes: bytes | None = None  # its file's, where the start read them already

  @property
  def family(self) -> str | None:
    """The Hugging Face family it starts from, which the run records; None for any other."""
    return self.hf["family"] if self.hf else None


def _from_run(config) -> Start:
  from train.run.load import load_config, load_encoder
  run = config.init.run
  try:
    cfg, variables = load_encoder(run)
    run_config = load_config(run)
  except (FileNotFoundError, ValueError) as e:
    raise RunError(f"config.init.run: {run!r}, expected a training run's workdir ({e})") from None
  if run_config.task.get("name", "masked_lm") != "masked_lm":
    raise RunError(f"config.init.run: {run!r} is a {run_config.task.name} run, expected a "
                   f"pretraining (masked_lm) run")
  fields = {name: getattr(cfg, name) for name in ARCHITECTURE}
  fields["param_dtype"] = np.dtype(fields["param_dtype"]).name
  return Start(fields, variables["params"], dataset.run_tokenizer(run_config, run), run)


def _from_torch(config) -> Start:
  from flax_encoder.pytorch import (config_from_torch_state_dict, from_torch_state_dict,
                                    load_torch_checkpoint)
  init, path = config.init, config.init.torch_checkpoint
  try:
    state = load_torch_checkpoint(path)
    cfg = config_from_torch_state_dict(state, init.n_heads, prefix=init.prefix)
    params = from_torch_state_dict(state, cfg, prefix=init.prefix)["params"]
  except (FileNotFoundError, ValueError, TypeError) as e:
    raise RunError(f"config.init.torch_checkpoint: {path}: {e}".splitlines()[0]) from None
  fields = {name: getattr(cfg, name) for name in ARCHITECTURE}
  fields["param_dtype"] = np.dtype(fields["param_dtype"]).name
  head, name = None, init.get("torch_head")
  if name:
    weight, bias = (state.get(f"{name}.{p}") for p in ("weight", "bias"))
    if weight is None or bias is None:
      raise RunError(f"config.init.torch_head: {name!r}, expected the prefix of a "
                     f"Linear in {path} (its .weight and .bias)")
    head = {"kernel": np.asarray(weight).T, "bias": np.asarray(bias)}
  return Start(fields, params, None, path, head)


# config.init.hf's directories opened in this process: realpath -> (config.json's stat, it);
# and the JSON files read of each
_OPENED: dict[str, tuple[tuple, families.HFDirectory]] = {}
_FILES: dict[str, FolderFiles] = {}


def opened(path: str) -> families.HFDirectory:
  """The Hugging Face directory `path` (config.init.hf) found and its config.json read and
  checked (`families.open_hf`) once in this process: the task's defaults, its checks and the
  start read it here. Read again where config.json is no longer the file it was (another
  inode, size or time of change)."""
  key = os.path.realpath(path)
  seen = _OPENED.get(key)
  if seen is not None:
    signature, directory = seen
    if signature == file_signature(directory.config_file):
      return directory
  directory = families.open_hf(path, files=start_files_read(path))
  _OPENED[key] = (file_signature(directory.config_file), directory)
  return directory


def start_files_read(path: str) -> FolderFiles:
  """The JSON files of config.init.hf `path` (modules.json, the modules' settings, the
  tokenizer's options), each read once in this process for every reader of the run (again
  where it changed since)."""
  return _FILES.setdefault(os.path.realpath(path), FolderFiles())


def _from_hf(config, workdir: str) -> Start:
  """A Hugging Face (or sentence-transformers) directory's encoder, heads and tokenizer: its
  tokenizer.json, or one built from its vocabulary files into WORKDIR/vocabulary/hf. Its
  config.json and weights are read here once, for every reader of the run."""
  path = config.init.hf
  copied = read_start(path)
  try:
    directory, files = opened(path), start_files_read(path)
    state = families.read_hf_weights(directory)
    model = families.read_hf(directory, state)
    tokenizer, tokenizer_bytes = hf_tokenizer_file(path, os.path.join(workdir, "vocabulary", "hf"),
                                                   files)
    classifier = _classifier(directory, state, model, files)
  except (FileNotFoundError, ValueError, TypeError) as e:
    raise RunError(f"config.init.hf: {e}".splitlines()[0]) from None
  cfg, heads = model.config, model.variables.get("heads", {})
  keep_start(copied, heads, workdir)
  fields = {name: getattr(cfg, name) for name in ARCHITECTURE}
  fields["param_dtype"] = np.dtype(fields["param_dtype"]).name
  from_pooler = families.get(model.family).classifier.from_pooler
  return Start(fields, model.variables["params"],
               TokenizerSpec("huggingface", os.path.abspath(tokenizer)), os.path.abspath(path),
               tokenizer_bytes=tokenizer_bytes,
               hf={"pad_id": cfg.pad_id, "family": model.family, "config": directory.hf,
                   "pooler": heads.get("pooler") if from_pooler else None,
                   # transformers' classifiers that apply a prediction head read the
                   # masked-LM head's dense and norm as theirs (ModernBERT's)
                   "head": heads.get("prediction_head"),
                   # its masked-LM head, where it has one (a sparse encoder's vectors)
                   "masked_lm": heads.get("masked_lm"),
                   "classifier": classifier})


def _classifier(directory: families.HFDirectory, state: dict, model: families.HFModel,
                files: FolderFiles) -> dict | None:
  """{'num_labels', 'pooling', 'params'} of the start's classifier where it is a
  *ForSequenceClassification (a CrossEncoder folder's checked as Reranker.load checks it), or
  {'error': why it cannot be read}, which a task that goes on from it says; None where it is
  another model."""
  from flax_encoder import cross_encoder
  architectures = directory.hf.get("architectures") or []
  if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
    return None
  try:
    if os.path.lexists(os.path.join(directory.path, "modules.json")):
      cross_encoder.read_modules(directory.path, files)
    num_labels, pooling, params = cross_encoder.read_classifier(directory, state, model.config,
                                                                model.variables)
  except ValueError as e:  # the tasks that start a classifier afresh never read it
    return {"error": str(e)}
  return {"num_labels": num_labels, "pooling": pooling, "params": params}


def start_files(directory: str) -> dict[str, list[str]]:
  """{name: its paths} of the files of START_READ the Hugging Face `directory` holds (at its
  top, then in its Transformer module's folder, where it is a sentence-transformers folder),
  each checked to be a regular file of the directory: a RunError (config.init.hf: FILE: …)
  names a link leading out of it, and a directory, FIFO or device in a file's place."""
  try:
    folders = dict.fromkeys((directory, families.model_directory(directory,
                                                                 start_files_read(directory))))
  except ValueError as e:
    raise RunError(f"config.init.hf: {e}".splitlines()[0]) from None
  found = {}
  for folder in folders:
    for name in START_READ:
      file = os.path.join(folder, name)
      if not os.path.lexists(file):
        continue
      if not lies_within(directory, file):
        raise RunError(f"config.init.hf: {file}: a link to {os.path.realpath(file)}, outside "
                       f"{directory}, expected a file of the directory (the run and its "
                       f"exports would hold another file)")
      if not os.path.exists(file):
        continue  # a link to nothing within it: no such file, as every reader finds it
      what = not_a_file(file)
      if what is not None:
        raise RunError(f"config.init.hf: {file}: {what}, expected a regular file")
      found.setdefault(name, []).append(file)
  return found


def _copied(files: dict[str, list[str]]) -> dict[str, bytes]:
  """{name: bytes} of the files of START_COPIED among `files` (start_files'), each a JSON
  object: config.json the model's (its Transformer's, in a sentence-transformers folder), the
  tokenizer's files the first found, as the run's tokenizer is read (train.data.tokens)."""
  copied = {}
  for name in START_COPIED:
    if name not in files:
      continue
    file = files[name][-1 if name == "config.json" else 0]
    try:
      with open(file, "rb") as f:
        data = f.read()
    except OSError as e:
      raise RunError(f"config.init.hf: {file}: not readable ({e.strerror})") from None
    try:
      value = json.loads(data)
    except (ValueError, RecursionError) as e:
      said = (str(e).splitlines() or [""])[0]
      raise RunError(f"config.init.hf: {file}: not readable JSON ({said})") from None
    if not isinstance(value, dict):
      raise RunError(f"config.init.hf: {file}: holds a {type(value).__name__}, expected a "
                     f"JSON object")
    copied[name] = data
  return copied


def read_start(directory: str) -> dict[str, bytes]:
  """What the exports of a run from the Hugging Face `directory` read of it, {name: bytes},
  read once when the run starts (`start_files`: RunError naming a file that is no regular
  file of the directory)."""
  return _copied(start_files(directory))


def keep_start(copied: dict[str, bytes], heads: dict, workdir: str) -> None:
  """Keeps `copied` (`read_start`'s) and the pooler among the start's `heads` in
  WORKDIR/start, which the run's exports read instead of the start directory."""
  if "pooler" in heads:
    copied = {**copied, POOLER: serialization.msgpack_serialize(
        jax.tree.map(np.asarray, heads["pooler"]))}
  _keep(copied, os.path.join(workdir, START))


def _keep(copied: dict[str, bytes], kept: str) -> None:
  """Writes `copied` ({name: bytes}) into `kept` (WORKDIR/start), each file whole, and removes
  what an earlier start of the run took that this one does not. Every process writes the same
  bytes, each through its own temporary name."""
  os.makedirs(kept, exist_ok=True)
  for name in (*START_COPIED, POOLER):
    file = os.path.join(kept, name)
    if name not in copied:
      with contextlib.suppress(FileNotFoundError):  # another process may have removed it
        os.remove(file)
      continue
    tmp = f"{file}.tmp-{jax.process_index()}"
    with open(tmp, "wb") as f:
      f.write(copied[name])
    os.replace(tmp, file)


def start_folder(workdir: str, start: str | None) -> str | None:
  """The folder an export of the run in `workdir` reads what its start directory (`start`:
  config.init.hf, or None) gave: WORKDIR/start, taken when the run started; for a run that
  started before runs took it, the directory itself where it is still there, checked as a
  start is (`start_files`: RunError naming a link out); None where the run started elsewhere
  or its directory is gone."""
  if not start:
    return None
  kept = os.path.join(workdir, START)
  if os.path.isdir(kept):
    return kept
  if not os.path.isdir(start):
    return None
  _copied(start_files(start))  # what an export reads of it: JSON objects
  return start


def start_pooler(workdir: str, start: str | None) -> dict:
  """{'pooler': …} of the start directory as the run took it (`start_folder`); {} where it has
  none, or the run started elsewhere or before runs took it and the directory is gone."""
  folder = start_folder(workdir, start)
  if folder is None:
    return {}
  if folder == os.path.join(workdir, START):
    file = os.path.join(folder, POOLER)
    if not os.path.isfile(file):
      return {}
    with open(file, "rb") as f:
      return {"pooler": serialization.msgpack_restore(f.read())}
  try:  # a run from before runs took a copy: the directory's weights
    heads = families.read_hf(folder).variables.get("heads", {})
  except (ValueError, OSError):
    return {}
  return {"pooler": heads["pooler"]} if "pooler" in heads else {}


def start_of(config, workdir: str) -> Start:
  """Where config.init says the encoder starts from (what it brings is kept in `workdir`)."""
  if config.init.run:
    return _from_run(config)
  if config.init.torch_checkpoint:
    return _from_torch(config)
  if config.init.hf:
    return _from_hf(config, workdir)
  return Start({}, None, None, "scratch")


def pooling(config, start: Start) -> str:
  """config.task.pooling, or where unset the starting checkpoint's family's (`Family.pooling`:
  BERT's pooler, RoBERTa's head of its shape, DistilBERT's pre-classifier, ModernBERT's first
  token or mean through its prediction head, as its classifier_pooling says); the mean from
  anything else."""
  if config.task.pooling:
    return config.task.pooling
  if start.hf is None:
    return "mean"
  return families.of_config(start.hf["config"]).pooling(start.hf["config"])


def ids(config, start: Start) -> tuple[int, int]:
  """(id offset, padding id) of the examples: a Hugging Face checkpoint's own, or config.data's."""
  if start.hf is not None:
    return 0, start.hf["pad_id"]
  return config.data.id_offset, config.data.pad_id


def encoder_config(config, start: Start, vocab_size: int, pad_id: int) -> EncoderConfig:
  """config.model with the starting encoder's architecture; a field given in both must
  agree. From scratch, fields left unset take configs/default.py's values."""
  fields = {k: v for k, v in config.model.to_dict().items() if v is not None}
  for name, value in start.fields.items():
    given = fields.get(name)
    if given is not None and given != value and not (
        name == "param_dtype" and np.dtype(given) == np.dtype(value)):
      raise RunError(f"config.model.{name}: {given!r}, but {start.source} has {value!r}; leave "
                     f"it unset to take the pretrained encoder's")
    fields[name] = value
  if not start.fields:
    from configs import default
    defaults = default.get_config().model.to_dict()
    fields = {**{k: v for k, v in defaults.items() if v is not None}, **fields}
  fields.pop("vocab_size", None)
  if start.fields and start.fields["vocab_size"] < vocab_size:
    raise RunError(f"config.data.tokenizer: ids up to {vocab_size - 1}, but {start.source}'s "
                   f"embedding has {start.fields['vocab_size']} rows")
  return settings.build_encoder(fields, start.fields.get("vocab_size", vocab_size), pad_id,
                                config.train.seq_len)


def start_params(start: Start, cfg: EncoderConfig, config, outputs: int,
                 pooled_by: str | None = None, classes: list | None = None,
                 head: bool = False):
  """The parameters to start from, or None: the encoder's; BERT's pooler where the head pools
  with it (`pooled_by`); ModernBERT's prediction head where the model has one (`pooled_by` one
  of HEAD_POOLINGS, or `head`) and the checkpoint too; the classifier (`outputs` of them: the
  `classes`' scores, or one number) from a PyTorch Linear."""
  if start.params is None:
    return None
  dtype = np.dtype(cfg.param_dtype)
  if start.hf is not None and start.hf["pooler"] and pooled_by == "pooler":
    return {"encoder": start.params,
            "pooler": jax.tree.map(lambda x: x.astype(dtype), start.hf["pooler"])}
  if start.hf is not None and start.hf.get("head") and (head or pooled_by in HEAD_POOLINGS):
    return {"encoder": start.params,
            "head": jax.tree.map(lambda x: x.astype(dtype), start.hf["head"])}
  if start.head is None:
    return {"encoder": start.params}
  kernel, name = start.head["kernel"], config.init.torch_head
  if classes is not None and classes != list(range(outputs)):
    raise RunError(f"config.init.torch_head: {name!r} scores classes "
                   f"0 … {kernel.shape[1] - 1} in its rows' order; expected the labels to be "
                   f"those integers, got {classes[:5]}…")
  if kernel.shape != (cfg.d_model, outputs):
    what = "the data's classes" if classes is not None else "one number"
    raise RunError(f"config.init.torch_head: {name!r} is a Linear "
                   f"{kernel.shape[0]} -> {kernel.shape[1]}, expected {cfg.d_model} -> "
                   f"{outputs} ({what})")
  return {"encoder": start.params,
          "classifier": {"kernel": kernel.astype(dtype), "bias": start.head["bias"].astype(dtype)}}


def check_init(init) -> None:
  """config.init names at most one start, with the fields it needs (RunError naming the field)."""
  given = [f"config.init.{k}" for k in ("run", "torch_checkpoint", "hf") if init.get(k)]
  if len(given) > 1:
    raise RunError(f"{given[1]}: {init.get(given[1].split('.')[-1])!r}, expected unset with "
                   f"{given[0]}: the encoder starts from one of them")
  if init.torch_checkpoint and init.n_heads is None:
    raise RunError("config.init.n_heads: unset, expected the PyTorch encoder's number of heads "
                   "(the weights' shapes do not show it)")
  if init.get("torch_head") and not init.torch_checkpoint:
    raise RunError(f"config.init.torch_head: {init.torch_head!r}, expected it only with "
                   f"config.init.torch_checkpoint")
