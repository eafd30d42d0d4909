"""Tiny Hugging Face model directories for the tests, built here with random weights and a
tokenizer trained on a few texts (nothing is downloaded): config.json, model.safetensors,
tokenizer.json and tokenizer_config.json, as `save_pretrained` writes them."""

import torch
import transformers
from tokenizers import (Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                        trainers)

from benchmarks.hf_walkthrough import wordpiece

TEXTS = ["0 1 2 3 4 5 6 7 8 9 0123 4567 89", "a b c d e f g h i j abcd efgh ij",
         "+ - * / = < > ! ? % +-*/ =<>!", "the quick brown fox jumps over the lazy dog"] * 4


def _wordpiece() -> tuple[Tokenizer, dict]:
  return wordpiece(TEXTS, 120)


def _byte_bpe() -> tuple[Tokenizer, dict]:
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
  tok.train_from_iterator(TEXTS, trainers.BpeTrainer(
      vocab_size=300, special_tokens=specials,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
  tok.decoder = decoders.ByteLevel()
  return tok, dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                   cls_token="<s>", sep_token="</s>", mask_token="<mask>")


def _mpnet_wordpiece() -> tuple[Tokenizer, dict]:
  """A WordPiece tokenizer as all-mpnet-base-v2's: <s> 0, <pad> 1 (whence MPNet's positions
  count), </s> 2; "<s> a </s></s> b </s>"; lower-cased."""
  tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
  tok.normalizer = normalizers.BertNormalizer(lowercase=True)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
  tok.train_from_iterator(TEXTS, trainers.WordPieceTrainer(vocab_size=120,
                                                           special_tokens=specials))
  tok.post_processor = processors.TemplateProcessing(
      single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
      special_tokens=[("<s>", 0), ("</s>", 2)])
  tok.decoder = decoders.WordPiece()
  return tok, dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                   cls_token="<s>", sep_token="</s>", mask_token="<mask>")


def _tokenizer(family: str) -> tuple[Tokenizer, dict]:
  return {"roberta": _byte_bpe, "jina_embeddings_v3": _byte_bpe,
          "mpnet": _mpnet_wordpiece}.get(family, _wordpiece)()


def write(path, family: str = "bert", head: str = "pretraining", seed: int = 0,
          **sizes) -> str:
  """A tiny random `family` ('bert', 'roberta', 'distilbert', 'modernbert', 'albert', 'mpnet',
  'nomic_bert', 'gte', 'jina_embeddings_v3', 'eurobert', 'deberta-v2') model with `head`
  ('pretraining': as
  the published checkpoints, BERT's with its pooler and masked-LM head, the others' their masked
  LM; 'masked_lm', 'sequence_classification' or 'base') and its tokenizer, saved into `path`;
  returns it."""
  tok, special = _tokenizer(family)
  vocab = tok.get_vocab_size()
  torch.manual_seed(seed)
  if family == "distilbert":
    config = transformers.DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4,
                                           hidden_dim=37, max_position_embeddings=64, **sizes)
  elif family == "modernbert":  # the WordPiece tokenizer's ids: [PAD] 0, [CLS] 2, [SEP] 3
    config = transformers.ModernBertConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
        num_attention_heads=4, max_position_embeddings=128, local_attention=16,
        global_attn_every_n_layers=3, pad_token_id=0, bos_token_id=2, eos_token_id=3,
        cls_token_id=2, sep_token_id=3, **sizes)
  elif family in ("nomic_bert", "gte"):  # the WordPiece tokenizer's ids: [PAD] 0
    kind = {"nomic_bert": transformers.NomicBertConfig, "gte": transformers.GteConfig}[family]
    config = kind(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=40, max_position_embeddings=128, type_vocab_size=2,
                  pad_token_id=0, **{**dict(hidden_dropout_prob=0.1,
                                            attention_probs_dropout_prob=0.1), **sizes})
  elif family == "jina_embeddings_v3":  # the byte-level BPE tokenizer's ids, as RoBERTa's
    config = transformers.JinaEmbeddingsV3Config(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=128, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, **sizes)
  elif family == "eurobert":  # the WordPiece tokenizer's ids: [PAD] 0, [CLS] 2, [SEP] 3
    config = transformers.EuroBertConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=40, max_position_embeddings=128,
        pad_token_id=0, bos_token_id=2, eos_token_id=3, mask_token_id=4,
        **{"classifier_pooling": "mean", **sizes})
  elif family == "deberta-v2":  # deberta-v3's settings at tiny sizes
    config = transformers.DebertaV2Config(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=128, relative_attention=True,
        pos_att_type=["p2c", "c2p"], position_buckets=16, max_relative_positions=128,
        share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
        type_vocab_size=0, layer_norm_eps=1e-7, pad_token_id=0, **sizes)
  elif family == "albert":  # the WordPiece tokenizer: ALBERT's own is SentencePiece's
    config = transformers.AlbertConfig(
        vocab_size=vocab, embedding_size=16, hidden_size=32, num_hidden_layers=3,
        num_attention_heads=4, intermediate_size=37, max_position_embeddings=66, **sizes)
  else:
    common = {**dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=37, max_position_embeddings=66),
              **sizes}
    if family == "roberta":
      config = transformers.RobertaConfig(pad_token_id=1, **common)
    elif family == "mpnet":  # its default special ids, <s> 0, <pad> 1, </s> 2, its tokenizer's
      config = transformers.MPNetConfig(**common)
    else:
      config = transformers.BertConfig(**common)
  if family in ("modernbert", "nomic_bert", "gte", "jina_embeddings_v3", "eurobert",
                "deberta-v2") and head == "pretraining":
    head = "masked_lm"  # their published checkpoints are *ForMaskedLM (or the bare encoder)
  auto = {"pretraining": transformers.AutoModelForPreTraining,
          "masked_lm": transformers.AutoModelForMaskedLM,
          "sequence_classification": transformers.AutoModelForSequenceClassification,
          "base": transformers.AutoModel}[head]
  model = auto.from_config(config)
  if family in ("mpnet", "nomic_bert", "gte", "jina_embeddings_v3", "eurobert", "deberta-v2"):
    # transformers starts the relative position bias near 0 and the LayerNorms at 1 and 0,
    # where a mistake in reading them would hardly show.
    with torch.no_grad():
      for param in model.parameters():
        param.add_(0.1 * torch.randn_like(param))
  model.save_pretrained(path)
  transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **special).save_pretrained(path)
  return str(path)


