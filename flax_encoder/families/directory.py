"""A Hugging Face model directory (config.json + weights) -> its family, EncoderConfig and
flax variables.

    family, config, variables = read_hf("bert-dir")
    config, variables = load_hf("bert-dir")

Reading checks what a directory holds before building anything from it: config.json's
model_type is one a family reads; each tensor has the shape config.json gives it; a shard
index names files of the directory only. Neither weights file needs torch: model.safetensors
is read with safetensors (the `hf` extra), pytorch_model.bin by `torch_zip` (tensors only, as
torch.load(weights_only=True) reads them). A sentence-transformers
folder (modules.json) reads as its Transformer module's directory (`model_directory`).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from flax_encoder.families import registry
from flax_encoder.config import EncoderConfig
from flax_encoder.families.config_json import config_from_hf
from flax_encoder.families.family import HFError
from flax_encoder.families.safetensors_file import floating_weights, read_safetensors
from flax_encoder.families.tensors import from_hf_state_dict
from flax_encoder.families.torch_zip import TorchZipError, read_torch_zip
from flax_encoder.modules_json import (FolderFiles, ModulesError, not_a_file, read_json,
                                       transformer_folder)

# The weights files a directory may hold, in the order transformers prefers them.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
# Weights of the frameworks transformers 5 dropped -> (the framework, its package, the flag of
# from_pretrained that transformers 4 converts them with).
OTHER_WEIGHTS = {"tf_model.h5": ("TensorFlow", "tensorflow", "from_tf=True"),
                 "flax_model.msgpack": ("Flax", "flax", "from_flax=True")}
# The package a weights file needs -> the extra that installs it.
EXTRAS = {"safetensors": "hf"}


class HFModel(NamedTuple):
  """A Hugging Face directory as load_hf reads it, and the name of its family."""
  family: str
  config: EncoderConfig
  variables: dict


class HFDirectory(NamedTuple):
  """A Hugging Face directory found and its config.json read and checked, once (`open_hf`):
  what every reader of it takes instead of its path, so that none finds or reads it again."""
  path: str  # the directory as given (a sentence-transformers folder, or the model's own)
  module: str  # the directory holding config.json, the weights and the tokenizer
  hf: dict  # config.json, of a family load_hf takes

  @property
  def config_file(self) -> str:
    return os.path.join(self.module, "config.json")


def open_hf(path: str | os.PathLike | HFDirectory, hf: dict | None = None,
            files: FolderFiles | None = None) -> HFDirectory:
  """The Hugging Face directory `path` (or a sentence-transformers folder of one:
  `model_directory`), its config.json read and checked (`read_hf_config`), or, where given, its
  contents `hf` read already, checked; `path` itself where it is one already. Its JSON files
  are read through a load's `files`, where given."""
  if isinstance(path, HFDirectory):
    return path
  module = model_directory(path, files)
  return HFDirectory(os.fspath(path), module, _read_config(module, hf, files))


def model_directory(path: str | os.PathLike, files: FolderFiles | None = None) -> str:
  """The directory that holds config.json and the weights of `path`: `path` itself, or, where
  `path` is a sentence-transformers folder (one with modules.json), the folder of its first
  module, which is its Transformer: `path` itself in newer sentence-transformers, a subfolder
  such as 0_Transformer in older ones. modules.json is read through `files`, where given."""
  try:
    folder = transformer_folder(path, files)
  except ModulesError as e:
    raise HFError(str(e)) from None
  return os.fspath(path) if folder is None else folder


def read_hf_config(path: str | os.PathLike | HFDirectory) -> dict:
  """config.json of the directory `path` (of its Transformer's, where it is a
  sentence-transformers folder: `model_directory`), checked to be a family load_hf takes."""
  return open_hf(path).hf


def _read_config(path: str, hf: dict | None = None, files: FolderFiles | None = None) -> dict:
  """config.json of the model's directory `path` (`hf`: its contents, where read already),
  checked to be a family load_hf takes."""
  file = os.path.join(path, "config.json")
  if not os.path.isdir(path):
    raise HFError(f"{path}: not a directory (expected a Hugging Face model directory with "
                  f"config.json and its weights)")
  if hf is None:
    hf = read_json(file, HFError, dict, files=files)
  if hf is None:
    raise HFError(f"{file}: no such file (a Hugging Face model directory has one)")
  model_type = hf.get("model_type")
  if not isinstance(model_type, str) or model_type not in registry.MODEL_TYPES:
    raise HFError(f"{file}: model_type {model_type!r} is not one load_hf takes; it takes "
                  f"{sorted(registry.MODEL_TYPES)}")
  return hf


def _read_file(file: str) -> dict:
  """The state dict of one weights file, without torch: .safetensors, or .bin (torch.save's
  zip format; its integer index buffers left out, bfloat16 read as float32, exactly)."""
  try:
    if file.endswith(".safetensors"):
      return read_safetensors(file)
    try:
      return floating_weights(read_torch_zip(file), file)
    except TorchZipError as e:
      raise HFError(str(e)) from None
  except ModuleNotFoundError as e:
    if e.name not in EXTRAS:
      raise
    raise HFError(f"{file}: reading it needs {e.name}, which is not installed: pip install "
                  f"'flax-encoder[{EXTRAS[e.name]}]'") from None


