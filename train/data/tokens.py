"""Token ids: the special ids, the byte codec, and the tokenizers that turn text into ids.

The one place these facts live; `train.prepare` (offline), the jitted masking in
`train.tasks.masked_lm`, fine-tuning and the tools that encode a text (`draw_attention`, `predict`)
all import them from here.

Ids: 0 pad, 1 mask, 2 the separator between documents (and between the two texts of a pair),
3 unused, then each of the tokenizer's own ids plus FIRST_TOKEN_ID (so byte b is 4 + b).
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from flax_encoder import tokenizer as library

PAD_ID, MASK_ID, SEPARATOR_ID = 0, 1, 2
FIRST_TOKEN_ID = 4  # tokenizer id i is stored as FIRST_TOKEN_ID + i; ids below are never targets
BYTE_VOCAB_SIZE = FIRST_TOKEN_ID + 256
# Above this fraction of a file's tokens being the tokenizer's unknown token, preparing it
# warns: the model cannot tell apart what they stand for (all of them: it refuses).
UNKNOWN_WARNING = 0.2
KINDS = library.KINDS


def encode_bytes(text: str) -> np.ndarray:
  """The UTF-8 bytes of `text` as ids (int32)."""
  return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32) + FIRST_TOKEN_ID


def decode_bytes(ids) -> str:
  """Ids of the byte tokenizer back to text; special ids are left out."""
  data = bytes(int(i) - FIRST_TOKEN_ID for i in np.asarray(ids).ravel() if i >= FIRST_TOKEN_ID)
  return data.decode("utf-8", errors="replace")


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
  """Which tokenizer: its kind and, for the two with a model, the model file."""

  kind: str  # one of KINDS
  path: str | None = None  # the .model (sentencepiece) or tokenizer.json (huggingface)

  def load(self, offset: int = FIRST_TOKEN_ID, model: bytes | None = None) -> Tokenizer:
    """The tokenizer; `model`: its file's bytes, already read."""
    return Tokenizer(self, offset, model)


class Tokenizer(library.Tokenizer):
  """Text -> ids: the tokenizer's own ids + `offset`, FIRST_TOKEN_ID in this project's
  numbering (0 for a model trained on the tokenizer's own ids, elsewhere); `spec` says which
  file it came from."""

  def __init__(self, spec: TokenizerSpec, offset: int = FIRST_TOKEN_ID,
               model: bytes | None = None):
    if spec.kind not in KINDS:
      raise ValueError(f"tokenizer kind must be one of {KINDS}, got {spec.kind!r}")
    if spec.kind != "bytes" and model is None:
      with open(spec.path, "rb") as f:
        model = f.read()
    super().__init__(spec.kind, model, offset)
    self.spec = spec

  def pieces(self, ids) -> list[str]:
    """A readable label for each id (a byte, a piece), for plots."""
    specials = {PAD_ID: "<pad>", MASK_ID: "<mask>", SEPARATOR_ID: "<sep>"}
    return [specials.get(i, "<?>") if i < self.offset else self.piece(i - self.offset)
            for i in np.asarray(ids).ravel().tolist()]


@dataclasses.dataclass(frozen=True)
class SpecialIds:
  """The ids a masked-LM run treats apart: padding, the mask, the separator that ends each
  document, and which ids are text (the only ones chosen for prediction): those from
  `first_token` on, but for `others`. This project's numbering is the default; a Hugging Face
  checkpoint's ids (`hf_special_ids`) start text at 0 and list [CLS], [UNK] … in `others`."""

  pad: int = PAD_ID
  mask: int = MASK_ID
  separator: int = SEPARATOR_ID
  first_token: int = FIRST_TOKEN_ID
  others: tuple[int, ...] = ()

  def is_text(self, ids):
    """Where `ids` (a numpy or jax array) are text; the same array type back."""
    text = ids >= self.first_token
    for other in (self.pad, self.mask, self.separator, *self.others):
      text = text & (ids != other)
    return text

  def to_meta(self) -> dict:
    return {"pad": self.pad, "mask": self.mask, "separator": self.separator,
            "others": list(self.others)}

  @classmethod
  def of_meta(cls, meta: dict) -> SpecialIds:
    """The special ids a prepared dataset's dataset.json `meta` records."""
    ids = meta.get("special_ids", {})
    return cls(int(ids.get("pad", PAD_ID)), int(ids.get("mask", MASK_ID)),
               int(ids.get("separator", SEPARATOR_ID)),
               int(meta.get("first_token_id", FIRST_TOKEN_ID)),
               tuple(int(i) for i in ids.get("others", ())))


