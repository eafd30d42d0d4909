"""The tokenizer of a Hugging Face model directory, as a `Tokenizer` of kind "huggingface".

  tokenizer = tokenizer_from_directory("bert-base-uncased")

A directory's tokenizer.json (a fast tokenizer's file) is read as transformers 5 reads it: as
it is, but where tokenizer_config.json names a class of OPTION_NORMALIZED_CLASSES, whose
normalizer that class builds from its options (do_lower_case …). Older checkpoints ship
the files of transformers' slow tokenizers instead: vocab.txt (BERT's WordPiece), vocab.json
and merges.txt (RoBERTa's byte-level BPE) or a family's own (`Family.tokenizers.slow`:
DeBERTa-v3's SentencePiece spm.model, families/deberta_v2.py), with their options and special
tokens in tokenizer_config.json and special_tokens_map.json. These are built into a
tokenizer.json with the `tokenizers` library, as transformers builds its tokenizer from them,
so that no transformers is needed to read them. Importing this module imports no JAX (the
families, which do, are asked only for a directory without the files above). A
sentence-transformers folder's tokenizer is read where sentence-transformers reads it, from its
Transformer module's folder (modules.json: the folder itself in newer ones, 0_Transformer in
older ones, whose top may hold another tokenizer.json), and may lower-case the texts before
they are tokenized (the module's sentence_bert_config.json). Each file is checked before
`tokenizers` sees it: a regular file (a FIFO would block the reader), JSON Python reads, a
vocab.json whose ids are those of its tokens.
"""

from __future__ import annotations

import json
import os

from flax_encoder.modules_json import (TRANSFORMER_CONFIGS, FolderFiles, ModulesError,
                                       not_a_file, transformer_folder)
from flax_encoder.tokenizer import Tokenizer, is_panic
from flax_encoder.tokenizer_options import SAVE_IT, TokenizerError, TokenizerOptions
from flax_encoder.tokenizer_options import flag as _flag
from flax_encoder.tokenizer_options import read_options as _read_json

LOOKED_FOR = "tokenizer.json, vocab.txt, vocab.json and merges.txt"  # then the families'

# tokenizer_config.json's tokenizer_class (less "Fast") whose tokenizer is built from vocab.txt
# as BERT's: "[CLS] a [SEP] b [SEP]", b of token type 1
WORDPIECE_CLASSES = ("BertTokenizer", "DistilBertTokenizer", "ElectraTokenizer")
# ... and from vocab.json and merges.txt as RoBERTa's: "<s> a </s></s> b </s>"
BPE_CLASSES = ("RobertaTokenizer", "LongformerTokenizer", "BartTokenizer")
# ... whose normalizer and pre-tokenizer transformers 5 builds from tokenizer_config.json's
# options (do_lower_case, strip_accents, tokenize_chinese_chars), over tokenizer.json's own
OPTION_NORMALIZED_CLASSES = (*WORDPIECE_CLASSES, "MPNetTokenizer")


def tokenizer_from_directory(path: str | os.PathLike, offset: int = 0,
                             files: FolderFiles | None = None) -> Tokenizer:
  """The tokenizer of the model directory `path` (ids + `offset`): its tokenizer.json (as its
  tokenizer_class reads it), else one built from its vocab.txt (WordPiece), else from its vocab.json
  and merges.txt (byte-level BPE), else from a family's own files (`Family.tokenizers.slow`:
  DeBERTa's spm.model); in a sentence-transformers folder, from its Transformer module's
  folder (where sentence-transformers reads it), with a Lowercase normalizer first where the
  module lower-cases texts. Its JSON files are read through a load's `files`, where given.
  Raises TokenizerError naming the directory or file and what it expected."""
  return read_tokenizer(path, offset, files)[0]


