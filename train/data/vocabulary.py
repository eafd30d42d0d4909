"""Vocabularies: a tokenizer given as a file, or one trained on a sample of the corpus (in a
process of its own, so that Ctrl-C stops it at once): SentencePiece, or BPE, WordPiece and
unigram with Hugging Face `tokenizers`.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import re
import shutil
import signal
from collections.abc import Callable, Iterator

import numpy as np

from train.data.sources import PrepareError, Source, documents
from train.data.tokens import TokenizerSpec

TRAINED = ("sentencepiece", "bpe", "wordpiece", "unigram")


# Seconds per MB of sample, measured (BENCHMARKS.md): for the estimate printed before training.
_TRAINING_SECONDS_PER_MB = {"sentencepiece": 0.8, "bpe": 0.4, "wordpiece": 0.4, "unigram": 1.0}


# Lines longer than this many characters are cut (at a space where there is one) before a
# vocabulary is trained: SentencePiece skips longer sentences, BPE's time grows with the
# length of a line without spaces, and a sample is drawn line by line.
LONGEST_LINE = 1 << 14
_UNBROKEN = re.compile(r"\S{100,}")  # what the estimate of the training time does not cover


def sample_lines(paths: list[str], text_field: str, sample_mb: float,
                 keepends: bool = False) -> list[str]:
  """The corpus's non-blank lines (with their line ends if `keepends`), cut to LONGEST_LINE
  characters at most, all of them up to `sample_mb` MB of text, else an evenly spread,
  deterministic subset."""
  sources = [Source(p) for p in paths]
  keep = min(1.0, sample_mb * 1e6 / max(sum(s.size() for s in sources), 1))
  rng = np.random.default_rng(0)
  return [piece for _, text, _ in documents(sources, text_field)
          for line in text.splitlines(keepends) if line.strip()
          for piece in pieces(line) if rng.random() < keep]


def pieces(text: str, longest: int = LONGEST_LINE) -> Iterator[str]:
  """`text` in pieces of at most `longest` characters, each ending after a space where one
  lies in the second half of its span."""
  start = 0
  while len(text) - start > longest:
    space = text.rfind(" ", start + longest // 2, start + longest)
    end = start + longest if space < 0 else space + 1
    yield text[start:end]
    start = end
  yield text[start:]


def train_vocabulary(kind: str, sample: list[str], vocab_size: int, path: str,
                     exact: bool = True) -> None:
  """Trains a `kind` (one of TRAINED) tokenizer of `vocab_size` ids on `sample` into `path`;
  unless `exact`, of at most `vocab_size` (SentencePiece otherwise refuses a sample too small
  for it; the others stop where the sample runs out).
  SentencePiece falls back to bytes and BPE is byte-level, so they encode any text; unigram
  and WordPiece map characters the sample never held to their unknown token."""
  if kind == "sentencepiece":
    import sentencepiece as spm
    # One thread: sentencepiece's multi-threaded training gives different models run to run.
    with open(path, "wb") as model:
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(sample), model_writer=model, vocab_size=vocab_size,
          model_type="unigram", byte_fallback=True, character_coverage=0.9995,
          pad_id=-1, bos_id=-1, eos_id=-1, unk_id=0, num_threads=1,
          max_sentence_length=1 << 16, train_extremely_large_corpus=False, minloglevel=2,
          hard_vocab_limit=exact)
    return
  from tokenizers import Tokenizer as HFTokenizer
  from tokenizers import decoders, models, pre_tokenizers, trainers
  if kind == "bpe":
    tokenizer = HFTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  elif kind == "wordpiece":
    tokenizer = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, show_progress=False,
                                        special_tokens=["[UNK]"])
  else:
    tokenizer = HFTokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, show_progress=False,
                                      special_tokens=["<unk>"], unk_token="<unk>")
  tokenizer.train_from_iterator(sample, trainer)
  if tokenizer.get_vocab_size() > vocab_size:  # the trainers keep the whole alphabet
    raise ValueError(f"{vocab_size} is fewer than the {tokenizer.get_vocab_size()} tokens of "
                     f"this text's alphabet alone (every byte for bpe, every character "
                     f"otherwise)")
  tokenizer.save(path)


def _train_in_child(kind, paths, text_field, vocab_size, sample_mb, path, messages) -> None:
  """The child process's work: sample, train, report (('sample', MB) then ('done', None) or
  ('error', message)) through the queue `messages`."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends this process
  try:
    # The subword trainers of `tokenizers` learn pieces that hold line ends (code's indents).
    sample = sample_lines(paths, text_field, sample_mb, keepends=kind != "sentencepiece")
    if not sample:
      raise PrepareError("the inputs hold no text")
    size = sum(len(line) for line in sample)
    unbroken = sum(len(run.group()) for line in sample for run in _UNBROKEN.finditer(line))
    messages.put(("sample", (size / 1e6, unbroken / max(size, 1))))
    train_vocabulary(kind, sample, vocab_size, path)
    messages.put(("done", None))
  except PrepareError as e:
    messages.put(("error", str(e)))
  except Exception as e:  # noqa: BLE001 - the libraries' errors: a vocabulary they refuse
    messages.put(("error", f"--vocab-size {vocab_size}: {kind} cannot train it on this corpus "
                           f"({str(e).strip()})"))


