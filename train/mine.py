"""`python -m train.mine`: hard negatives for (anchor, positive) lines (train.outputs.mine)."""

import sys

from train.outputs.mine import main
from train.run.host import discard_stdout_once_closed

if __name__ == "__main__":
  discard_stdout_once_closed()
  sys.exit(main())
