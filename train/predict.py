"""`python -m train.predict`: labels texts with a fine-tuned run (train.outputs.predict)."""

import sys

from train.outputs.predict import main

if __name__ == "__main__":
  sys.exit(main())
