"""`read_safetensors`, which moved to `flax_encoder.families.safetensors_file` (loading a Hugging
Face directory needs no part of the PyTorch bridge); this name stays for code that imports it
from here."""

from flax_encoder.families.safetensors_file import read_safetensors

__all__ = ["read_safetensors"]
