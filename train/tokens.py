"""Token ids: the special ids, the byte codec, and the tokenizers that turn text into ids.

The one place these facts live; `train.prepare` (offline), the jitted masking in
`train.masked_lm`, fine-tuning and the tools that encode a text (`draw_attention`, `predict`)
all import them from here.

Ids: 0 pad, 1 mask, 2 the separator between documents (and between the two texts of a pair),
3 unused, then each of the tokenizer's own ids plus FIRST_TOKEN_ID (so byte b is 4 + b).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from flax_encoder import tokenizer as library

PAD_ID, MASK_ID, SEPARATOR_ID = 0, 1, 2
FIRST_TOKEN_ID = 4  # tokenizer id i is stored as FIRST_TOKEN_ID + i; ids below are never targets
BYTE_VOCAB_SIZE = FIRST_TOKEN_ID + 256
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

  def load(self, offset: int = FIRST_TOKEN_ID) -> Tokenizer:
    return Tokenizer(self, offset)


class Tokenizer(library.Tokenizer):
  """Text -> ids: the tokenizer's own ids + `offset`, FIRST_TOKEN_ID in this project's
  numbering (0 for a model trained on the tokenizer's own ids, elsewhere); `spec` says which
  file it came from."""

  def __init__(self, spec: TokenizerSpec, offset: int = FIRST_TOKEN_ID):
    if spec.kind not in KINDS:
      raise ValueError(f"tokenizer kind must be one of {KINDS}, got {spec.kind!r}")
    model = None
    if spec.kind != "bytes":
      with open(spec.path, "rb") as f:
        model = f.read()
    super().__init__(spec.kind, model, offset)
    self.spec = spec

  def pieces(self, ids) -> list[str]:
    """A readable label for each id (a byte, a piece), for plots."""
    specials = {PAD_ID: "<pad>", MASK_ID: "<mask>", SEPARATOR_ID: "<sep>"}
    return [specials.get(i, "<?>") if i < self.offset else self.piece(i - self.offset)
            for i in np.asarray(ids).ravel().tolist()]


def spec_of_dataset(directory: str, meta: dict) -> TokenizerSpec:
  """The tokenizer a prepared dataset (its dataset.json `meta`) was encoded with."""
  recorded = meta["tokenizer"]
  path = os.path.join(directory, recorded["file"]) if recorded.get("file") else None
  return TokenizerSpec(recorded["kind"], path)
