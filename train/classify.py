r"""Fine-tuning: the encoder and a classification head trained on the user's labelled texts.

  python -m train --config=configs/classify.py --workdir runs/cls \
      --config.data.train=train.jsonl --config.data.eval=eval.jsonl \
      [--config.init.run=runs/demo | --config.init.torch_checkpoint=model.pt \
       --config.init.n_heads=8]

The task of the training loop's second kind (`ClassifyTask`, beside `masked_lm.MaskedLMTask`):
the model is the encoder, a pooling over the real tokens (their mean, or the first token),
dropout and a dense layer to one logit per class; the loss is cross-entropy; evaluation
reports accuracy, macro-F1 and the majority-class baseline. The encoder starts from a
pretraining run's newest verified checkpoint (`config.init.run`: its sizes and tokenizer), from
a PyTorch checkpoint (`config.init.torch_checkpoint`, sizes read off the weights, and the
classifier's Linear from `config.init.torch_head` if given), or from scratch. The examples
(train.examples) are prepared once into WORKDIR/data.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from flax_encoder import EncoderConfig
from flax_encoder.classifier import POOLINGS, macro_f1
from flax_encoder.classifier import SequenceClassifier as Classifier
from train import dataset, examples, settings, sources, tokens, vocabulary
from train.files import sha256_file
from train.errors import RunError
from train.task import (Definition, Field, Plots, Resume, Setup, choice, integer, optional,
                        string)
from train.tokens import TokenizerSpec

# The encoder's fields a pretrained encoder brings (what it is and how its parameters are
# stored): a config that gives one must agree with it. The others (dropout, dtype, attention,
# remat) are the fine-tuning run's own. pad_id is the data's.
ARCHITECTURE = tuple(name for role in ("architecture", "parameters")
                     for name in EncoderConfig.fields(role) if name != "pad_id")
# What config.data.tokenizer may name besides a file: bytes, or a vocabulary trained on the
# training texts (config.data.vocab_size ids), the default from scratch.
TRAINED = vocabulary.TRAINED


@dataclasses.dataclass(frozen=True)
class ClassifyTask:
  """Classification as `train.step` runs it (see `train.step.Task`). A batch holds 'tokens'
  [batch, seq] and 'labels' [batch]; a label of -1 pads the last held-out batch."""

  model: Classifier
  label_smoothing: float
  baseline_label: int  # the training data's commonest class

  def init(self, rng: jax.Array, seq_len: int):
    return self.model.init(rng, jnp.ones((1, seq_len), jnp.int32))["params"]

  def batch(self, rows: dict, key: jax.Array) -> dict:
    return rows  # nothing drawn: the examples are the batch

  def loss_count(self, batch: dict) -> jax.Array:
    return jnp.sum(batch["labels"] >= 0)

  def loss_sum(self, params, batch: dict, dropout_rng: jax.Array) -> jax.Array:
    logits = self.model.apply({"params": params}, batch["tokens"], deterministic=False,
                              rngs={"dropout": dropout_rng})
    labels = optax.smooth_labels(jax.nn.one_hot(batch["labels"], self.model.num_labels),
                                 self.label_smoothing)
    return jnp.sum(optax.softmax_cross_entropy(logits, labels) * (batch["labels"] >= 0))

  def eval_sums(self, params, batch: dict) -> dict:
    logits = self.model.apply({"params": params}, batch["tokens"])
    labels = batch["labels"]
    valid = labels >= 0
    predicted = jnp.argmax(logits, -1)
    true_1hot = jax.nn.one_hot(labels, self.model.num_labels) * valid[:, None]
    predicted_1hot = jax.nn.one_hot(predicted, self.model.num_labels) * valid[:, None]
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
    return {"ce": jnp.sum(ce * valid), "correct": jnp.sum((predicted == labels) & valid),
            "baseline_correct": jnp.sum((labels == self.baseline_label) & valid),
            "count": jnp.sum(valid), "true_positives": jnp.sum(true_1hot * predicted_1hot, 0),
            "true": jnp.sum(true_1hot, 0), "predicted": jnp.sum(predicted_1hot, 0)}

  @staticmethod
  def token_count(rows: dict) -> int:
    """Ids in a batch of examples, padding included."""
    return int(rows["tokens"].size)

  @staticmethod
  def eval_metrics(sums: dict) -> dict:
    """Summed eval_sums -> loss, accuracy, the majority-class baseline's accuracy, and
    macro-F1: the mean F1 over the classes that occur in the labels or the predictions."""
    count = max(float(sums["count"]), 1.0)
    return {"loss": float(sums["ce"]) / count, "accuracy": float(sums["correct"]) / count,
            "baseline_accuracy": float(sums["baseline_correct"]) / count,
            "macro_f1": macro_f1(sums["true_positives"], sums["true"], sums["predicted"])}


# ---------------------------------------------------------------------------------------------
# Where the encoder starts from.


@dataclasses.dataclass
class _Start:
  """The encoder's architecture fields, its parameters (or None) and its tokenizer."""
  fields: dict
  params: dict | None
  tokenizer: TokenizerSpec | None  # None: config.data.tokenizer decides
  source: str
  head: dict | None = None  # the classifier's parameters, from a PyTorch Linear
  # A Hugging Face checkpoint's: its ids as they are (offset 0), its padding id, its family
  # and its pooler's parameters (BERT's).
  hf: dict | None = None


