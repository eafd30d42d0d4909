"""`python -m train.draw_attention`: draws a trained encoder's attention
(train.outputs.draw_attention)."""

import sys

from train.outputs.draw_attention import main

if __name__ == "__main__":
  sys.exit(main())
