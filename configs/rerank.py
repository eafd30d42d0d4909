r"""Fine-tuning a reranker (train.tasks.rerank): a query and a document in, a relevance score out.

  python -m train --config=configs/rerank.py --workdir runs/rerank \
      --config.data.train=train.jsonl --config.data.eval=eval.jsonl \
      --config.init.hf=RERANKER_OR_ENCODER_DIR [--config.task.loss=bce]
  python -m train.predict --workdir runs/rerank --input pairs.jsonl --out scores.jsonl
  python -m train.export --workdir runs/rerank --layout hf --out my-reranker/  # CrossEncoder

Training lines: {"query": ..., "positive": ..., "negative": [...]} (negatives optional);
held-out lines: {"query": ..., "positive": ... or [...], "documents": [...]} (the first stage's
candidates, in its order), or with "negative" in place of "documents". There is no built-in
task, so both files are the user's. Each evaluation reports the reranked MRR@10 and nDCG@10
beside the first stage's. From config.init (a Hugging Face *ForSequenceClassification with one
label, such as a sentence-transformers CrossEncoder folder, or any encoder) the pretrained
recipe applies, as in configs/classify.py.
"""

import ml_collections
from ml_collections import config_dict

from configs import classify


def get_config() -> ml_collections.ConfigDict:
  config = classify.get_config()  # the encoder, config.init, the recipe and the run's length
  del config.init["torch_head"]  # a classifier's Linear: the score's is read from config.init.hf

  config.task = ml_collections.ConfigDict()
  config.task.name = "rerank"
  # "listwise": the positive's cross-entropy among its group's scores; "bce": each pair's
  # binary cross-entropy against 1 (the positive) or 0 (a negative), averaged over the group;
  # "margin_mse": a teacher's scores distilled (sentence-transformers' CrossEncoder
  # MarginMSELoss: the positive's logit less each of the line's negatives', against the
  # teacher's margin), each line's "scores" required (python -m train.mine --scorer).
  config.task.loss = "listwise"
  # Negatives a query is trained against: its line's hard negatives first, then positives of
  # other lines drawn at random when the data is prepared. Each costs a pair's compute.
  config.task.negatives = 7
  # Unset: the pooling of config.init.hf's classifier (BERT's pooler, RoBERTa's head …); the
  # mean from scratch.
  config.task.pooling = config_dict.placeholder(str)

  config.data = ml_collections.ConfigDict()
  config.data.train = config_dict.placeholder(str)
  config.data.eval = config_dict.placeholder(str)
  config.data.query_field = "query"
  config.data.positive_field = "positive"  # a text, or (held out) a list of them
  config.data.negative_field = "negative"  # a text or a list; optional
  config.data.documents_field = "documents"  # held out: the first stage's candidates, in order
  # margin_mse: the teacher's scores, of the positive then each negative
  config.data.scores_field = "scores"
  config.data.document_field = "document"  # train.predict's lines: {"query", "document"}
  config.data.label_field = "label"  # train.predict's lines: 1 relevant, 0 not (optional)
  # Candidates a held-out query reranks: its first stage's first ones. Each costs a pair.
  config.data.eval_candidates = 20
  # The tokenizer and ids, as configs/classify.py's: a config.init.hf directory brings its own.
  config.data.tokenizer = config_dict.placeholder(str)
  config.data.vocab_size = 8000
  config.data.id_offset = 4
  config.data.pad_id = 0
  config.data.separator_id = 2  # between a query and its document, without a Hugging Face start
  config.data.workers = 0

  config.train.eval_at_start = True  # the starting model's figures, to compare with
  config.train.batch_size = 16  # queries a step, each with its group of documents
  config.train.seq_len = 128  # ids of a (query, document) pair
  # Left unset with num_steps, a run from a pretrained start trains one epoch (800 steps from
  # scratch), as configs/embed.py's: a published model trained long overfits the pairs.
  return config
