"""What every command's argument parser shares: its help shows each option's default."""

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
  """The description as written, and after each option's help its default, where it has one
  to say (not None, not a flag's False) and the help does not say it already."""

  def _get_help_string(self, action) -> str:
    said = action.help or ""
    default = action.default
    if (action.option_strings and "%(default)" not in said and "default" not in said
        and not any(default is nothing for nothing in (None, False, argparse.SUPPRESS))):
      said += " (default: %(default)s)"
    return said
