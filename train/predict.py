"""`python -m train.predict`: a fine-tuned run's predictions for new examples (classify,
regress, tag, rerank: train.outputs.predict)."""

import sys

from train.outputs.predict import main
from train.run.host import discard_stdout_once_closed

if __name__ == "__main__":
  discard_stdout_once_closed()
  sys.exit(main())
