"""`python -m train.predict`: a fine-tuned run's predictions for new examples (classify,
regress, tag, rerank: train.outputs.predict)."""

import sys

from train.outputs.predict import main

if __name__ == "__main__":
  sys.exit(main())
