r"""Masked-token training on a SentencePiece vocabulary learned from the built-in corpus.

  python -m train.prepare --input builtin:pydoc_data.topics --out data/topics-sp4k \
      --tokenizer sentencepiece --vocab-size 4000 --seq-len 128 --eval-fraction 0.05
  python -m train --config=configs/subword.py --workdir runs/subword

The model of configs/default.py on windows of 128 pieces (about 460 bytes of text each): the
vocabulary, 4004 ids, comes from the prepared directory. docs/data.md has the measured
accuracy.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.data.prepared = "data/topics-sp4k"  # relative to the repository root
  config.train.update(seq_len=128, batch_size=32)
  return config
