"""`python -m train.prepare`: prepares a corpus for pretraining (train.data.prepare)."""

import sys

from train.data.prepare import main
from train.run.host import discard_stdout_once_closed

if __name__ == "__main__":
  discard_stdout_once_closed()
  sys.exit(main())