def _from_run(config) -> _Start:
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
  return _Start(fields, variables["params"], dataset.run_tokenizer(run_config, run), run)


def _from_torch(config) -> _Start:
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
  head = None
  if init.torch_head:
    weight, bias = (state.get(f"{init.torch_head}.{p}") for p in ("weight", "bias"))
    if weight is None or bias is None:
      raise RunError(f"config.init.torch_head: {init.torch_head!r}, expected the prefix of a "
                     f"Linear in {path} (its .weight and .bias)")
    head = {"kernel": np.asarray(weight).T, "bias": np.asarray(bias)}
  return _Start(fields, params, None, path, head)


def _from_hf(config) -> _Start:
  from flax_encoder.pytorch.hf import FAMILIES, load_hf
  path = config.init.hf
  try:
    cfg, variables = load_hf(path)
  except (FileNotFoundError, ValueError, TypeError) as e:
    raise RunError(f"config.init.hf: {e}".splitlines()[0]) from None
  tokenizer = os.path.join(path, "tokenizer.json")
  if not os.path.isfile(tokenizer):
    raise RunError(f"config.init.hf: {path} has no tokenizer.json (the fast tokenizer's file; "
                   f"transformers writes it with AutoTokenizer.from_pretrained(DIR)"
                   f".save_pretrained(DIR))")
  fields = {name: getattr(cfg, name) for name in ARCHITECTURE}
  fields["param_dtype"] = np.dtype(fields["param_dtype"]).name
  with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
    family = FAMILIES[json.load(f)["model_type"]]
  pooler = variables.get("heads", {}).get("pooler") if family == "bert" else None
  return _Start(fields, variables["params"], TokenizerSpec("huggingface",
                                                           os.path.abspath(tokenizer)),
                os.path.abspath(path), hf={"pad_id": cfg.pad_id, "family": family,
                                           "pooler": pooler})


def _start(config) -> _Start:
  if config.init.run:
    return _from_run(config)
  if config.init.torch_checkpoint:
    return _from_torch(config)
  if config.init.hf:
    return _from_hf(config)
  return _Start({}, None, None, "scratch")


