r"""Fine-tuning: the encoder and a classification head, on labelled JSON lines.

  python -m train --config=configs/classify.py --workdir runs/cls               # from scratch
  python -m train --config=configs/classify.py --workdir runs/cls-pretrained \
      --config.init.run=runs/demo                 # from the default pretraining run
  python -m train --config=configs/classify.py --workdir runs/mine \
      --config.data.train=train.jsonl --config.data.eval=eval.jsonl \
      [--config.init.run=RUN | --config.init.torch_checkpoint=model.pt --config.init.n_heads=8
       | --config.init.hf=bert-dir]
  python -m train.predict --workdir runs/mine --input new.jsonl --out predictions.jsonl

By default it trains on the built-in task (which of 9 standard-library packages 120 bytes of
Python source come from: ships with Python, no download) with the default pretraining run's
model size. README, "Fine-tune", has the measured accuracies against the majority class, with
bytes and with the trained vocabulary.
"""

import ml_collections
from ml_collections import config_dict

from configs import default
from flax_encoder import EncoderConfig


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()

  # What the encoder is (EncoderConfig's architecture and parameters fields): unset, it comes
  # from config.init's encoder; from scratch, configs/default.py's. Given, it must agree with
  # the pretrained encoder. How it runs (dtype, attention_impl, remat) is this run's own.
  for role in ("architecture", "parameters"):
    for name in EncoderConfig.fields(role):
      if name in config.model and name != "vocab_size":
        config.model[name] = config_dict.placeholder(type(config.model[name]))
  config.model.dropout = 0.1  # also before the classifier

  config.task = ml_collections.ConfigDict()
  config.task.name = "classify"
  # "mean" over the real tokens; "first": the first token's; "pooler": a dense layer and tanh
  # on the first token (BERT's pooler, RoBERTa's head); "pre_classifier": the same with ReLU
  # (DistilBERT's); "first_gelu", "mean_gelu": a dense layer and GELU on the first token or the
  # mean (EuroBERT's); "first_head", "mean_head": the first token or the mean through
  # ModernBERT's prediction head (dense, activation, LayerNorm). Unset: the family's from
  # config.init.hf (ModernBERT's and EuroBERT's as its classifier_pooling says), "mean"
  # otherwise.
  config.task.pooling = config_dict.placeholder(str)
  # Pack several short examples into each row of seq_len ids (each encoded and pooled as if
  # alone; at most seq_len // 8 a row): less padding computed. config.train.batch_size then
  # counts rows, not examples, and tokens/s counts the examples' ids alone.
  config.task.packed = False

  config.data = ml_collections.ConfigDict()
  # JSON lines: {"text": ..., "label": ...}, optionally "text_pair"; labels strings or
  # integers. The built-in task holds out its own examples: set both or neither.
  config.data.train = "builtin:stdlib-packages"
  config.data.eval = "builtin:stdlib-packages"
  config.data.text_field = "text"
  config.data.pair_field = "text_pair"  # joined to the text with the separator id between
  config.data.label_field = "label"
  # "bytes"; a vocabulary trained on the training texts: "sentencepiece", "bpe", "wordpiece"
  # or "unigram" (config.data.vocab_size pieces); a SentencePiece .model or a tokenizer.json.
  # Unset: config.init.run's; from scratch, a trained SentencePiece vocabulary (on the built-in
  # task it beats bytes: README, "Fine-tune"); from a PyTorch checkpoint, bytes.
  config.data.tokenizer = config_dict.placeholder(str)
  config.data.vocab_size = 8000
  # The ids: the tokenizer's own plus id_offset, padding and the separator of a pair. This
  # project's numbering is 4, 0, 2; a PyTorch model trained on the tokenizer's own ids
  # (config.init.torch_checkpoint) wants 0 and its own pad and separator ids.
  config.data.id_offset = 4
  config.data.pad_id = 0
  config.data.separator_id = 2
  config.data.workers = 0

  config.init = ml_collections.ConfigDict()
  config.init.run = config_dict.placeholder(str)  # a pretraining run's workdir
  config.init.torch_checkpoint = config_dict.placeholder(str)  # .pt / .safetensors
  config.init.n_heads = config_dict.placeholder(int)  # the PyTorch encoder's heads
  config.init.prefix = "auto"  # where the encoder sits in the PyTorch state dict
  # The prefix of a torch.nn.Linear [classes, d_model] in the checkpoint to start the
  # classifier from (labels must then be the integers 0 … classes - 1 of its rows).
  config.init.torch_head = config_dict.placeholder(str)
  # A Hugging Face BERT, RoBERTa, DistilBERT or ModernBERT directory (config.json, weights,
  # tokenizer.json): its encoder, its tokenizer with its own ids, padding and special tokens
  # ([CLS] a [SEP] b [SEP], <s> a </s></s> b </s>; config.data's ids and tokenizer do not
  # apply), BERT's pooler and ModernBERT's prediction head.
  config.init.hf = config_dict.placeholder(str)

  # The usual fine-tuning recipe: AdamW, linear warm-up then decay to 0, no label smoothing.
  # Unset, these four are the recipe's for where the encoder starts (printed at the start):
  # from scratch AdamW at 1e-3 after 100 steps of warm-up; from config.init's pretrained
  # encoder, which 1e-3 would wreck, at 5e-5 after a warm-up over the first 6% of the steps
  # (BERT's and RoBERTa's). Either with weight decay 0.01. A value given here wins.
  for name in ("recipe", "learning_rate", "warmup_steps", "weight_decay"):
    config.optim[name] = config_dict.placeholder(type(config.optim[name]))
  config.optim.label_smoothing = 0.0
  # How long: num_steps, or epochs (passes over the training examples, rounded up to whole
  # steps); one of them, unset both: 800 steps. eval_every and checkpoint_every, unset: once
  # per epoch with epochs, else every 200 steps; both also at the last step.
  config.train.update(batch_size=32, seq_len=128, log_every=25)
  for name in ("num_steps", "eval_every", "checkpoint_every"):
    config.train[name] = config_dict.placeholder(int)
  return config