def _trained(kind: str, paths: list[str], text_field: str, vocab_size: int, sample_mb: float,
             path: str, say: Callable[[str], None]) -> None:
  """Trains the vocabulary in a child process, saying what it does; a signal to this process
  ends the child too."""
  context = multiprocessing.get_context("spawn")
  messages = context.Queue()
  child = context.Process(target=_train_in_child, args=(kind, paths, text_field, vocab_size,
                                                        sample_mb, path, messages), daemon=True)
  say(f"vocabulary: sampling up to {sample_mb:g} MB of text")
  child.start()
  try:
    while True:
      try:
        what, value = messages.get(timeout=1)
      except queue.Empty:
        if not child.is_alive():
          raise PrepareError(f"training the {kind} vocabulary failed: its process ended with "
                             f"exit code {child.exitcode}") from None
        continue
      if what == "sample":
        mb, unbroken = value
        estimate = f"about {max(_TRAINING_SECONDS_PER_MB[kind] * mb, 1):.0f} s"
        if unbroken > 0.1:
          estimate += (f"; but {unbroken:.0%} of it is in runs of 100 or more characters "
                       f"without a space, which take several times longer")
        say(f"vocabulary: training {vocab_size} {kind} pieces on {mb:.1f} MB of text "
            f"({estimate})")
      elif what == "error":
        raise PrepareError(value)
      else:
        return
  finally:
    if child.is_alive():
      child.terminate()
    child.join()


def tokenizer_in(directory, tokenizer, vocab_size, paths, text_field, sample_mb, say):
  """(TokenizerSpec with its file in `directory`, that file's name or None)."""
  if tokenizer == "bytes":
    if vocab_size not in (None, 256):
      raise PrepareError(f"--vocab-size {vocab_size}: the bytes tokenizer has 256 tokens")
    return TokenizerSpec("bytes"), None
  if tokenizer in TRAINED:
    if vocab_size is None:
      raise PrepareError(f"--tokenizer {tokenizer} needs --vocab-size")
    kind, name = (("sentencepiece", "tokenizer.model") if tokenizer == "sentencepiece"
                  else ("huggingface", "tokenizer.json"))
    path = os.path.join(directory, name)
    _trained(tokenizer, paths, text_field, vocab_size, sample_mb, path, say)
    return TokenizerSpec(kind, path), name
  if not os.path.isfile(tokenizer):
    raise PrepareError(f"--tokenizer {tokenizer!r}: not bytes, {', '.join(TRAINED)} or a file")
  kind, name = (("huggingface", "tokenizer.json") if tokenizer.endswith(".json")
                else ("sentencepiece", "tokenizer.model"))
  path = os.path.join(directory, name)
  shutil.copyfile(tokenizer, path)
  spec = TokenizerSpec(kind, path)
  try:
    size = spec.load().size
  except Exception as e:  # noqa: BLE001 - whatever the library says, name the file
    raise PrepareError(f"--tokenizer {tokenizer!r}: not a readable {kind} tokenizer "
                       f"({type(e).__name__}: {e})") from None
  if vocab_size not in (None, size):
    raise PrepareError(f"--vocab-size {vocab_size}: {tokenizer!r} has {size} tokens")
  return spec, name
