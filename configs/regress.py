r"""Fine-tuning for a number per text or pair of texts (regression), on JSON lines.

  python -m train --config=configs/regress.py --workdir runs/sts \
      --config.data.train=train.jsonl --config.data.eval=eval.jsonl \
      [--config.init.hf=bert-dir | --config.init.run=RUN | --config.init.torch_checkpoint=model.pt
       --config.init.n_heads=8]
  python -m train.predict --workdir runs/sts --input new.jsonl --out scores.jsonl
  python -m train.export --workdir runs/sts --layout hf --out sts-bert/   # from config.init.hf

Each line is {"text": ..., "text_pair": ..., "label": 3.8} (the pair optional; STS-B's
sentence pairs and their similarity, say). Every field but the task's is configs/classify.py's;
there is no built-in regression task, so the two files are the user's. Evaluation reports the
mean squared error, Pearson's and Spearman's correlation and the squared error of always
predicting the training mean (docs/training.md, "Regression").
"""

import ml_collections
from ml_collections import config_dict

from configs import classify


def get_config() -> ml_collections.ConfigDict:
  config = classify.get_config()
  config.task.name = "regress"
  # JSON lines: {"text": ..., "label": a number}, optionally "text_pair". Both required.
  config.data.train = config_dict.placeholder(str)
  config.data.eval = config_dict.placeholder(str)
  return config
