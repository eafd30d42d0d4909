r"""Fine-tuning for a tag per word (named entities, parts of speech), on JSON lines.

  python -m train --config=configs/tag.py --workdir runs/ner \
      --config.data.train=train.jsonl --config.data.eval=eval.jsonl \
      [--config.init.hf=bert-dir | --config.init.run=RUN | --config.init.torch_checkpoint=model.pt
       --config.init.n_heads=8]
  python -m train.predict --workdir runs/ner --input words.jsonl --out tags.jsonl
  python -m train.export --workdir runs/ner --layout hf --out ner-bert/   # from config.init.hf

Each line is {"tokens": ["John", "lives", "in", "Paris"], "tags": ["B-PER", "O", "O",
"B-LOC"]}: a text's words and one tag per word (strings or integers). Each word is tokenized
on its own and its tag learnt at its first id (transformers' alignment); from a Hugging Face
directory its template's [CLS] and [SEP] go around the words. Evaluation reports the accuracy
over the words, macro-F1 over the tags, the majority tag's accuracy and, for BIO tags, the F1
over entities (docs/training.md, "Tagging"). There is no built-in tagging task: the two files
are the user's. The other fields are configs/classify.py's.
"""

import ml_collections
from ml_collections import config_dict

from configs import classify


def get_config() -> ml_collections.ConfigDict:
  config = classify.get_config()
  config.task.name = "tag"
  del config.task["pooling"]  # a tag per token: nothing pooled
  config.data.train = config_dict.placeholder(str)  # JSON lines; both required
  config.data.eval = config_dict.placeholder(str)
  for name in ("text_field", "pair_field", "label_field", "separator_id"):
    del config.data[name]  # one text, the words given: no pair, no separator
  del config.init["torch_head"]  # a classifier of texts' classes, not of tags
  config.data.tokens_field = "tokens"  # the line's words: a list of strings
  config.data.tags_field = "tags"  # their tags: a list as long (strings or integers)
  return config
