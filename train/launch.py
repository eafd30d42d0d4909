"""`python -m train.launch`: starts the processes of a multi-process run (train.run.launch)."""

import sys

from train.run.host import discard_stdout_once_closed
from train.run.launch import main

if __name__ == "__main__":
  discard_stdout_once_closed()
  sys.exit(main())