def read_tokenizer(path: str | os.PathLike, offset: int = 0, files: FolderFiles | None = None
                   ) -> tuple[Tokenizer, str | None]:
  """`tokenizer_from_directory`, and the tokenizer.json whose bytes it holds as they are (None
  where it built them, or changed the file's): a caller that keeps the file needs not read it
  again."""
  path = os.path.normpath(os.fspath(path))
  if not os.path.isdir(path):
    raise TokenizerError(f"{path}: not a directory (expected a model directory with its "
                         f"tokenizer files: {_looked_for()})")
  # sentence-transformers reads the tokenizer (AutoTokenizer) from the Transformer module's
  # folder only: an older folder's top may hold another one, which it never reads
  directory = _transformer_module(path, files) or path
  source = None
  if _has(directory, "tokenizer.json"):
    source = os.path.join(directory, "tokenizer.json")
    read = _read_tokenizer_json(source)
    built = _as_its_class_reads(read, directory, files)
    source = source if built is read else None
  elif _has(directory, "vocab.txt"):
    built = _wordpiece(directory)
  elif _has(directory, "vocab.json") and _has(directory, "merges.txt"):
    built = _byte_level_bpe(directory)
  else:
    slow = _slow_tokenizer(directory)
    if slow is None:
      raise TokenizerError(f"{path}: no tokenizer files (looked for {_looked_for()} in "
                           f"{directory}); {SAVE_IT}")
    built = slow.build(directory)
  if _lower_cases(directory, files):
    built, source = _lowercased(built, directory), None
  return Tokenizer("huggingface", built, offset), source


def _slow_tokenizer(directory: str):
  """The first family's tokenizer built from files of its own (families.SLOW_TOKENIZERS) whose
  files `directory` holds; None where none's are there."""
  from flax_encoder import families  # imports JAX: only where no generic file is there
  return next((slow for slow in families.SLOW_TOKENIZERS
               if all(_has(directory, name) for name in slow.files)), None)


def _looked_for() -> str:
  """The tokenizer files a directory is searched for, in order, as an error lists them."""
  from flax_encoder import families
  return ", or ".join([LOOKED_FOR] + [" and ".join(slow.files)
                                      for slow in families.SLOW_TOKENIZERS])


def _has(directory: str, name: str) -> bool:
  """Whether `directory` holds the file `name`; TokenizerError where that is something else
  (a directory, a FIFO, which would block the reader), rather than passing over it."""
  file = os.path.join(directory, name)
  what = not_a_file(file)
  if what is not None:
    raise TokenizerError(f"{file}: {what}, expected a file")
  return os.path.isfile(file)


def _transformer_module(path: str, files: FolderFiles | None) -> str | None:
  """The folder of a sentence-transformers folder's Transformer module (modules.json); None
  where `path` is no sentence-transformers folder."""
  try:
    folder = transformer_folder(path, files)
  except ModulesError as e:
    raise TokenizerError(str(e)) from None
  return None if folder is None else os.path.normpath(folder)


def _lower_cases(module: str, files: FolderFiles | None) -> bool:
  """Whether a sentence-transformers Transformer module lower-cases texts before its
  tokenizer reads them (do_lower_case in its sentence_*_config.json, the first there is)."""
  for name in TRANSFORMER_CONFIGS:
    file = os.path.join(module, name)
    config = _read_json(file, files=files)
    if config is not None:
      return _flag(config, "do_lower_case", False, file)
  return False


def _lowercased(built: bytes, directory: str) -> bytes:
  """The tokenizer.json `built` that lower-cases texts before anything else reads them."""
  from tokenizers import Tokenizer as HFTokenizer, normalizers
  tokenizer = _built(lambda: HFTokenizer.from_str(built.decode("utf-8")), directory)
  steps = [normalizers.Lowercase()] + ([tokenizer.normalizer] if tokenizer.normalizer else [])
  tokenizer.normalizer = normalizers.Sequence(steps)
  return tokenizer.to_str().encode("utf-8")


