r"""Contrastive fine-tuning of sparse (SPLADE) embeddings (train.tasks.sparse), on pairs of texts.

  python -m train --config=configs/sparse.py --workdir runs/splade \
      --config.data.train=pairs.jsonl --config.data.eval=held_out.jsonl \
      --config.init.hf=SPLADE_OR_MLM_DIR   # a SparseEncoder folder, or a *ForMaskedLM directory
  python -m train.export --workdir runs/splade --layout sentence-transformers --out splade/

The pairs, the held-out ranking, the defaults from a pretrained start and GradCache are
configs/embed.py's; the vectors are the masked LM's, SPLADE-pooled, compared by dot product,
and the loss adds the FLOPS regulariser that keeps them sparse. Each evaluation reports the
vectors' active dimensions beside MRR@10.
"""

import ml_collections
from ml_collections import config_dict

from configs import embed


def get_config() -> ml_collections.ConfigDict:
  config = embed.get_config()
  for name in ("normalize", "symmetric", "matryoshka_dims"):  # a dense embedding's
    del config.task[name]
  config.task.name = "sparse"
  # Unset: config.init.hf's SpladePooling (a SparseEncoder folder), else "max" and "relu":
  # max or sum over a text's ids of log(1 + relu(logit)) ("log1p_relu": log1p once more).
  config.task.pooling = config_dict.placeholder(str)
  config.task.activation = config_dict.placeholder(str)
  # Dot products times this are the logits of the cross-entropy (SPLADE's: 1).
  config.task.scale = 1.0
  # The FLOPS regulariser's weights, of the documents (positives, negatives) and the queries
  # (anchors): larger, sparser vectors (sentence-transformers' SpladeLoss examples: 3e-5, 5e-5).
  config.task.document_regularizer = 3e-5
  config.task.query_regularizer = 5e-5
  # configs/embed.py's loss: "mnrl", or a teacher's scores distilled ("margin_mse", "kl": the
  # SpladeLoss of SparseMarginMSELoss or SparseDistillKLDivLoss, the regularisers as above);
  # kl's temperature sentence-transformers' SparseDistillKLDivLoss default
  config.task.temperature = 2.0
  # A start without a masked-LM head (a sentence-transformers embedding model, say) gets a new
  # one: dense, LayerNorm and bias drawn afresh, the decoder its word embeddings.
  config.init.fresh_head = False
  return config
