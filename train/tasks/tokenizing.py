"""The tokenizer a fine-tuning's examples are encoded with: the starting run's or checkpoint's,
a file config.data.tokenizer names, bytes, or a vocabulary trained on the training texts; the
template a Hugging Face tokenizer lays texts out with; and a finished run's tokenizer."""

from __future__ import annotations

import os
from collections.abc import Callable

import jax

from flax_encoder import tokenizer as tokenizer_lib
from train.data import examples, sources, tokens, vocabulary
from train.data.tokens import TokenizerSpec
from train.errors import RunError
from train.files import sha256_file
from train.tasks.start import Start, ids

# What config.data.tokenizer may name besides a file: bytes, or a vocabulary trained on the
# training texts (config.data.vocab_size ids), the default from scratch.
TRAINED = vocabulary.TRAINED

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
      spec = as_spec(given)
  names = {"bytes": None, "sentencepiece": "tokenizer.model", "huggingface": "tokenizer.json"}
  try:
    model = start.tokenizer_bytes if spec is start.tokenizer else None
    return spec.load(ids(config, start)[0], model), names[spec.kind]
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


def as_spec(given: str) -> TokenizerSpec:
  if given == "bytes":
    return TokenizerSpec("bytes")
  if not os.path.isfile(given):
    raise RunError(f"config.data.tokenizer: {given!r}, expected 'bytes', one of {TRAINED} (a "
                   f"vocabulary trained on the training texts), a SentencePiece .model or a "
                   f"tokenizer.json")
  kind = "huggingface" if given.endswith(".json") else "sentencepiece"
  return TokenizerSpec(kind, os.path.abspath(given))


def same_tokenizer_file(directory: str, name: str | None, tokenizer) -> bool:
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
  return _fingerprint(as_spec(given))


def run_tokenizer(workdir: str, meta: dict | None = None):
  """The tokenizer of the fine-tuning run in `workdir`, its ids numbered as its model's;
  `meta`: its examples' dataset.json, where already read."""
  directory = os.path.join(workdir, "data")
  meta = meta or examples.load_examples(directory)["meta"]
  return tokens.spec_of_dataset(directory, meta).load(meta["tokenizer"]["offset"])