def pooling(config) -> str:
  """config.task.pooling, or where unset the starting checkpoint's family's: BERT's pooler
  (RoBERTa's head has its shape), DistilBERT's pre-classifier; the mean from anything else."""
  if config.task.pooling:
    return config.task.pooling
  family = None
  if config.init.get("hf"):
    from flax_encoder.pytorch.hf import FAMILIES, read_hf_config
    try:
      family = FAMILIES[read_hf_config(config.init.hf)["model_type"]]
    except ValueError as e:
      raise RunError(f"config.init.hf: {e}") from None
  return {None: "mean", "distilbert": "pre_classifier"}.get(family, "pooler")


def _ids(config, start: _Start) -> tuple[int, int]:
  """(id offset, padding id) of the examples: a Hugging Face checkpoint's own, or config.data's."""
  if start.hf is not None:
    return 0, start.hf["pad_id"]
  return config.data.id_offset, config.data.pad_id


def _encoder_config(config, start: _Start, vocab_size: int, pad_id: int) -> EncoderConfig:
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


def _tokenizer(config, start: _Start, paths: dict, fields: dict, workdir: str):
  """The tokenizer (offset config.data.id_offset) and its file name in the data directory.

  A pretraining run brings its own; otherwise config.data.tokenizer says: "bytes", a file, or
  the kind of a vocabulary to train on the training texts; unset, from scratch, a SentencePiece
  vocabulary trained on them, and from a PyTorch checkpoint, bytes."""
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
      spec = _train_vocabulary(given, config.data.vocab_size, paths["train"], fields, workdir)
    else:
      spec = _as_spec(given)
  names = {"bytes": None, "sentencepiece": "tokenizer.model", "huggingface": "tokenizer.json"}
  try:
    return spec.load(_ids(config, start)[0]), names[spec.kind]
  except Exception as e:  # noqa: BLE001 - whatever the library says, name the file
    raise RunError(f"config.data.tokenizer: {spec.path!r}, expected a readable {spec.kind} "
                   f"tokenizer ({type(e).__name__}: {e})") from None


def _template(tokenizer):
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


