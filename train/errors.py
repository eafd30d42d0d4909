"""The program's own error: a mistake in the config, the data or the workdir, or a resource the
run cannot use (a full disk). `python -m train` prints it as `error: <field or file>: <what
came>, <what is expected>` and exits with its code; anything else is a bug and keeps its
traceback."""


class RunError(Exception):
  """One line for the user; `exit_code` 2 for a mistake in what was asked, 1 for a resource
  that failed while the run went on."""

  def __init__(self, message: str, exit_code: int = 2):
    super().__init__(message)
    self.exit_code = exit_code
