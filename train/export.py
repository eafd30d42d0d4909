"""`python -m train.export`: writes a run's weights for other programs (train.outputs.export)."""

import sys

from train.outputs.export import main
from train.run.host import discard_stdout_once_closed

if __name__ == "__main__":
  discard_stdout_once_closed()
  sys.exit(main())
