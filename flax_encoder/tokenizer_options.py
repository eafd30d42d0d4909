"""What every builder of a tokenizer from a model directory's files reads: the directory's
tokenizer options (tokenizer_config.json, special_tokens_map.json), and the error it raises.
`flax_encoder.hf_tokenizer` builds the generic formats, a family its own
(`Family.tokenizers.slow`); both import this module, which imports neither.
"""

from __future__ import annotations

import os

from flax_encoder.modules_json import FolderFiles, read_json

SAVE_IT = ("save it with transformers: AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR) "
           "writes tokenizer.json")


class TokenizerError(ValueError):
  """A model directory whose tokenizer files this library cannot read."""


def read_options(file: str, kind: type = dict, files: FolderFiles | None = None
                 ) -> dict | list | None:
  """The JSON object (or list: `kind`) in `file` (through a load's `files`, where given); None
  where there is no such file."""
  return read_json(file, TokenizerError, kind, files=files)


def flag(options: dict, key: str, default: bool | None, file: str) -> bool | None:
  value = options.get(key, default)
  if value is not None and not isinstance(value, bool):
    raise TokenizerError(f"{file}: {key}={value!r}, expected true or false")
  return value


class TokenizerOptions:
  """A directory's tokenizer options: tokenizer_config.json's, with special_tokens_map.json's
  tokens over them (as transformers reads them), each read with the file it came from; the
  special tokens found in `vocab`, read from `vocab_file`."""

  def __init__(self, directory: str, classes: tuple[str, ...], files: str, vocab: dict,
               vocab_file: str):
    self.vocab, self.vocab_file = vocab, vocab_file
    self.config_file = os.path.join(directory, "tokenizer_config.json")
    self.tokens_file = os.path.join(directory, "special_tokens_map.json")
    self.config = read_options(self.config_file) or {}
    self.tokens = read_options(self.tokens_file) or {}
    name = self.config.get("tokenizer_class")
    if name is not None and (not isinstance(name, str)
                             or name.removesuffix("Fast") not in classes):
      raise TokenizerError(f"{self.config_file}: tokenizer_class={name!r}, but this library "
                           f"builds only {', '.join(classes)} from {files}; {SAVE_IT}")

  def flag(self, key: str, default: bool | None) -> bool | None:
    return flag(self.config, key, default, self.config_file)

  def special(self, key: str, default: str, required: bool = True, added: bool = False):
    """The special token `key` (cls_token …) as an AddedToken and its id; None where the
    vocabulary lacks a token that is not `required`, or, where it may be `added` after the
    vocabulary, the token and None."""
    from tokenizers import AddedToken
    file = self.tokens_file if key in self.tokens else self.config_file
    value = {**self.config, **self.tokens}.get(key, default)
    spec = value if isinstance(value, dict) else {"content": value}
    content = spec.get("content")
    if not isinstance(content, str):
      raise TokenizerError(f"{file}: {key}={value!r}, expected a token (a string)")
    if content not in self.vocab:
      if added:
        return AddedToken(content, normalized=False, special=True), None
      if not required:
        return None
      raise TokenizerError(f"{self.vocab_file}: no {content!r} (the {key}), expected the special "
                           f"tokens the model was trained with")
    flags = {name: flag(spec, name, False, f"{file}: {key}")
             for name in ("single_word", "lstrip", "rstrip")}
    return AddedToken(content, **flags, normalized=False, special=True), self.vocab[content]
