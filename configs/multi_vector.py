r"""Fine-tuning a multi-vector (ColBERT) model (train.tasks.multi_vector), on pairs of texts.

  python -m train --config=configs/multi_vector.py --workdir runs/colbert \
      --config.data.train=pairs.jsonl --config.data.eval=held_out.jsonl \
      --config.init.hf=bert-base-uncased [--config.task.skiplist=True]

The lines are configs/embed.py's: {"anchor": the query, "positive": its document}, optionally
"negative" (a hard negative); both files are the user's. Each evaluation ranks every held-out
query against all held-out positives by MaxSim and reports MRR@10, nDCG@10, recall@1 and
recall@10 beside the MRR@10 of a random ranking. From config.init (a Hugging Face directory, a
sentence-transformers MultiVectorEncoder folder, a pretraining run, a PyTorch checkpoint) the
pretrained recipe applies (AdamW at 5e-5, warm-up over 6% of the steps), as in
configs/classify.py.
"""

import ml_collections
from ml_collections import config_dict

from configs import embed


def get_config() -> ml_collections.ConfigDict:
  config = embed.get_config()  # the encoder, config.init, the recipe, the pairs and their run

  config.task = ml_collections.ConfigDict()
  config.task.name = "multi_vector"
  # The width of each token's vector (the Dense projection's outputs). Unset: a
  # MultiVectorEncoder folder's (config.init.hf), else 128.
  config.task.dim = config_dict.placeholder(int)
  # Whether a document's punctuation (string.punctuation's tokens) is left out of MaxSim, as
  # ColBERT's skiplist does; queries score all their tokens. Unset: a MultiVectorEncoder
  # folder's, else False.
  config.task.skiplist = config_dict.placeholder(bool)
  # MaxSim scores times this are the logits of the cross-entropy. sentence-transformers'
  # MultiVectorMultipleNegativesRankingLoss: 1 (a temperature of 1, as PyLate), MaxSim being a
  # sum over the query's tokens rather than a cosine.
  config.task.scale = 1.0
  # configs/embed.py's loss: "mnrl", or a teacher's scores distilled into MaxSim ("margin_mse",
  # "kl": MultiVectorMarginMSELoss, MultiVectorDistillKLDivLoss; ColBERTv2's is kl)
  config.task.loss = "mnrl"
  config.task.temperature = 1.0  # kl's, of the student's and the teacher's softmax
  # GradCache over the token vectors, as configs/embed.py's (each text encoded twice forward).
  config.task.cached = False
  config.task.mini_batch = 32  # with cached: texts encoded at once; divides batch_size

  # Every held-out text's token vectors are kept for the ranking ([pairs, seq_len, dim] each
  # side), and each query is scored against every positive: fewer than configs/embed.py's.
  config.data.eval_pairs = 512
  return config
