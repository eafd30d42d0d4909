"""Exports a run's encoder: PyTorch weights (.safetensors or .pt) or a jax.export program.

  python -m train.export --workdir runs/demo --out encoder.safetensors [--layout torch_nn]
  python -m train.export --workdir runs/demo --out encoder.jaxexport [--seq-len 64]

A .jaxexport file is the compiled encoder with its weights (StableHLO for CPU and CUDA), taking
int32 ids [batch, seq_len]; it runs with `jax.export.deserialize(data).call(tokens)` and no
code of this package.
"""

from __future__ import annotations

import argparse
import sys

from flax_encoder.pytorch import LAYOUTS, to_torch_state_dict


def export(workdir: str, out: str, layout: str = "tutorial", seq_len: int | None = None) -> str:
  """Writes the newest verified checkpoint's encoder to `out`; returns the path.

  For a .jaxexport file, `seq_len` defaults to the run's config.train.seq_len.
  """
  from train.load import load_config, load_encoder
  cfg, variables = load_encoder(workdir)
  if out.endswith(".jaxexport"):
    from flax_encoder.inference import export_encoder
    export_encoder(cfg, variables, out, seq_len or load_config(workdir).train.seq_len)
    return out
  import torch

  state = to_torch_state_dict(variables, cfg, layout)
  if out.endswith(".safetensors"):
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in state.items()}, out)
  elif out.endswith((".pt", ".pth", ".bin")):
    torch.save(state, out)
  else:
    raise ValueError(f"--out must end in .safetensors, .pt, .pth, .bin or .jaxexport, got "
                     f"{out!r}")
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m train.export", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--layout", default="tutorial", choices=LAYOUTS)
  parser.add_argument("--seq-len", type=int, default=None,
                      help=".jaxexport: input length (default: the run's train.seq_len)")
  args = parser.parse_args(argv)
  print(export(args.workdir, args.out, args.layout, args.seq_len))
  return 0


if __name__ == "__main__":
  sys.exit(main())
