"""Parity report: runs the PyTorch port and this port on the same weights and tokens.

  python -m flax_encoder.pytorch.parity --checkpoint model.pt --layout tutorial --vocab-size 1000 \
      --d-model 512 --n-heads 8 --d-ff 2048 --n-layers 6

prints max abs and relative error for the embedding, the embedded input, every sub-layer of
every layer and the output, and exits 1 when a stage's max abs error exceeds
atol + rtol * max|PyTorch value| (float32 rounding grows with the size of the activations). Without
--checkpoint, both ports run on random PyTorch weights (a self-check of the installation).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Sequence

import numpy as np

from flax_encoder.config import EncoderConfig
from flax_encoder.pytorch.convert import LAYOUTS

# flax path of a captured module output -> PyTorch module name, per layout; {i} = layer index.
_LAYER_POINTS = {
    "tutorial": [("self_attn", "self_attn"), ("norm1", "norm1"), ("feed_forward", "feed_forward"),
             ("norm2", "norm2")],
    "torch_nn": [("self_attn", "self_attn"), ("norm1", "norm1"), ("feed_forward", "linear2"),
                 ("norm2", "norm2")],
}


@dataclasses.dataclass
class Row:
  name: str
  shape: tuple
  max_abs: float
  max_rel: float  # max_abs / max|PyTorch value|
  scale: float  # max|PyTorch value|

  def passes(self, atol: float, rtol: float) -> bool:
    return self.max_abs <= atol + rtol * self.scale


def compare(state_dict, config: EncoderConfig, layout: str, tokens: np.ndarray) -> list[Row]:
  """Runs both ports (eval mode) in config.dtype (float32 or float64) and compares each stage."""
  import jax
  import torch

  from flax_encoder.encoder import Encoder
  from flax_encoder.pytorch import convert, reference

  float64 = config.dtype == np.float64
  torch_dtype = torch.float64 if float64 else torch.float32
  model = reference.Encoder(config, layout, table_dtype=torch_dtype)
  state = {k: torch.as_tensor(np.asarray(v)) for k, v in state_dict.items()}
  if layout == "tutorial" and convert.PE_KEY not in state:
    state[convert.PE_KEY] = model.pos_encoder.pe
  model.load_state_dict(state, strict=True)
  model.to(torch_dtype).eval()
  if layout == "tutorial":  # the table in the run's precision, as the flax port computes it
    model.pos_encoder.pe = reference.PositionalEncoding(
        config.d_model, 0.0, config.max_len, torch_dtype).pe

  captured: dict[str, np.ndarray] = {}

  def hook(name):
    def save(module, args, output):
      output = output[0] if isinstance(output, tuple) else output
      captured[name] = output.detach().numpy()
    return save

  points = [("embedding", "embedding", "embedding"), ("embedded", "pos_encoder", "pos_encoder")]
  for i in range(config.n_layers):
    for flax_name, torch_name in _LAYER_POINTS[layout]:
      points.append((f"layers.{i}.{flax_name}", f"layers_{i}/{flax_name}",
                     f"layers.{i}.{torch_name}"))
    points.append((f"layers.{i}", f"layers_{i}", f"layers.{i}"))
  if config.final_norm:
    points.append(("norm", "norm", "norm"))
  modules = dict(model.named_modules())
  handles = [modules[t].register_forward_hook(hook(t)) for _, _, t in points]
  # Grad mode stays on: under no_grad nn.TransformerEncoderLayer takes a fused fast path.
  output_torch = model(torch.as_tensor(tokens)).detach().numpy()
  for h in handles:
    h.remove()

  flax_config = dataclasses.replace(config, scan_layers=False, remat="none")
  variables = convert.from_torch_state_dict(state_dict, flax_config, layout)
  with jax.default_matmul_precision("highest"):
    output_flax, state = Encoder(flax_config).apply(
        variables, np.asarray(tokens), capture_intermediates=True, mutable=["intermediates"])
  inter = state["intermediates"]

  def flax_value(path: str):
    node = inter
    for part in path.split("/"):
      node = node[part]
    return np.asarray(node["__call__"][0])

  rows = [_row(name, flax_value(f), captured[t]) for name, f, t in points]
  rows.append(_row("output", np.asarray(output_flax), output_torch))
  return rows


def _row(name: str, ours: np.ndarray, theirs: np.ndarray) -> Row:
  diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
  scale = float(np.max(np.abs(theirs)))
  return Row(name, tuple(theirs.shape), float(diff.max()), float(diff.max()) / (scale or 1.0),
             scale)


def format_table(rows: Sequence[Row], atol: float, rtol: float) -> str:
  width = max(len(r.name) for r in rows)
  lines = [f"{'stage':<{width}}  {'shape':<16}  {'max abs err':>11}  {'max rel err':>11}",
           "-" * (width + 46)]
  for r in rows:
    flag = "" if r.passes(atol, rtol) else "  > tolerance"
    lines.append(f"{r.name:<{width}}  {str(list(r.shape)):<16}  {r.max_abs:>11.3e}  "
                 f"{r.max_rel:>11.3e}{flag}")
  return "\n".join(lines)


def random_tokens(config: EncoderConfig, batch: int, seq_len: int, seed: int) -> np.ndarray:
  """Random ids != pad_id, each row but the first padded from a random length on."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, config.vocab_size - 1, size=(batch, seq_len))
  tokens = tokens + (tokens >= config.pad_id)  # skip pad_id
  for row in range(1, batch):
    tokens[row, rng.integers(1, seq_len + 1):] = config.pad_id
  return tokens


