"""What the fine-tuning tasks share: where the encoder starts from, the tokenizer their
examples are encoded with, the encoder's config, and the examples prepared once into
WORKDIR/data.

The tasks (`train.classify`: a class per text, `train.regress`: a number per text,
`train.tag`: a tag per word) differ in their examples' labels, their head and their metrics.
The encoder starts from a pretraining run's newest verified checkpoint (`config.init.run`: its
sizes and tokenizer), from a PyTorch checkpoint (`config.init.torch_checkpoint`, sizes read
off the weights), from a Hugging Face directory (`config.init.hf`: its encoder, its
tokenizer.json with its own ids, padding and special tokens), or from scratch
(configs/default.py's sizes, a vocabulary trained on the training texts).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable

import jax
import numpy as np

from flax_encoder import EncoderConfig, families
from flax_encoder import tokenizer as tokenizer_lib
from flax_encoder.classifier import HEAD_POOLINGS, POOLINGS
from train import dataset, examples, settings, sources, tokens, vocabulary
from train.errors import RunError
from train.files import sha256_file
from train.task import Field, Resume, choice, integer, optional, string
from train.tokens import TokenizerSpec

# The encoder's fields a pretrained encoder brings (what it is and how its parameters are
# stored): a config that gives one must agree with it. The others (dropout, dtype, attention,
# remat) are the fine-tuning run's own. pad_id is the data's.
ARCHITECTURE = tuple(name for role in ("architecture", "parameters")
                     for name in EncoderConfig.fields(role) if name != "pad_id")
# What config.data.tokenizer may name besides a file: bytes, or a vocabulary trained on the
# training texts (config.data.vocab_size ids), the default from scratch.
TRAINED = vocabulary.TRAINED

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


@dataclasses.dataclass
class Start:
  """The encoder's architecture fields, its parameters (or None) and its tokenizer."""
  fields: dict
  params: dict | None
  tokenizer: TokenizerSpec | None  # None: config.data.tokenizer decides
  source: str
  head: dict | None = None  # the classifier's parameters, from a PyTorch Linear
  # A Hugging Face checkpoint's: its ids as they are (offset 0), its padding id, its family,
  # its pooler's parameters (BERT's) and its prediction head's (ModernBERT's, "head"), or None.
  hf: dict | None = None

  @property
  def family(self) -> str | None:
    """The Hugging Face family it starts from, which the run records; None for any other."""
    return self.hf["family"] if self.hf else None


def _from_run(config) -> Start:
  from train.load import load_config, load_encoder
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


def _from_hf(config) -> Start:
  path = config.init.hf
  try:
    model = families.read_hf(path)
  except (FileNotFoundError, ValueError, TypeError) as e:
    raise RunError(f"config.init.hf: {e}".splitlines()[0]) from None
  cfg, heads = model.config, model.variables.get("heads", {})
  tokenizer = os.path.join(path, "tokenizer.json")
  if not os.path.isfile(tokenizer):
    raise RunError(f"config.init.hf: {path} has no tokenizer.json (the fast tokenizer's file; "
                   f"transformers writes it with AutoTokenizer.from_pretrained(DIR)"
                   f".save_pretrained(DIR))")
  fields = {name: getattr(cfg, name) for name in ARCHITECTURE}
  fields["param_dtype"] = np.dtype(fields["param_dtype"]).name
  from_pooler = families.get(model.family).classifier.from_pooler
  return Start(fields, model.variables["params"],
               TokenizerSpec("huggingface", os.path.abspath(tokenizer)), os.path.abspath(path),
               hf={"pad_id": cfg.pad_id, "family": model.family,
                   "pooler": heads.get("pooler") if from_pooler else None,
                   # transformers' classifiers that apply a prediction head read the
                   # masked-LM head's dense and norm as theirs (ModernBERT's)
                   "head": heads.get("prediction_head")})


def start_of(config) -> Start:
  """Where config.init says the encoder starts from."""
  if config.init.run:
    return _from_run(config)
  if config.init.torch_checkpoint:
    return _from_torch(config)
  if config.init.hf:
    return _from_hf(config)
  return Start({}, None, None, "scratch")


def pooling(config) -> str:
  """config.task.pooling, or where unset the starting checkpoint's family's (`Family.pooling`:
  BERT's pooler, RoBERTa's head of its shape, DistilBERT's pre-classifier, ModernBERT's first
  token or mean through its prediction head, as its classifier_pooling says); the mean from
  anything else."""
  if config.task.pooling:
    return config.task.pooling
  if not config.init.get("hf"):
    return "mean"
  try:
    hf = families.read_hf_config(config.init.hf)
  except ValueError as e:
    raise RunError(f"config.init.hf: {e}") from None
  return families.of_config(hf).pooling(hf)


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


Texts = Callable[[dict], list]  # a line of the training file -> its texts (for a vocabulary)


