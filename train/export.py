"""Exports a run's encoder weights as a PyTorch state dict (.safetensors or .pt).

  python -m train.export --workdir runs/demo --out encoder.safetensors [--layout torch_nn]
"""

from __future__ import annotations

import argparse
import sys

from flax_encoder.interop import LAYOUTS, to_torch_state_dict


def export(workdir: str, out: str, layout: str = "seed") -> str:
  """Writes the newest verified checkpoint's encoder to `out`; returns the path."""
  import torch

  from train.loop import load_encoder
  cfg, variables = load_encoder(workdir)
  state = to_torch_state_dict(variables, cfg, layout)
  if out.endswith(".safetensors"):
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in state.items()}, out)
  elif out.endswith((".pt", ".pth", ".bin")):
    torch.save(state, out)
  else:
    raise ValueError(f"--out must end in .safetensors, .pt, .pth or .bin, got {out!r}")
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m train.export", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--layout", default="seed", choices=LAYOUTS)
  args = parser.parse_args(argv)
  print(export(args.workdir, args.out, args.layout))
  return 0


if __name__ == "__main__":
  sys.exit(main())
