"""`python -m train.export`: writes a run's weights for other programs (train.outputs.export)."""

import sys

from train.outputs.export import main

if __name__ == "__main__":
  sys.exit(main())