PROJECT_IDS = SpecialIds()


def hf_tokenizer_file(directory: str, scratch: str, files=None) -> tuple[str, bytes]:
  """The tokenizer.json of the Hugging Face or sentence-transformers model `directory`, as
  `flax_encoder.hf_tokenizer.tokenizer_from_directory` reads it, and its bytes: the
  directory's own file where that is it (read once), else the one built from its vocabulary
  files (vocab.txt; vocab.json and merges.txt) or changed for its module or class
  (lower-casing), written into `scratch` (the same bytes each time, so a resumed run finds its
  tokenizer unchanged). Its JSON files are read through the run's `files` (a
  flax_encoder.modules_json.FolderFiles), where given. ValueError (one line, naming the
  directory or file) where it has none it can read."""
  from flax_encoder.hf_tokenizer import read_tokenizer
  tokenizer, source = read_tokenizer(directory, files=files)
  built = tokenizer.model
  if source is not None:
    return source, built
  os.makedirs(scratch, exist_ok=True)
  file = os.path.join(scratch, "tokenizer.json")
  if not (os.path.isfile(file) and _read(file) == built):
    with open(file + ".tmp", "wb") as f:
      f.write(built)
    os.replace(file + ".tmp", file)
  return file, built


def _model_directory(directory: str) -> str:
  """The folder of the model's own files (a sentence-transformers folder's Transformer)."""
  from flax_encoder.families import model_directory
  return model_directory(directory)


def _read(file: str) -> bytes:
  with open(file, "rb") as f:
    return f.read()


def hf_special_ids(directory: str, tokenizer_file: str) -> tuple[SpecialIds, library.Template]:
  """The special ids of the Hugging Face model directory `directory` (config.json's
  pad_token_id, tokenizer_config.json's mask token, every special token of its tokenizer,
  `tokenizer_file` as hf_tokenizer_file wrote it) and the template its tokenizer puts around a
  text; ValueError naming what is missing."""
  from tokenizers import Tokenizer as HFTokenizer
  file = tokenizer_file
  tokenizer = library.Tokenizer.from_file("huggingface", file)
  specials = {t.content: i for i, t in
              HFTokenizer.from_str(tokenizer.model.decode()).get_added_tokens_decoder().items()
              if t.special}
  named = {}
  for name in ("tokenizer_config.json", "special_tokens_map.json", "config.json"):
    for folder in dict.fromkeys((directory, _model_directory(directory))):
      path = os.path.join(folder, name)
      if os.path.isfile(path):
        named = {**_json_object(path), **named}

  def token(value):  # a token as the files name it: "[MASK]" or {"content": "[MASK]", ...}
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None

  mask = specials.get(token(named.get("mask_token")))
  pad = named.get("pad_token_id", specials.get(token(named.get("pad_token"))))
  if mask is None or pad is None:
    raise ValueError(f"{directory}: its tokenizer names no {'mask' if mask is None else 'pad'} "
                     f"token (tokenizer_config.json's mask_token, config.json's pad_token_id): "
                     f"not a masked-LM checkpoint's tokenizer")
  if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
    raise ValueError(f"{directory}: pad_token_id {pad!r}, expected a token id")
  template = tokenizer.template()
  if template is None or not template.end:
    raise ValueError(f"{file}: no post-processor that ends a text with a separator ([SEP], "
                     f"</s>)")
  others = tuple(sorted(set(specials.values()) - {mask, pad, template.end[-1]}))
  return SpecialIds(int(pad), int(mask), template.end[-1], 0, others), template


def _json_object(path: str) -> dict:
  """The JSON object the file `path` holds; ValueError naming it where it holds none."""
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except ValueError as e:  # invalid JSON or UTF-8
    raise ValueError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(value, dict):
    raise ValueError(f"{path}: a JSON {type(value).__name__}, expected an object")
  return value


def spec_of_dataset(directory: str, meta: dict) -> TokenizerSpec:
  """The tokenizer a prepared dataset (its dataset.json `meta`) was encoded with."""
  recorded = meta["tokenizer"]
  path = os.path.join(directory, recorded["file"]) if recorded.get("file") else None
  return TokenizerSpec(recorded["kind"], path)