def tokenizer_of(config, start: Start, train_path: str, texts: Texts, workdir: str):
  """The tokenizer (offset config.data.id_offset) and its file name in the data directory.

  A pretraining run brings its own; otherwise config.data.tokenizer says: "bytes", a file, or
  the kind of a vocabulary to train on the texts of `train_path` (`texts` finds them in a
  line); unset, from scratch, a SentencePiece vocabulary trained on them, and from a PyTorch
  checkpoint, bytes."""
  given = config.data.tokenizer
  if start.tokenizer is not None:  # a pretraining run's
    if given is not None and _spec(given) != _fingerprint(start.tokenizer):
      raise RunError(f"config.data.tokenizer: {given!r}, but {start.source} was trained with "
                     f"its {start.tokenizer.kind} tokenizer ({start.tokenizer.path or 'bytes'});"
                     f" leave it unset to take the run's")
    spec = start.tokenizer
  else:
    given = given or ("sentencepiece" if start.params is None else "bytes")
    if given in TRAINED:
      spec = _train_vocabulary(given, config.data.vocab_size, config.train.seq_len,
                               train_path, texts, workdir)
    else:
      spec = _as_spec(given)
  names = {"bytes": None, "sentencepiece": "tokenizer.model", "huggingface": "tokenizer.json"}
  try:
    return spec.load(ids(config, start)[0]), names[spec.kind]
  except Exception as e:  # noqa: BLE001 - whatever the library says, name the file
    field = ("config.data.tokenizer" if start.tokenizer is None else
             "config.init.hf" if start.hf is not None else "config.init.run")
    said = (str(e).splitlines() or [""])[0]
    raise RunError(f"{field}: {spec.path!r}, expected a readable {spec.kind} tokenizer "
                   f"({type(e).__name__}: {said})") from None


def template_of(tokenizer):
  """The special ids a Hugging Face checkpoint's tokenizer puts around texts and pairs."""
  try:
    template = tokenizer.template()
  except ValueError as e:
    raise RunError(f"config.init.hf: tokenizer.json: {e}") from None
  if template is None:
    raise RunError("config.init.hf: tokenizer.json has no post-processor, so it does not say "
                   "which special tokens ([CLS], [SEP], <s> …) the model was trained with")
  return template


def type_separator(meta: dict) -> int | None:
  """The id after which a pair's second text begins, where its tokens are of type 1 (BERT's),
  from the examples' dataset.json `meta`: the last id between the texts of a Hugging Face
  template; None where all tokens are of type 0."""
  template = meta.get("template")
  if not template or not template["between"] or not template.get("second_type"):
    return None
  return template["between"][-1]


def _train_vocabulary(kind: str, vocab_size: int, seq_len: int, path: str, texts: Texts,
                      workdir: str) -> TokenizerSpec:
  """A `kind` vocabulary of at most `vocab_size` pieces (fewer where the texts hold fewer)
  trained on the texts of the training file `path`, each cut to what `seq_len` ids can show
  (`flax_encoder.tokenizer.visible`), into WORKDIR/vocabulary. Training is deterministic, so a
  resumed run trains the same one (and the prepared examples, which record it, are reused)."""
  sample = []
  try:  # what the model can see of each text (a line of 100 MB took BPE 9 GB)
    for _, record in sources.Source(path).records():
      sample += [tokenizer_lib.visible(t, seq_len) for t in texts(record)
                 if isinstance(t, str) and t.strip()]
  except sources.PrepareError as e:
    raise RunError(str(e)) from None
  except FileNotFoundError:
    raise RunError(f"config.data.train: {path!r}: no such file") from None
  if not sample:
    raise RunError(f"{path}: no examples, expected JSON lines with a text and a label")
  # Each process its own file: they train the same vocabulary, and none waits on another.
  directory = os.path.join(workdir, "vocabulary", str(jax.process_index()))
  os.makedirs(directory, exist_ok=True)
  out = os.path.join(directory, "tokenizer.model" if kind == "sentencepiece" else "tokenizer.json")
  try:
    vocabulary.train_vocabulary(kind, sample, vocab_size, out + ".tmp", exact=False)
    os.replace(out + ".tmp", out)
  except Exception as e:  # noqa: BLE001 - the trainers' errors name no field
    raise RunError(f"config.data.vocab_size: {vocab_size}, expected a size a {kind} "
                   f"vocabulary can be trained to on the {len(sample)} training texts "
                   f"({str(e).splitlines()[0][:200]}); change it, or set "
                   f"config.data.tokenizer='bytes'") from None
  return TokenizerSpec("sentencepiece" if kind == "sentencepiece" else "huggingface", out)


def _as_spec(given: str) -> TokenizerSpec:
  if given == "bytes":
    return TokenizerSpec("bytes")
  if not os.path.isfile(given):
    raise RunError(f"config.data.tokenizer: {given!r}, expected 'bytes', one of {TRAINED} (a "
                   f"vocabulary trained on the training texts), a SentencePiece .model or a "
                   f"tokenizer.json")
  kind = "huggingface" if given.endswith(".json") else "sentencepiece"
  return TokenizerSpec(kind, os.path.abspath(given))


