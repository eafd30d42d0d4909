"""The documentation says what the code has: docs/library.md's table of EncoderConfig's fields
by role lists each field once, under its role."""

import os
import re

from flax_encoder import EncoderConfig
from flax_encoder.config import ROLES
from tests import runs


def _table_of_roles() -> dict[str, list[str]]:
  with open(os.path.join(runs.ROOT, "docs", "library.md"), encoding="utf-8") as f:
    rows = [line.split("|")[1:3] for line in f if re.match(r"\| (\w+) \| ", line)]
  # A cell lists fields, in groups that a label ending in ':' names.
  return {role.strip(): re.findall(r"(\w+)(?=,|;|\s*$)", cell.strip())
          for role, cell in rows if role.strip() in ROLES}


def test_the_fields_table_lists_every_field_under_its_role():
  table = _table_of_roles()
  assert sorted(table) == sorted(ROLES)
  for role in ROLES:
    assert sorted(table[role]) == sorted(EncoderConfig.fields(role)), role