def _parse_args(argv):
  p = argparse.ArgumentParser(prog="python -m flax_encoder.pytorch.parity", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint", help=".pt/.pth/.bin or .safetensors state dict; "
                 "omitted: random weights")
  p.add_argument("--layout", default="tutorial", choices=LAYOUTS)
  p.add_argument("--config", help="JSON file of EncoderConfig fields (flags below override it)")
  for flag, kind in (("vocab-size", int), ("d-model", int), ("n-heads", int), ("d-ff", int),
                     ("n-layers", int), ("max-len", int), ("pad-id", int),
                     ("layer-norm-eps", float), ("norm-position", str), ("activation", str)):
    p.add_argument(f"--{flag}", type=kind)
  p.add_argument("--no-final-norm", action="store_true")
  p.add_argument("--tokens", help="JSON list of rows of ids, e.g. '[[5, 6, 7, 0]]'")
  p.add_argument("--batch", type=int, default=4)
  p.add_argument("--seq-len", type=int, default=32)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--float64", action="store_true", help="both ports in float64")
  p.add_argument("--atol", type=float,
                 help="absolute tolerance (default 1e-5; 1e-10 with --float64)")
  p.add_argument("--rtol", type=float, help="tolerance relative to the largest PyTorch value "
                 "of the stage (default 1e-4; 1e-12 with --float64)")
  return p.parse_args(argv)


def _config_from_args(args) -> EncoderConfig:
  fields = {}
  if args.config:
    with open(args.config) as f:
      fields.update(json.load(f))
  for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len", "pad_id",
               "layer_norm_eps", "norm_position", "activation"):
    if getattr(args, name) is not None:
      fields[name] = getattr(args, name)
  if args.no_final_norm:
    fields["final_norm"] = False
  if "vocab_size" not in fields:
    raise SystemExit("error: --vocab-size (or vocab_size in --config) is required")
  fields.update(dropout=0.0, attention_dropout=0.0,
                dtype="float64" if args.float64 else "float32",
                param_dtype="float64" if args.float64 else "float32")
  known = {f.name for f in dataclasses.fields(EncoderConfig)}
  unknown = sorted(set(fields) - known)
  if unknown:
    raise SystemExit(f"error: unknown EncoderConfig fields in --config: {unknown}")
  return EncoderConfig(**fields)


def main(argv: Sequence[str] | None = None) -> int:
  import jax

  args = _parse_args(argv)
  config = _config_from_args(args)
  atol = args.atol if args.atol is not None else (1e-10 if args.float64 else 1e-5)
  rtol = args.rtol if args.rtol is not None else (1e-12 if args.float64 else 1e-4)

  if args.checkpoint:
    from flax_encoder.pytorch.convert import load_torch_checkpoint
    state_dict = load_torch_checkpoint(args.checkpoint)
    source = args.checkpoint
  else:
    import torch

    from flax_encoder.pytorch import reference
    torch.manual_seed(args.seed)
    state_dict = reference.Encoder(config, args.layout).state_dict()
    source = f"random weights (seed {args.seed})"
  if args.tokens:
    tokens = np.asarray(json.loads(args.tokens), dtype=np.int64)
  else:
    tokens = random_tokens(config, args.batch, args.seq_len, args.seed)

  with jax.enable_x64(args.float64):
    rows = compare(state_dict, config, args.layout, tokens)
  failed = [r.name for r in rows if not r.passes(atol, rtol)]
  print(f"parity: {source}, layout={args.layout}, {config.n_layers} layers, d_model="
        f"{config.d_model}, tokens {list(tokens.shape)}, {config.dtype.name}, matmul precision "
        f"highest")
  print(format_table(rows, atol, rtol))
  worst = max(rows, key=lambda r: r.max_rel)
  rule = f"max abs err <= {atol:.0e} + {rtol:.0e} * max|PyTorch value|"
  if failed:
    print(f"FAIL: {len(failed)} stages above tolerance ({rule}), first {failed[0]}")
    return 1
  print(f"PASS: every stage within {rule}; worst relative error {worst.max_rel:.3e} at "
        f"{worst.name}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