def read_hf_weights(path: str | os.PathLike | HFDirectory, files: FolderFiles | None = None
                    ) -> dict:
  """The state dict (names -> numpy arrays, as the files hold them: float16 stays float16) of
  the directory `path` (`model_directory`'s): model.safetensors, pytorch_model.bin (torch.save's
  zip format, read without torch), or either's shards through their index, each shard a file of
  the directory (`_shard`); modules.json read through a load's `files`, where given."""
  path = path.module if isinstance(path, HFDirectory) else model_directory(path, files)
  for name in WEIGHT_FILES:
    file = os.path.join(path, name)
    what = not_a_file(file)
    if what is not None:  # passed over, another file would be read in its place
      raise HFError(f"{file}: {what}, expected a weights file")
    if not os.path.isfile(file):
      continue
    if not name.endswith(".index.json"):
      return _read_file(file)
    try:
      shards = sorted(set(read_json(file, HFError, dict)["weight_map"].values()))
    except (KeyError, TypeError, AttributeError) as e:
      raise HFError(f"{file}: not an index of shards ({type(e).__name__}: {e})") from None
    state = {}
    for shard in shards:
      state.update(_read_file(_shard(path, shard, file)))
    return state
  for name, (framework, package, flag) in OTHER_WEIGHTS.items():
    if os.path.isfile(os.path.join(path, name)):
      raise HFError(f"{path}: holds only {name} ({framework} weights, which load_hf does not "
                    f"read): convert it with transformers 4 (pip install 'transformers<5' "
                    f"{package}; AutoModel.from_pretrained(DIR, {flag}).save_pretrained(OUT)) "
                    f"and load OUT")
  raise HFError(f"{path}: no weights (expected one of {', '.join(WEIGHT_FILES)})")


def lies_within(directory: str, file: str) -> bool:
  """Whether `file`, its links resolved, is a file of `directory`: inside it, or, where it is a
  snapshot of huggingface_hub's cache (each file a link to ../../blobs/<hash>), in the cache's
  blobs."""
  root = os.path.realpath(directory)
  roots = [root]
  parts = root.split(os.sep)
  if "snapshots" in parts[:-1]:
    at = len(parts) - 1 - parts[::-1].index("snapshots")
    roots.append(os.sep.join(parts[:at] + ["blobs"]))
  real = os.path.realpath(file)
  return any(os.path.commonpath([r, real]) == r for r in roots)


def _shard(directory: str, name: Any, index: str) -> str:
  """The file of the shard `name` that `index` names, refused where it is not a file within
  `directory` once resolved: an absolute path, `..` or a link out would load another model's
  weights."""
  if not isinstance(name, str):
    raise HFError(f"{index}: shard {name!r}, expected a file name")
  file = os.path.realpath(os.path.join(directory, name))
  if not lies_within(directory, file):
    raise HFError(f"{index}: shard {name!r} leads out of {directory} (to {file}), expected a "
                  f"file of the model directory")
  if not os.path.isfile(file):
    raise HFError(f"{index}: shard {name!r}: no such file in {directory}")
  return file


def read_hf(path: str | os.PathLike | HFDirectory, state: dict | None = None,
            files: FolderFiles | None = None, **settings) -> HFModel:
  """`load_hf`, with the name of the directory's family (which a run records); of a directory
  opened already (`open_hf`) and its weights read already (`state`, `read_hf_weights`'), where
  given; its JSON files read through a load's `files`, where given."""
  directory = open_hf(path, files=files)
  config = config_from_hf(directory.hf, file=directory.config_file, **settings)
  if state is None:
    state = read_hf_weights(directory)
  try:
    variables = from_hf_state_dict(state, directory.hf, config)
  except HFError as e:
    raise HFError(f"{directory.module}: {e}") from None
  return HFModel(registry.of_config(directory.hf).name, config, variables)


def load_hf(path: str | os.PathLike, **settings) -> tuple[EncoderConfig, dict]:
  """A Hugging Face BERT, RoBERTa, DistilBERT, ModernBERT or ALBERT directory (or a
  sentence-transformers folder of one: `model_directory`) -> (EncoderConfig, variables).

  `Encoder(config).apply(variables, input_ids)` returns transformers' last_hidden_state
  (padding is the model's own pad_token_id; `token_types=` as its token_type_ids, zeros by
  default). `variables["heads"]` holds the masked-LM head ("masked_lm", for
  `flax_encoder.heads.MaskedLMHead`), the pooler ("pooler", for `heads.Pooler`) and ModernBERT's
  prediction head ("prediction_head", for `heads.PredictionHead`: the masked-LM head's dense and
  norm, or a classifier's) where the checkpoint has them. `settings` choose how it runs (dtype,
  param_dtype, attention_impl, scan_layers, remat, dropout): see `config_from_hf`.
  """
  model = read_hf(path, **settings)
  return model.config, model.variables
