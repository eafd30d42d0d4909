"""`python -m train.embed`: sentence embeddings of a file of texts (train.outputs.embed)."""

import sys

from train.outputs.embed import main
from train.run.host import discard_stdout_once_closed

if __name__ == "__main__":
  discard_stdout_once_closed()
  sys.exit(main())