def _train_vocabulary(kind: str, vocab_size: int, path: str, fields: dict,
                      workdir: str) -> TokenizerSpec:
  """A `kind` vocabulary of at most `vocab_size` pieces (fewer where the texts hold fewer)
  trained on the texts of the training file `path`, into WORKDIR/vocabulary. Training is deterministic, so a resumed run trains the same
  one (and the prepared examples, which record it, are reused)."""
  texts = []
  try:
    for _, record in sources.Source(path).records():
      texts += [record[f] for f in (fields["text"], fields["pair"])
                if isinstance(record.get(f), str) and record[f].strip()]
  except sources.PrepareError as e:
    raise RunError(str(e)) from None
  except FileNotFoundError:
    raise RunError(f"config.data.train: {path!r}: no such file") from None
  if not texts:
    raise RunError(f"{path}: no examples, expected JSON lines with a text and a label")
  # Each process its own file: they train the same vocabulary, and none waits on another.
  directory = os.path.join(workdir, "vocabulary", str(jax.process_index()))
  os.makedirs(directory, exist_ok=True)
  out = os.path.join(directory, "tokenizer.model" if kind == "sentencepiece" else "tokenizer.json")
  try:
    vocabulary.train_vocabulary(kind, texts, vocab_size, out + ".tmp", exact=False)
    os.replace(out + ".tmp", out)
  except Exception as e:  # noqa: BLE001 - the trainers' errors name no field
    raise RunError(f"config.data.vocab_size: {vocab_size}, expected a size a {kind} "
                   f"vocabulary can be trained to on the {len(texts)} training texts "
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
# What the loop needs.


def setup(config, workdir: str, resume: Resume) -> Setup:
  """Fine-tuning on config.data.train and config.data.eval, from config.init."""
  start = _start(config)
  paths = {"train": config.data.train, "eval": config.data.eval}
  if examples.BUILTIN in paths.values():
    if set(paths.values()) != {examples.BUILTIN}:
      raise RunError(f"config.data.eval: {paths['eval']!r}: the built-in task holds out its own "
                     f"examples; set both config.data.train and config.data.eval to "
                     f"{examples.BUILTIN!r}, or neither")
    if jax.process_index() == 0:
      paths = examples.write_builtin(os.path.join(workdir, "builtin"))
    else:
      paths = {s: os.path.join(workdir, "builtin", f"{s}.jsonl") for s in paths}
  fields = {"text": config.data.text_field, "pair": config.data.pair_field,
            "label": config.data.label_field}
  tokenizer, tokenizer_file = _tokenizer(config, start, paths, fields, workdir)
  _, pad_id = _ids(config, start)
  template = _template(tokenizer) if start.hf is not None else None
  directory = os.path.join(workdir, "data")
  request = {"seq_len": config.train.seq_len, "fields": fields,
             "tokenizer": {"kind": tokenizer.spec.kind, "file": tokenizer_file,
                           "offset": tokenizer.offset},
             "vocab_size": tokenizer.vocab_size, "pad_id": pad_id,
             "separator_id": config.data.separator_id,
             "template": template.to_dict() if template else None}
  same_request = lambda meta: (all(meta.get(k) == v for k, v in request.items()) and
                               [i["path"] for i in meta["inputs"]] == list(paths.values()) and
                               _same_tokenizer_file(directory, tokenizer_file, tokenizer))
  build = lambda d: examples.prepare_examples(paths, d, tokenizer, tokenizer_file,
                                              config.train.seq_len, fields, pad_id,
                                              config.data.separator_id, template)
  dataset.prepare_once(directory, same_request, build, resume.resuming, resume.allow_changes,
                    "config.data")
  loaded = examples.load_examples(directory)
  meta = loaded["meta"]
  cfg = _encoder_config(config, start, meta["vocab_size"], pad_id)
  labels = meta["labels"]
  params = _start_params(start, cfg, labels, config)
  counts = np.bincount(np.asarray(loaded["train"]["labels"]), minlength=len(labels))
  model = Classifier(cfg, len(labels), pooling(config), type_separator(meta))
  task = ClassifyTask(model, config.optim.label_smoothing, int(np.argmax(counts)))
  if jax.process_index() == 0:
    cut = {s: n for s, n in meta["truncated"].items() if n}
    print(f"fine-tuning from {start.source}: {len(labels)} classes, "
          f"{meta['examples']['train']} training and {meta['examples']['eval']} held-out "
          f"examples" + (f"; truncated to {config.train.seq_len} ids: "
                         + ", ".join(f"{n} {s}" for s, n in cut.items()) if cut else ""),
          file=sys.stderr)
  return Setup(task=task, encoder=cfg, train=loaded["train"], eval=loaded["eval"],
               eval_fill={"tokens": pad_id, "labels": -1},
               record={"encoder": cfg.record(), "dataset": loaded["identity"],
                       "source": directory, "labels": labels, "start": start.source,
                       "pooling": model.pooling},
               start_params=params)


def _start_params(start: _Start, cfg: EncoderConfig, labels: list, config):
  """The parameters to start from (encoder, and the classifier from a PyTorch head), or None."""
  if start.params is None:
    return None
  num_labels = len(labels)
  if start.hf is not None and start.hf["pooler"] and pooling(config) == "pooler":
    dtype = np.dtype(cfg.param_dtype)
    return {"encoder": start.params,
            "pooler": jax.tree.map(lambda x: x.astype(dtype), start.hf["pooler"])}
  if start.head is None:
    return {"encoder": start.params}
  kernel = start.head["kernel"]
  if labels != list(range(num_labels)):
    raise RunError(f"config.init.torch_head: {config.init.torch_head!r} scores classes "
                   f"0 … {kernel.shape[1] - 1} in its rows' order; expected the labels to be "
                   f"those integers, got {labels[:5]}…")
  if kernel.shape != (cfg.d_model, num_labels):
    raise RunError(f"config.init.torch_head: {config.init.torch_head!r} is a Linear "
                   f"{kernel.shape[0]} -> {kernel.shape[1]}, expected {cfg.d_model} -> "
                   f"{num_labels} (the data's classes)")
  dtype = np.dtype(cfg.param_dtype)
  return {"encoder": start.params,
          "classifier": {"kernel": kernel.astype(dtype), "bias": start.head["bias"].astype(dtype)}}


# ---------------------------------------------------------------------------------------------
# What the program knows of the task.


def summary(metrics: dict) -> str:
  return (f"eval accuracy {metrics['accuracy']:.3f}, macro-F1 {metrics['macro_f1']:.3f} "
          f"(majority class {metrics['baseline_accuracy']:.3f}), eval loss "
          f"{metrics['loss']:.3f}")


def export(workdir: str, out: str) -> str:
  """Writes the run's classifier (encoder, head, tokenizer and classes) to `out` (.msgpack), a
  file `flax_encoder.text_classifier.TextClassifier.load` turns into text -> labels."""
  from train.predict import Predictor
  Predictor(workdir).text_classifier().save(out)
  return out


def _check(config) -> None:
  _check_init(config.init)
  given = config.data.tokenizer
  if given is not None and given not in ("bytes", *TRAINED) and not os.path.isfile(given):
    _as_spec(given)  # the one-line refusal


def _check_init(init) -> None:
  given = [f"config.init.{k}" for k in ("run", "torch_checkpoint", "hf") if init.get(k)]
  if len(given) > 1:
    raise RunError(f"{given[1]}: {init.get(given[1].split('.')[-1])!r}, expected unset with "
                   f"{given[0]}: the encoder starts from one of them")
  if init.torch_checkpoint and init.n_heads is None:
    raise RunError("config.init.n_heads: unset, expected the PyTorch encoder's number of heads "
                   "(the weights' shapes do not show it)")
  if init.torch_head and not init.torch_checkpoint:
    raise RunError(f"config.init.torch_head: {init.torch_head!r}, expected it only with "
                   f"config.init.torch_checkpoint")


def run_tokenizer(workdir: str, meta: dict | None = None):
  """The tokenizer of the fine-tuning run in `workdir`, its ids numbered as its model's;
  `meta`: its examples' dataset.json, where already read."""
  directory = os.path.join(workdir, "data")
  meta = meta or examples.load_examples(directory)["meta"]
  return tokens.spec_of_dataset(directory, meta).load(meta["tokenizer"]["offset"])


DEFINITION = Definition(
    name="classify",
    fields={
        "task.pooling": Field(optional(choice(POOLINGS))),
        "data.train": Field(string),
        "data.eval": Field(string),
        "data.tokenizer": Field(optional(string)),
        "data.vocab_size": Field(integer(2)),
        "data.text_field": Field(string),
        "data.pair_field": Field(string),
        "data.label_field": Field(string),
        "data.id_offset": Field(integer(0)),
        "data.pad_id": Field(integer(0)),
        "data.separator_id": Field(integer(0)),
        "init.run": Field(optional(string)),
        "init.torch_checkpoint": Field(optional(string)),
        "init.n_heads": Field(optional(integer(1))),
        "init.prefix": Field(lambda value: None if isinstance(value, str) else "a string"),
        "init.torch_head": Field(optional(string)),
        "init.hf": Field(optional(string)),
    },
    setup=setup,
    plots=Plots(loss_title="Classification loss", loss_unit="nats / example",
                train_loss="train", metrics={"accuracy": "accuracy", "macro_f1": "macro-F1"},
                baseline=("baseline_accuracy", "baseline: majority class"),
                accuracy_title="Held-out accuracy and macro-F1"),
    summary=summary,
    export=export,
    check=_check,
    tokenizer=lambda config, workdir: run_tokenizer(workdir),
)