def _as_its_class_reads(built: bytes, directory: str, files: FolderFiles | None) -> bytes:
  """The tokenizer.json `built` as transformers 5 reads it for the directory's tokenizer_class:
  one of OPTION_NORMALIZED_CLASSES takes tokenizer.json's vocabulary and post-processor, but
  normalizes and pre-tokenizes as its options say (a cased tokenizer.json saved by
  `BertTokenizerFast(tokenizer_object=…)` lower-cases, as its do_lower_case defaults to true);
  any other class, tokenizer.json as it is."""
  file = os.path.join(directory, "tokenizer_config.json")
  config = _read_json(file, files=files) or {}
  name = config.get("tokenizer_class")
  if not isinstance(name, str) or name.removesuffix("Fast") not in OPTION_NORMALIZED_CLASSES:
    return built
  from tokenizers import Tokenizer as HFTokenizer, normalizers, pre_tokenizers
  tokenizer = _built(lambda: HFTokenizer.from_str(built.decode("utf-8")), directory)
  flag = lambda key, default: _flag(config, key, default, file)
  tokenizer.normalizer = normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=flag("tokenize_chinese_chars", True),
      strip_accents=flag("strip_accents", None), lowercase=flag("do_lower_case", True))
  tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  rebuilt = json.loads(tokenizer.to_str())
  given = json.loads(built)
  if all(given.get(k) == rebuilt[k] for k in ("normalizer", "pre_tokenizer")):
    return built  # as it was: its bytes, which fingerprints hash, unchanged
  return json.dumps(rebuilt).encode("utf-8")


def _read_tokenizer_json(file: str) -> bytes:
  """The bytes of the tokenizer.json `file`, checked to be one `tokenizers` reads."""
  with open(file, "rb") as f:
    model = f.read()
  _built(lambda: Tokenizer("huggingface", model), file)
  return model


def _built(build, file: str):
  """build(), a `tokenizers` object made from `file`; TokenizerError naming it where
  `tokenizers` raises or panics."""
  try:
    return build()
  except BaseException as e:  # noqa: BLE001 - tokenizers raises bare Exceptions, or panics
    if not (isinstance(e, Exception) or is_panic(e)):
      raise  # KeyboardInterrupt, SystemExit
    said = (str(e).splitlines() or [""])[0]
    raise TokenizerError(f"{file}: not a tokenizer the `tokenizers` library reads ({said})"
                         ) from None


def _read_vocab_txt(file: str) -> dict[str, int]:
  """vocab.txt, one token a line, its id its line's number (transformers' load_vocab)."""
  try:
    with open(file, encoding="utf-8") as f:
      return {token.rstrip("\n"): i for i, token in enumerate(f.readlines())}
  except (OSError, UnicodeDecodeError) as e:
    raise TokenizerError(f"{file}: not a readable vocabulary ({e})") from None


def _wordpiece(directory: str) -> bytes:
  """BERT's tokenizer from vocab.txt, as transformers' BertTokenizer builds it."""
  from tokenizers import Tokenizer as HFTokenizer, decoders, models, normalizers
  from tokenizers import pre_tokenizers, processors
  vocab_file = os.path.join(directory, "vocab.txt")
  vocab = _read_vocab_txt(vocab_file)
  options = TokenizerOptions(directory, WORDPIECE_CLASSES, "vocab.txt", vocab, vocab_file)
  (unk, _), cls, sep = (options.special("unk_token", "[UNK]"),
                        options.special("cls_token", "[CLS]"),
                        options.special("sep_token", "[SEP]"))
  others = [options.special("pad_token", "[PAD]", required=False),
            options.special("mask_token", "[MASK]", required=False)]
  tokenizer = HFTokenizer(models.WordPiece(vocab, unk_token=unk.content))
  tokenizer.normalizer = normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=options.flag("tokenize_chinese_chars", True),
      strip_accents=options.flag("strip_accents", None),
      lowercase=options.flag("do_lower_case", True))
  tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tokenizer.decoder = decoders.WordPiece(prefix="##")
  c, s = cls[0].content, sep[0].content
  tokenizer.post_processor = processors.TemplateProcessing(
      single=f"{c}:0 $A:0 {s}:0", pair=f"{c}:0 $A:0 {s}:0 $B:1 {s}:1",
      special_tokens=[(c, cls[1]), (s, sep[1])])
  # so that a special token in a text is read as it (transformers does the same)
  tokenizer.add_special_tokens([unk, cls[0], sep[0]] + [t for t, _ in filter(None, others)])
  return tokenizer.to_str().encode("utf-8")


