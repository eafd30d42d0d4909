"""`python -m train.evaluate`: a model's retrieval figures on a BEIR-format set
(train.outputs.evaluate)."""

import sys

from train.outputs.evaluate import main
from train.run.host import discard_stdout_once_closed

if __name__ == "__main__":
  discard_stdout_once_closed()
  sys.exit(main())