def _same_tokenizer_file(directory: str, name: str | None, tokenizer) -> bool:
  """Whether the data directory holds `tokenizer`'s file (a retrained vocabulary must be the
  one the examples were encoded with)."""
  if name is None:
    return True
  copy = os.path.join(directory, name)
  return os.path.isfile(copy) and (
      _fingerprint(TokenizerSpec(tokenizer.spec.kind, copy)) == _fingerprint(tokenizer.spec))


def _fingerprint(spec: TokenizerSpec) -> tuple:
  if spec.path is None:
    return (spec.kind, None)
  return (spec.kind, sha256_file(spec.path))


def _spec(given: str) -> tuple:
  return _fingerprint(_as_spec(given))


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


def prepare(config, workdir: str, resume: Resume, paths: dict, texts: Texts, build: Build,
            request: dict) -> Prepared:
  """The examples of `paths` ({'train': …, 'eval': …}) in WORKDIR/data, prepared by `build`
  unless they are there already for the same `request` (the task's fields, its label kind …,
  beside the tokenizer, ids and seq_len said here), and the encoder's config."""
  start = start_of(config)
  tokenizer, tokenizer_file = tokenizer_of(config, start, paths["train"], texts, workdir)
  _, pad_id = ids(config, start)
  template = template_of(tokenizer) if start.hf is not None else None
  directory = os.path.join(workdir, "data")
  request = {**request, "seq_len": config.train.seq_len,
             "tokenizer": {"kind": tokenizer.spec.kind, "file": tokenizer_file,
                           "offset": tokenizer.offset},
             "vocab_size": tokenizer.vocab_size, "pad_id": pad_id,
             "template": template.to_dict() if template else None}
  same_request = lambda meta: (all(meta.get(k) == v for k, v in request.items()) and
                               [i["path"] for i in meta["inputs"]] == list(paths.values()) and
                               _same_tokenizer_file(directory, tokenizer_file, tokenizer))
  dataset.prepare_once(directory, same_request,
                       lambda d: build(d, tokenizer, tokenizer_file, pad_id, template),
                       resume.resuming, resume.allow_changes, "config.data")
  loaded = examples.load_examples(directory)
  cfg = encoder_config(config, start, loaded["meta"]["vocab_size"], pad_id)
  return Prepared(start, loaded, cfg, pad_id)


def prepare_texts(config, workdir: str, resume: Resume, paths: dict,
                  label_kind: str) -> Prepared:
  """The texts (and pairs) of `paths` with their labels (`label_kind`: "class" or "number"),
  laid out as the starting encoder's tokenizer lays them out, prepared once."""
  fields = {"text": config.data.text_field, "pair": config.data.pair_field,
            "label": config.data.label_field}

  def build(directory, tokenizer, tokenizer_file, pad_id, template):
    return examples.prepare_examples(paths, directory, tokenizer, tokenizer_file,
                                     config.train.seq_len, fields, pad_id,
                                     config.data.separator_id, template, label_kind)

  return prepare(
      config, workdir, resume, paths, lambda record: [record.get(f) for f in
                                                      (fields["text"], fields["pair"])],
      build, {"fields": fields, "separator_id": config.data.separator_id,
              # unrecorded (None) for classes, as in the data directories prepared before
              "label_kind": examples.recorded_kind(label_kind)})


def say_prepared(prepared: Prepared, what: str, seq_len: int, note: str = "") -> None:
  """Prints (process 0) where the encoder starts, `what` the labels are, the examples and how
  many of them were truncated."""
  if jax.process_index() != 0:
    return
  meta = prepared.meta
  counted = lambda counts: ", ".join(f"{n} {s}" for s, n in counts.items() if n)
  truncated, cut = counted(meta["truncated"]), counted(meta.get("cut", {}))
  print(f"fine-tuning from {prepared.start.source}: {what}, {meta['examples']['train']} "
        f"training and {meta['examples']['eval']} held-out examples"
        + (f"; truncated to {seq_len} ids: {truncated}" if truncated else "")
        + (f"; cut to the first {tokenizer_lib.CHARS_PER_ID * seq_len} characters before "
           f"tokenizing (more than {seq_len} ids show): {cut}" if cut else "")
        + note, file=sys.stderr)


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


# ---------------------------------------------------------------------------------------------
# Checks and readers.


def check(config) -> None:
  """The cross-field checks of a fine-tuning config (RunError naming the field)."""
  check_init(config.init)
  given = config.data.tokenizer
  if given is not None and given not in ("bytes", *TRAINED) and not os.path.isfile(given):
    _as_spec(given)  # the one-line refusal


def check_init(init) -> None:
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


def run_tokenizer(workdir: str, meta: dict | None = None):
  """The tokenizer of the fine-tuning run in `workdir`, its ids numbered as its model's;
  `meta`: its examples' dataset.json, where already read."""
  directory = os.path.join(workdir, "data")
  meta = meta or examples.load_examples(directory)["meta"]
  return tokens.spec_of_dataset(directory, meta).load(meta["tokenizer"]["offset"])
