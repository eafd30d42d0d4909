"""`python -m train.embed`: sentence embeddings of a file of texts (train.outputs.embed)."""

import sys

from train.outputs.embed import main

if __name__ == "__main__":
  sys.exit(main())
