"""`python -m train.draw_attention`: draws a trained encoder's attention
(train.outputs.draw_attention)."""

import sys

from train.outputs.draw_attention import main
from train.run.host import discard_stdout_once_closed

if __name__ == "__main__":
  discard_stdout_once_closed()
  sys.exit(main())
