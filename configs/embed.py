r"""Contrastive fine-tuning of sentence embeddings (train.tasks.contrastive), on pairs of texts.

  python -m train --config=configs/embed.py --workdir runs/embed \
      --config.data.train=pairs.jsonl --config.data.eval=held_out.jsonl \
      --config.init.hf=all-MiniLM-L6-v2 [--config.task.cached=True --config.train.batch_size=512]

Each line is {"anchor": ..., "positive": ...}, optionally "negative" (a hard negative); there is
no built-in task, so both files are the user's. Each evaluation ranks every held-out anchor
against all held-out positives and reports MRR@10, nDCG@10, recall@1 and recall@10 beside the
MRR@10 of a random ranking. From config.init (a Hugging Face or sentence-transformers
directory, a pretraining run, a PyTorch checkpoint) the pretrained recipe applies (AdamW at
5e-5, warm-up over 6% of the steps), as in configs/classify.py.
"""

import ml_collections
from ml_collections import config_dict

from configs import classify


def get_config() -> ml_collections.ConfigDict:
  config = classify.get_config()  # the encoder, config.init, the recipe and the run's length
  del config.init["torch_head"]  # a classifier's Linear: there is none here

  config.task = ml_collections.ConfigDict()
  config.task.name = "contrastive"
  # over the real tokens ([CLS] and [SEP] too); "cls": the first. A sentence-transformers
  # folder as config.init.hf must be fine-tuned with its own (checked).
  config.task.pooling = "mean"
  # Whether the model's embeddings are unit vectors (sentence-transformers' Normalize module,
  # written by an export): the loss and the evaluation compare cosines either way.
  config.task.normalize = True
  # Cosine similarities times this are the logits of the cross-entropy (sentence-transformers'
  # MultipleNegativesRankingLoss: 20, a temperature of 0.05).
  config.task.scale = 20.0
  # Also rank each positive among the batch's anchors, the two losses averaged.
  config.task.symmetric = False
  # Matryoshka: the loss summed over these prefixes of the embedding, each normalised again
  # ("768,512,256,128,64": list the full size to train it too); "" = the whole embedding.
  config.task.matryoshka_dims = ""
  # The loss: "mnrl", MultipleNegativesRankingLoss (the batch's other positives and each line's
  # negative are an anchor's negatives); or a teacher's scores distilled, "margin_mse"
  # (MarginMSELoss) or "kl" (DistillKLDivLoss), each line's negative and the teacher's scores
  # (data.scores_field) required: `python -m train.mine --scorer RERANKER --num-negatives 1`.
  config.task.loss = "mnrl"
  config.task.temperature = 1.0  # kl's, of the student's and the teacher's softmax
  # GradCache: the whole batch's loss (every other pair a negative) in the memory of
  # mini_batch texts at a time, for about a third more compute (each text encoded twice
  # forward). Without dropout the gradient is the uncached one.
  config.task.cached = False
  config.task.mini_batch = 32  # with cached: texts encoded at once; divides batch_size

  config.data = ml_collections.ConfigDict()
  # JSON lines (or Parquet rows) of pairs; both required.
  config.data.train = config_dict.placeholder(str)
  config.data.eval = config_dict.placeholder(str)
  config.data.anchor_field = "anchor"
  config.data.positive_field = "positive"
  config.data.negative_field = "negative"  # optional on each line: a column more for its anchor
  # distillation: [the positive's, the negative's] teacher scores; or their difference under
  # label_field (margin_mse)
  config.data.scores_field = "scores"
  config.data.label_field = "label"
  # The held-out pairs each evaluation ranks (its first ones): every anchor against every
  # positive, so the cost grows with its square.
  config.data.eval_pairs = 1024
  # The tokenizer and ids, as configs/classify.py's: a config.init.hf directory brings its own.
  config.data.tokenizer = config_dict.placeholder(str)
  config.data.vocab_size = 8000
  config.data.id_offset = 4
  config.data.pad_id = 0
  config.data.workers = 0

  config.train.eval_at_start = True  # the starting model's figures, to compare with
  # In-batch negatives get harder with the batch: larger than classify's 32.
  config.train.batch_size = 64
  # Unset: the max_seq_length of config.init.hf (sentence_bert_config.json, else its
  # tokenizer's model_max_length), at most 512; 128 from anything else. Texts are packed
  # several to a row of seq_len ids, so a longer row costs little where texts are short.
  config.train.seq_len = config_dict.placeholder(int)
  # Left unset with num_steps, a run from a pretrained start trains one epoch (800 steps from
  # scratch): fine-tuning a published model for long overfits the pairs.
  return config
