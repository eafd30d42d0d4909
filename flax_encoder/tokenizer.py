"""Text -> token ids, for models trained on a tokenizer's ids plus an offset.

  tokenizer = Tokenizer.from_file("sentencepiece", "tokenizer.model", offset=4)
  ids = encode_examples(tokenizer, ["a text"], None, seq_len=128, separator_id=2)

Three kinds: "bytes" (UTF-8 bytes, 256 ids), "sentencepiece" (a SentencePiece model) and
"huggingface" (a `tokenizers` tokenizer.json). A tokenizer keeps its model's bytes, so that it
can be saved inside another file (a text classifier's) and rebuilt from there with no file
of its own. sentencepiece and tokenizers are imported only for their kind (the `text` extra).
A Hugging Face model directory's tokenizer (its tokenizer.json, or the vocab.txt or vocab.json
and merges.txt older checkpoints ship) is `flax_encoder.hf_tokenizer.tokenizer_from_directory`.

A text's first ids are tokenized a piece at a time until an example has all it can hold
(`Tokenizer.encode_leading`): the ids are those of the whole text, and a line of any length
takes bounded memory.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Sequence

import numpy as np

KINDS = ("bytes", "sentencepiece", "huggingface")


class TokenizerFailure(ValueError):
  """The `tokenizers` library failed on a text: a Rust panic inside it (a Split regex that
  backtracks past Oniguruma's limit, say), which pyo3 raises as a BaseException."""


def is_panic(error: BaseException) -> bool:
  """Whether `error` is a Rust panic inside `tokenizers`: a PanicException, which `except
  Exception` lets through."""
  return type(error).__name__ == "PanicException" and not isinstance(error, Exception)


def _reading(call):
  """call(), into `tokenizers`; TokenizerFailure where it panics."""
  try:
    return call()
  except BaseException as e:  # noqa: BLE001 - a panic is no Exception
    if not is_panic(e):
      raise
    said = (str(e).splitlines() or [""])[0]
    raise TokenizerFailure(f"the `tokenizers` library failed on a text ({said}), expected a "
                           f"tokenizer that reads any text") from None

# Characters of a text per id wanted that are tokenized first (`encode_leading`). Tokens
# average 3 to 5 characters and SentencePiece's are 16 at most by default, so one piece
# nearly always holds the ids wanted; the tokenizers hold 130 to 200 bytes per character of a
# text they encode (`tokenizers`, measured: a line of 100 MB took 13 to 20 GB), so a text is
# never handed to them whole. A text whose first piece holds too few ids (runs of whitespace
# or control characters a tokenizer drops, long words) is read on, a piece at a time.
CHARS_PER_ID = 64
# The most characters handed to the tokenizer at once (about 200 MB of its memory). Only a
# single word longer than this, with nothing to split it at, is tokenized from this many of
# its first characters instead of whole.
MAX_PIECE_CHARS = 1 << 20


class Tokenizer:
  """A tokenizer whose id i is stored as i + `offset` (ids below the offset are the model's
  special ids: padding, mask, separator)."""

  def __init__(self, kind: str, model: bytes | None = None, offset: int = 0):
    if kind not in KINDS:
      raise ValueError(f"tokenizer kind: {kind!r}, expected one of {KINDS}")
    if (model is None) != (kind == "bytes"):
      raise ValueError(f"tokenizer model: expected {'none' if kind == 'bytes' else 'its bytes'} "
                       f"for kind {kind!r}")
    self.kind, self.model, self.offset = kind, model, offset
    self._model = None
    # What the model's file sets that this tokenizer does not do, as words ("padding to 128")
    self.ignored_settings: list[str] = []
    if kind == "sentencepiece":
      import sentencepiece as spm
      self._model = spm.SentencePieceProcessor(model_proto=model)
    elif kind == "huggingface":
      from tokenizers import Tokenizer as HFTokenizer
      self._model = HFTokenizer.from_str(model.decode("utf-8"))
      # Examples are laid out and cut here (`example_ids`), so a file's padding and truncation
      # (sentence-transformers saves both) would add [PAD] ids to each text and cut it twice;
      # they are switched off on the object only, and `model` keeps the file as it came.
      self.ignored_settings = _padding_and_truncation(self._model)
      self._model.no_padding()
      self._model.no_truncation()

  @classmethod
  def from_file(cls, kind: str, path: str | os.PathLike | None, offset: int = 0) -> Tokenizer:
    """The tokenizer of `kind` whose model is the file `path` (None for bytes)."""
    if kind == "bytes":
      return cls("bytes", None, offset)
    with open(path, "rb") as f:
      return cls(kind, f.read(), offset)

  @property
  def size(self) -> int:
    """The tokenizer's own vocabulary (without the ids below the offset)."""
    if self.kind == "bytes":
      return 256
    if self.kind == "sentencepiece":
      return self._model.get_piece_size()
    return self._model.get_vocab_size()

  @property
  def vocab_size(self) -> int:
    """Ids the encoded texts can hold: offset + size."""
    return self.offset + self.size

  @functools.cached_property
  def unk_id(self) -> int | None:
    """The id (with the offset) of the unknown token, which stands for what the tokenizer
    cannot read; None for bytes and for a model without one (byte-level BPE)."""
    if self.kind == "bytes":
      return None
    if self.kind == "sentencepiece":
      unk = self._model.unk_id()
    else:  # tokenizers' Python models do not all show it (Unigram's unk_id): its file does
      model = json.loads(self.model)["model"]
      unk = (model.get("unk_id") if model.get("type") == "Unigram" else
             self._model.token_to_id(model["unk_token"]) if model.get("unk_token") else None)
    return None if unk is None or unk < 0 else unk + self.offset

  def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
    """Each text's ids (int32), no special ids added."""
    if self.kind == "bytes":
      ids = [np.frombuffer(t.encode("utf-8"), np.uint8) for t in texts]
    elif self.kind == "sentencepiece":
      ids = self._model.encode(list(texts))
    else:
      ids = [e.ids for e in _reading(
          lambda: self._model.encode_batch(list(texts), add_special_tokens=False))]
    return [np.asarray(i, np.int32) + self.offset for i in ids]

  def encode_with_template(self, texts: Sequence[str], seq_len: int) -> list[np.ndarray]:
    """Each text's ids as transformers' tokenizer gives them to a model: cut to `seq_len` with
    the template's special ids around them ([CLS] … [SEP]; `template`), no padding."""
    return encode_examples(self, list(texts), None, seq_len, 0, self.template())

  def encode_leading(self, texts: Sequence[str], count: int) -> list[np.ndarray]:
    """Each text's first `count` ids (all of them where it has fewer): `encode_batch`'s,
    cut to `count`, without handing the tokenizer more of a text than those ids need.

    A text longer than count * CHARS_PER_ID characters is tokenized a piece at a time. The
    tokenizers split a text into words (whitespace, punctuation) before their model reads
    each word on its own, so the ids of a piece's words, all but its last two (which the
    text after the piece may lengthen or join), are the whole text's; the next piece begins
    where the kept ids end. A piece whose words are too few to keep any is doubled, up to
    MAX_PIECE_CHARS; one that yields no ids at all (whitespace a tokenizer drops) is
    passed over."""
    piece = max(count, 1) * CHARS_PER_ID
    if self.kind == "bytes":  # one id a byte, at least one byte a character
      return [ids[:count] for ids in self.encode_batch([t[:count] for t in texts])]
    out = []
    for text, first in zip(texts, self._encode_words([t[:piece] for t in texts])):
      ids = (first[0] if len(text) <= piece else
             self._leading(text, count, piece, first) if self.kind == "huggingface" else
             self._leading_prefix(text, count, piece, first))
      out.append(np.asarray(ids[:count], np.int32) + self.offset)
    return out

  def _leading_prefix(self, text: str, count: int, piece: int, first) -> list[int]:
    """`encode_leading` of one text by SentencePiece, whose Python API says where its pieces
    end only through protobuf: ever longer beginnings of the text, up to MAX_PIECE_CHARS."""
    size, (got, words, _) = piece, first
    while True:
      last = max(words, default=-1)
      kept = sum(w < last - 1 for w in words)
      if size >= len(text) or size >= MAX_PIECE_CHARS and kept < count:
        return got  # the whole text, or as far as is read at most
      if kept >= count:
        return got[:kept]
      size = min(2 * size, MAX_PIECE_CHARS)
      got, words, _ = self._encode_words([text[:size]])[0]

  def _leading(self, text: str, count: int, piece: int, first) -> list[int]:
    """`encode_leading` of one text longer than `piece` characters, `first` its first
    piece's (ids, word of each id, character where each id ends)."""
    ids: list[int] = []
    start, size, encoded = 0, piece, first
    while True:
      got, words, ends = encoded
      if start + size >= len(text):  # the piece reaches the end: all its ids are the text's
        return ids + list(got)
      last = max(words, default=-1)
      kept = sum(w < last - 1 for w in words)  # words are numbered in order
      if not kept and got and size < MAX_PIECE_CHARS:  # too few words to keep: read more
        size = min(2 * size, MAX_PIECE_CHARS)
      else:
        # Nothing kept: a piece of no ids is passed over, a word longer than the most handed
        # at once is read as far as that.
        kept = kept or len(got)
        ids += got[:kept]
        if len(ids) >= count:
          return ids
        start += ends[kept - 1] if kept else size
        size = piece
      encoded = self._encode_words([text[start:start + size]])[0]

  def _encode_words(self, texts: list[str]) -> list[tuple[list[int], list[int], list[int]]]:
    """Each text's own ids (no offset), the word each belongs to, and the character of the
    text at which each ends."""
    if self.kind == "huggingface":
      out = []
      for e in _reading(lambda: self._model.encode_batch(list(texts),
                                                         add_special_tokens=False)):
        words = [w if w is not None else -1 for w in e.word_ids]
        out.append((list(e.ids), words, [end for _, end in e.offsets]))
      return out
    out = []
    for ids, pieces in zip(self._model.encode(list(texts)),
                           self._model.encode(list(texts), out_type=str)):
      # SentencePiece marks a word's first piece with "\u2581".
      out.append((ids, np.cumsum([p.startswith("\u2581") for p in pieces]).tolist(), None))
    return out

  def template(self) -> Template | None:
    """The special ids a huggingface tokenizer's post-processor puts around one text and
    around a pair ([CLS] a [SEP] b [SEP], <s> a </s></s> b </s>), as ids with the offset;
    None for a tokenizer without one."""
    if self.kind != "huggingface" or self._model.post_processor is None:
      return None
    encoding = _reading(lambda: self._model.encode("a", "b", add_special_tokens=True))
    parts: list[list[int]] = [[], [], []]
    place = 0  # 0 before the first text, 1 between the texts, 2 after the second
    for token, sequence in zip(encoding.ids, encoding.sequence_ids):
      if sequence is None:
        parts[place].append(token + self.offset)
      else:
        place = 1 if sequence == 0 else 2
    single = _reading(lambda: self._model.encode("a", add_special_tokens=True))
    if [t + self.offset for t, s in zip(single.ids, single.sequence_ids) if s is None] != (
        parts[0] + parts[2]):
      raise ValueError("the tokenizer's post-processor puts other special tokens around one "
                       "text than around a pair's first and last: not a template this "
                       "library lays out")
    return Template(*map(tuple, parts), second_type=max(encoding.type_ids))

  def piece(self, own_id: int) -> str:
    """The tokenizer's own id `own_id` (without the offset) as text: a byte, a piece."""
    if self.kind == "bytes":
      return bytes([own_id]).decode("latin-1")
    if self.kind == "sentencepiece":
      return self._model.id_to_piece(own_id)
    return self._model.id_to_token(own_id)


def _padding_and_truncation(model) -> list[str]:
  """A `tokenizers` Tokenizer's padding and truncation, in words."""
  settings = []
  if model.padding is not None:
    length, multiple = model.padding["length"], model.padding["pad_to_multiple_of"]
    settings.append(f"padding to {length if length is not None else 'the longest'}"
                    + (f" (a multiple of {multiple})" if multiple else ""))
  if model.truncation is not None:
    settings.append(f"truncation at {model.truncation['max_length']}")
  return settings


@dataclasses.dataclass(frozen=True)
class Template:
  """The special ids around an example's texts: `start` a `between` b `end` for a pair,
  `start` a `end` for one text (BERT: [CLS], [SEP], [SEP]); `second_type` is the token type
  of b and `end` (BERT's 1; 0 where the model has no token types, RoBERTa's)."""

  start: tuple[int, ...] = ()
  between: tuple[int, ...] = ()
  end: tuple[int, ...] = ()
  second_type: int = 0

  def to_dict(self) -> dict:
    return {"start": list(self.start), "between": list(self.between), "end": list(self.end),
            "second_type": self.second_type}

  @classmethod
  def from_dict(cls, d: dict) -> Template:
    return cls(*(tuple(int(i) for i in d[k]) for k in ("start", "between", "end")),
               second_type=int(d.get("second_type", 0)))


def visible(text: str, seq_len: int) -> str:
  """The first seq_len * CHARS_PER_ID characters of `text`: about what an example of
  `seq_len` ids shows, as a sample to train a vocabulary on."""
  return text[:seq_len * CHARS_PER_ID]


def kept(first: int, second: int, room: int, first_longer=lambda: False) -> tuple[int, int]:
  """The ids kept of a pair's texts of `first` and `second` ids where `room` ids are left
  between its special ids, as the tokenizers library cuts them (truncation="longest_first",
  its LongestFirst): the shorter text whole and the longer cut to the rest where the shorter
  takes at most half, else each half, the odd id to the text that is longer whole (to the
  second where they are as long). `first_longer()`: whether the first text is the longer, asked
  only where both are longer than `room` (their ids counted up to room + 1) and room is odd."""
  if first + second <= room:
    return first, second
  swap = first > second or (first == second > room and room % 2 == 1 and first_longer())
  short, long = (second, first) if swap else (first, second)
  if 2 * short <= room:
    short, long = short, room - short
  else:
    short, long = room // 2, room - room // 2
  return (long, short) if swap else (short, long)


# How far past an example's ids `first_is_longer` tokenizes two texts, at most: a bound on the
# work a pair of huge texts makes (transformers tokenizes them whole).
LONGER_LOOK = 8


def first_is_longer(tokenizer: Tokenizer, first: str, second: str, count: int) -> bool:
  """Whether `first` has more ids than `second`, each tokenized in ever longer beginnings from
  `count` ids until the shorter ends: where two long texts of a pair are cut, the odd id goes
  to the longer. Past LONGER_LOOK * count ids of each they count as as long (the odd id to the
  second), which differs from transformers only for two texts that long, of other lengths."""
  limit = LONGER_LOOK * count
  while count < limit:
    count *= 2
    a, b = tokenizer.encode_leading([first, second], count)
    if len(a) < count or len(b) < count:
      return len(a) > len(b)
  return False


def example_ids(first: np.ndarray, second: np.ndarray | None, seq_len: int,
                separator_id: int, template: Template | None = None,
                first_longer=lambda: False) -> tuple[np.ndarray, bool]:
  """One example's ids, at most `seq_len`: the text's, or the text's, the separator and the
  pair's, cut as transformers cuts a pair (`kept`; `first_longer` as it takes it); and whether
  anything was cut. A `template` puts its special ids around them instead of the separator
  between."""
  ids, truncated, _ = laid_out(first, second, seq_len, separator_id, template, first_longer)
  return ids, truncated


def laid_out(first: np.ndarray, second: np.ndarray | None, seq_len: int, separator_id: int,
             template: Template | None = None, first_longer=lambda: False
             ) -> tuple[np.ndarray, bool, int]:
  """`example_ids`, and where the second text's part begins (its ids, then the template's
  end; the ids of token type 1 for BERT): the ids' length for one text."""
  template = template or Template(between=(separator_id,))
  ids = lambda values: np.asarray(values, first.dtype)
  start, between, end = ids(template.start), ids(template.between), ids(template.end)
  if second is None:
    room = seq_len - len(start) - len(end)
    laid = np.concatenate([start, first[:room], end])
    return laid, len(first) > room, len(laid)
  room = seq_len - len(start) - len(between) - len(end)
  n1, n2 = kept(len(first), len(second), room, first_longer)
  truncated = n1 < len(first) or n2 < len(second)
  return (np.concatenate([start, first[:n1], between, ids(second[:n2]), end]), truncated,
          len(start) + n1 + len(between))


def encode_examples(tokenizer: Tokenizer, texts: list[str], pairs: list[str | None] | None,
                    seq_len: int, separator_id: int,
                    template: Template | None = None) -> list[np.ndarray]:
  """Each example's ids (`example_ids`; a pair of None: the text alone), not padded; of
  each text only the ids an example can hold are tokenized (`Tokenizer.encode_leading`)."""
  return [ids for ids, _ in encode_pairs(tokenizer, texts, pairs, seq_len, separator_id,
                                         template)]


def encode_pairs(tokenizer: Tokenizer, texts: list[str], pairs: list[str | None] | None,
                 seq_len: int, separator_id: int, template: Template | None = None
                 ) -> list[tuple[np.ndarray, int]]:
  """`encode_examples`, each example's ids with the index where its pair's part begins: the
  ids from it on are the second text's as the tokenizer types them (token type 1 for BERT),
  whatever special tokens the first text spells."""
  pairs = [None] * len(texts) if pairs is None else pairs
  # One id more than an example holds, so that `example_ids` knows what it truncates.
  firsts = tokenizer.encode_leading(texts, seq_len + 1)
  seconds = tokenizer.encode_leading([p or "" for p in pairs], seq_len + 1)
  return [laid_out(a, b if p is not None else None, seq_len, separator_id, template,
                   lambda t=t, p=p: first_is_longer(tokenizer, t, p, seq_len + 1))[::2]
          for a, b, t, p in zip(firsts, seconds, texts, pairs)]


def encode_words(tokenizer: Tokenizer, examples: list[list[str]], seq_len: int,
                 template: Template | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
  """Each example's words as ids, and where each word's first id lies in them: (ids, first),
  ids at most `seq_len` long, first int32 [len(words)], -1 for a word cut off or tokenized to
  nothing. Words are tokenized until the ids are full, never past (`_word_ids`).

  Each word is tokenized on its own after a space, so that a byte-level BPE (RoBERTa's) sees
  it as a word in running text, as transformers' `is_split_into_words` with
  `add_prefix_space=True` does; WordPiece and SentencePiece drop the space. The `template`'s
  start and end ids ([CLS] … [SEP]) go around the words, which are cut to fit between them.
  """
  template = template or Template()
  start, end = np.asarray(template.start, np.int32), np.asarray(template.end, np.int32)
  room = max(seq_len - len(start) - len(end), 0)
  out = []
  for words, own in zip(examples, _word_ids(tokenizer, examples, room)):
    lengths = np.asarray([len(p) for p in own], np.int64)
    offsets = np.cumsum(lengths) - lengths
    first = np.where((lengths > 0) & (offsets < room), offsets + len(start), -1)
    first = np.concatenate([first, np.full(len(words) - len(own), -1)])  # the words cut off
    body = np.concatenate([np.zeros(0, np.int32), *own])[:room].astype(np.int32)
    out.append((np.concatenate([start, body, end]), first.astype(np.int32)))
  return out


def _word_ids(tokenizer: Tokenizer, examples: list[list[str]], room: int) -> list[list]:
  """Each example's first words' ids, each word's first `room` + 1 at most
  (`Tokenizer.encode_leading`), up to the word that fills `room` ids: those after it could
  show none. The words are read a group of about room * CHARS_PER_ID characters at a time,
  all the examples' first groups in one call."""
  def group(words: list[str], at: int) -> list[str]:
    taken, chars = [], 0
    for word in words[at:]:
      if taken and chars + 1 + len(word) > max(room, 1) * CHARS_PER_ID:
        break
      taken.append(word)
      chars += 1 + len(word)
    return taken

  def add(own: list, ids: list[np.ndarray]) -> bool:
    """Appends `ids` to `own` up to the word that fills room; whether room is full."""
    held = sum(len(i) for i in own)
    for word in ids:
      if held >= room:
        return True
      own.append(word)
      held += len(word)
    return held >= room

  firsts = [group(words, 0) for words in examples]
  encoded = iter(tokenizer.encode_leading([" " + w for ws in firsts for w in ws], room + 1))
  out = []
  for words, taken in zip(examples, firsts):
    own: list = []
    full = add(own, [next(encoded) for _ in taken])
    while not full and len(own) < len(words):  # the first words made too few ids: read on
      more = group(words, len(own))
      full = add(own, tokenizer.encode_leading([" " + w for w in more], room + 1))
    out.append(own)
  return out
