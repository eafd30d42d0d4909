"""How a relative attention part's spec reads (flax_encoder.relative): "name,key=value,…", each
value read by its key's reader. It imports nothing of the library, so a part may use it
without importing what names the parts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def read_spec(spec: str, name: str, readers: dict[str, Callable[[str], Any]]
              ) -> dict[str, Any] | None:
  """{key: value} of `spec`, whose name must be `name` and each key one of `readers` (at most
  once), its value read by it; None where it is not, for the part to say what it expects."""
  given, *items = [item.strip() for item in spec.split(",")]
  if given != name:
    return None
  settings: dict[str, Any] = {}
  try:
    for item in items:
      key, value = item.split("=")
      if key in settings or key not in readers:
        return None
      settings[key] = readers[key](value)
  except (ValueError, TypeError):
    return None
  return settings