PAIR_CLASSES = {"digits": "0123456789", "letters": "abcdefghij", "symbols": "+-*/=<>!?%"}


def labelled_pairs(directory, train: int, eval_: int, words: tuple[int, int]) -> tuple[str, str]:
  """(train.jsonl, eval.jsonl) in `directory` of `train` and `eval_` text pairs whose label
  says what the pair's second text is made of (PAIR_CLASSES); each text `words` (low, high)
  words of 1 to 3 characters, drawn with seed 0."""
  import json

  import numpy as np
  rng = np.random.default_rng(0)

  def text(chars):
    return " ".join("".join(rng.choice(list(chars), rng.integers(1, 4)))
                    for _ in range(rng.integers(*words)))

  def write(name, n):
    rows = []
    for i in range(n):
      label = list(PAIR_CLASSES)[i % 3]
      rows.append({"text": text("abcdefghij0123456789"), "text_pair": text(PAIR_CLASSES[label]),
                   "label": label})
    path = directory / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)

  return write("train.jsonl", train), write("eval.jsonl", eval_)


def assert_packed_rows_as_alone(model, config, variables, first_id: int, lengths=(40, 30),
                                padding: int = 10, atol: float = 1e-5) -> None:
  """One row packing texts of `lengths` random ids (from `first_id` up) then `padding` pads:
  each text's encoding by the Flax `config`, `variables` equals transformers' `model` (a base
  model) on it alone."""
  import numpy as np

  from flax_encoder import Encoder, segment_positions
  rng = np.random.default_rng(1)
  texts = [rng.integers(first_id, config.vocab_size, n) for n in lengths]
  row = np.full((1, sum(lengths) + padding), config.pad_id, np.int64)
  row[0, :sum(lengths)] = np.concatenate(texts)
  segments = np.array([[k + 1 for k, n in enumerate(lengths) for _ in range(n)] + [0] * padding])
  packed = np.asarray(Encoder(config).apply(variables, row, segment_ids=segments,
                                            positions=np.asarray(segment_positions(segments))))
  start = 0
  for ids in texts:
    with torch.no_grad():
      alone = model(input_ids=torch.tensor(ids[None]))[0].numpy()[0]
    np.testing.assert_allclose(packed[0, start:start + len(ids)], alone, rtol=0, atol=atol)
    start += len(ids)


def parity_report_stages(directory, capsys, starts: tuple[str, ...]) -> list[str]:
  """The stages `python -m flax_encoder.pytorch.parity --hf directory` compares (its lines
  that start with one of `starts`), the same in float32 and float64, where both pass."""
  from flax_encoder.pytorch.parity import main
  seen = []
  for flags, bound in (([], "1e-05 + 1e-05"), (["--float64"], "1e-10 + 1e-12")):
    assert main(["--hf", str(directory), *flags]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out
    # the headline states the bound it applies, not "<= 1e-5"
    assert f"within {bound} * max|transformers value|" in out.splitlines()[0]
    seen.append([line.split()[0] for line in out.splitlines() if line.startswith(starts)])
  assert seen[0] == seen[1]
  return seen[0]
