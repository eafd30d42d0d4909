"""Stage-by-stage comparison of the Flax encoder against a PyTorch model on the same tokens:
each stage's output captured on both sides (`hooked`, `run_flax`), its error (`Row`), the
table and the verdict (`verdict`). The parity report (`python -m flax_encoder.pytorch.parity`)
prints them for the reference port, your own module (parity.py) or transformers
(hf_parity.py).

A stage fails when its max abs error exceeds atol + rtol * max|PyTorch value|.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from flax_encoder.config import EncoderConfig
from flax_encoder.encoder import Encoder


@dataclasses.dataclass
class Row:
  name: str
  shape: tuple
  max_abs: float
  max_rel: float  # max_abs / max|PyTorch value|
  scale: float  # max|PyTorch value|

  def passes(self, atol: float, rtol: float) -> bool:
    return self.max_abs <= atol + rtol * self.scale


def row(name: str, ours: np.ndarray, theirs: np.ndarray, real: np.ndarray | None = None) -> Row:
  """The error of the Flax side's output `ours` against the PyTorch side's `theirs`, at the
  positions `real` (bool [batch, seq]: the real tokens) where given."""
  shape = tuple(theirs.shape)
  if real is not None:
    ours, theirs = ours[real], theirs[real]
  diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
  scale = float(np.max(np.abs(theirs)))
  return Row(name, shape, float(diff.max()), float(diff.max()) / (scale or 1.0), scale)


def check_finite(module, what: str) -> None:
  """ValueError naming the first of the torch `module`'s parameters that holds NaN or inf:
  every stage after it would differ, and the report would name a stage, not them."""
  for name, tensor in module.named_parameters():
    values = tensor.detach()
    if values.is_floating_point() and not bool(values.isfinite().all()):
      nan, bad = int(values.isnan().sum()), int((~values.isfinite()).sum())
      raise ValueError(f"{what}: weights not finite: {name} holds {nan} NaN and {bad - nan} "
                       f"inf of its {values.numel()} values, expected finite numbers")


def hooked(modules: dict, names: Sequence[str], run: Callable[[], Any]):
  """run() with a forward hook on each module of `names` -> ({name: its output as numpy},
  run()'s result)."""
  captured: dict[str, np.ndarray] = {}

  def hook(name):
    def save(_, args, output):
      output = output[0] if isinstance(output, tuple) else output
      captured[name] = output.detach().cpu().numpy()
    return save

  handles = [modules[name].register_forward_hook(hook(name)) for name in names]
  try:
    return captured, run()
  finally:
    for h in handles:
      h.remove()


def run_flax(config: EncoderConfig, variables: dict, tokens: np.ndarray):
  """The Flax encoder (unscanned) on `tokens` -> (its output, value(module path) of any
  module's output, e.g. 'layers_0/norm1')."""
  with jax.default_matmul_precision("highest"):
    output, state = Encoder(config).apply(
        variables, np.asarray(tokens), capture_intermediates=True, mutable=["intermediates"])

  def value(path: str) -> np.ndarray:
    node = state["intermediates"]
    for part in path.split("/"):
      node = node[part]
    return np.asarray(node["__call__"][0])

  return np.asarray(output), value


def random_tokens(config: EncoderConfig, batch: int, seq_len: int, seed: int) -> np.ndarray:
  """Random ids != pad_id, each row but the first padded from a random length on (with local
  attention, less padding than half the window: in transformers' float64 a padding token that
  sees only padding is NaN, and its mask carries the NaN on)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, config.vocab_size - 1, size=(batch, seq_len))
  tokens = tokens + (tokens >= config.pad_id)  # skip pad_id
  shortest = max(1, seq_len - config.local_attention // 2 + 1) if config.local_attention else 1
  for i in range(1, batch):
    tokens[i, rng.integers(min(shortest, seq_len), seq_len + 1):] = config.pad_id
  return tokens


def format_table(rows: Sequence[Row], atol: float, rtol: float) -> str:
  width = max(len(r.name) for r in rows)
  lines = [f"{'stage':<{width}}  {'shape':<16}  {'max abs err':>11}  {'max rel err':>11}",
           "-" * (width + 46)]
  for r in rows:
    flag = "" if r.passes(atol, rtol) else "  > tolerance"
    lines.append(f"{r.name:<{width}}  {str(list(r.shape)):<16}  {r.max_abs:>11.3e}  "
                 f"{r.max_rel:>11.3e}{flag}")
  return "\n".join(lines)


def sizes(config: EncoderConfig, tokens: np.ndarray) -> str:
  """The report's line of what was compared."""
  return (f"{config.n_layers} layers, d_model={config.d_model}, n_heads={config.n_heads}, "
          f"d_ff={config.d_ff}, vocab_size={config.vocab_size}, tokens {list(tokens.shape)}, "
          f"{config.dtype.name}, matmul precision highest")


def verdict(rows: Sequence[Row], absent: Sequence[str], atol: float, rtol: float) -> int:
  """Prints the table and the verdict; 0 if every stage is within tolerance, else 1."""
  print(format_table(rows, atol, rtol))
  if absent:
    print(f"not compared (no such module in the PyTorch model): {', '.join(absent)}")
  failed = [r.name for r in rows if not r.passes(atol, rtol)]
  rule = f"max abs err <= {atol:.0e} + {rtol:.0e} * max|PyTorch value|"
  if failed:
    print(f"FAIL: {len(failed)} stages above tolerance ({rule}); the first is {failed[0]}")
    return 1
  worst = max(rows, key=lambda r: r.max_rel)
  print(f"PASS: every stage within {rule}; worst relative error {worst.max_rel:.3e} at "
        f"{worst.name}")
  return 0
