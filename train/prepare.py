"""`python -m train.prepare`: prepares a corpus for pretraining (train.data.prepare)."""

import sys

from train.data.prepare import main

if __name__ == "__main__":
  sys.exit(main())