def _read_bpe(directory: str) -> tuple[dict, list, str]:
  """vocab.json and merges.txt, checked to be a BPE's: each id an integer of [0, tokens), no
  two alike (`tokenizers` sizes its tables by the largest: an id of 10**12 took minutes and
  gigabytes), each merge's parts and result in the vocabulary (`tokenizers` fails on a result
  outside it with a Rust panic)."""
  from tokenizers import models
  vocab_file, merges_file = (os.path.join(directory, n) for n in ("vocab.json", "merges.txt"))
  _check_ids(_read_json(vocab_file), vocab_file)
  try:
    vocab, merges = models.BPE.read_file(vocab_file, merges_file)
  except Exception as e:  # noqa: BLE001 - tokenizers raises bare Exceptions
    raise TokenizerError(f"{directory}: vocab.json and merges.txt are not a byte-level BPE's "
                         f"({(str(e).splitlines() or [''])[0]})") from None
  for a, b in merges:
    if not {a, b, a + b} <= vocab.keys():
      raise TokenizerError(f"{merges_file}: merges {a!r} and {b!r}, but vocab.json lacks "
                           f"{[t for t in (a, b, a + b) if t not in vocab]}")
  return vocab, merges, vocab_file


def _check_ids(vocab: dict, file: str) -> None:
  """vocab.json's ids: integers, each of [0, len(vocab)) and of one token."""
  seen: dict[int, str] = {}
  for token, i in vocab.items():
    if isinstance(i, bool) or not isinstance(i, int):
      kind = {str: "a string", float: "a number", bool: "a boolean", list: "a list",
              dict: "an object"}.get(type(i), "null")
      raise TokenizerError(f"{file}: id of {token!r} is {i!r} ({kind}), expected an integer")
    if not 0 <= i < len(vocab):
      raise TokenizerError(f"{file}: id of {token!r} is {i}, expected an id in "
                           f"[0, {len(vocab)}) (the file holds {len(vocab)} tokens)")
    if i in seen:
      raise TokenizerError(f"{file}: {seen[i]!r} and {token!r} both have id {i}, expected an "
                           f"id per token")
    seen[i] = token


def _byte_level_bpe(directory: str) -> bytes:
  """RoBERTa's tokenizer from vocab.json and merges.txt, as transformers' RobertaTokenizer
  builds it (no unknown token: every byte is in the vocabulary)."""
  from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, processors
  vocab, merges, vocab_file = _read_bpe(directory)
  options = TokenizerOptions(directory, BPE_CLASSES, "vocab.json and merges.txt", vocab,
                             vocab_file)
  cls, sep = options.special("cls_token", "<s>"), options.special("sep_token", "</s>")
  others = [options.special(key, default, required=False) for key, default in [
      ("bos_token", "<s>"), ("eos_token", "</s>"), ("unk_token", "<unk>"),
      ("pad_token", "<pad>"), ("mask_token", "<mask>")]]
  add_prefix_space = options.flag("add_prefix_space", False)
  tokenizer = HFTokenizer(models.BPE(vocab, merges, continuing_subword_prefix="",
                                     end_of_word_suffix="", fuse_unk=False))
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
  tokenizer.decoder = decoders.ByteLevel()
  tokenizer.post_processor = processors.RobertaProcessing(
      (sep[0].content, sep[1]), (cls[0].content, cls[1]),
      trim_offsets=options.flag("trim_offsets", True), add_prefix_space=add_prefix_space)
  tokenizer.add_special_tokens([cls[0], sep[0]] + [t for t, _ in filter(None, others)])
  return tokenizer.to_str().encode("utf-8")
