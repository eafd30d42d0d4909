r"""Long sequences: one local (sliding-window) layer of ModernBERT-base's shape, forward and
backward, by the windowed path that builds no [seq, seq] array against the full mask.

  python -m benchmarks.long_sequence --out long.json              # 1,024, 2,048, 4,096 tokens
  python -m benchmarks.long_sequence --seqs 512,1024 --reps 2

The layer: d_model 768, 12 heads, GeGLU d_ff 1152, no biases, rotary positions, a window of
128 (a token sees 64 either way), Pre-LN, attention_impl 'xla', one row of `seq` tokens. The
paths, on the same weights and input:

  windowed    `attention_ids` in, `windowed_attention` (blocks of 64 positions, each query
              meeting 192 keys)
  full mask   a bool [seq, seq] mask in (`ids_mask`), the window added to it, and
              `jax.nn.dot_product_attention` over every key
  cudnn       (GPU) the full mask through cuDNN's flash attention: its own sliding window
              is one-sided or causal only, so a symmetric one travels as a mask

Each row: the median forward+backward time (gradients of the layer's parameters and input)
over `--reps` calls, that time per 1,024 tokens, the XLA temporaries of the compiled program
(`memory_analysis()`, the memory it needs beyond inputs and outputs), and the largest
difference from the full-mask path's output.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.bench import interleaved
from flax_encoder import EncoderConfig
from flax_encoder.layer import EncoderLayer
from flax_encoder.packing import attention_ids, ids_mask

WINDOW = 128


def layer_config(seq: int, dtype: str = "float32", tiny: bool = False, **changes):
  sizes = (dict(d_model=32, n_heads=2, d_ff=48) if tiny
           else dict(d_model=768, n_heads=12, d_ff=1152))
  return EncoderConfig(**{**dict(
      vocab_size=100, n_layers=1, max_len=seq, norm_position="pre",
      position_embedding="rotary", local_attention=16 if tiny else WINDOW, glu=True,
      dense_bias=False, norm_bias=False, activation="gelu", attention_impl="xla",
      dtype=dtype), **sizes, **changes})


def _paths(backend: str) -> dict:
  """{path: (attention_impl, mask given ids)}."""
  paths = {"windowed": ("xla", lambda ids: ids), "full mask": ("xla", ids_mask)}
  if backend == "gpu":
    paths["cudnn"] = ("cudnn", ids_mask)
  return paths


def measure(seqs, dtype: str = "float32", reps: int = 3, tiny: bool = False) -> list[dict]:
  rows = []
  backend = jax.default_backend()
  for seq in seqs:
    rng = np.random.default_rng(seq)
    x = jnp.asarray(rng.standard_normal((1, seq, layer_config(seq, tiny=tiny).d_model)), dtype)
    tokens = jnp.ones((1, seq), jnp.int32)
    ids = attention_ids(tokens, 0)
    runners, outputs, memory = {}, {}, {}
    variables = None
    for name, (impl, mask_of) in _paths(backend).items():
      layer = EncoderLayer(layer_config(seq, dtype, tiny, attention_impl=impl))
      mask = mask_of(ids)
      if variables is None:
        variables = layer.init(jax.random.key(0), x, mask, True, None, False)
      loss = lambda v, x, layer=layer, mask=mask: layer.apply(
          v, x, mask, True, None, False).astype(jnp.float32).sum()
      step = jax.jit(jax.grad(loss, argnums=(0, 1)))
      try:
        compiled = step.lower(variables, x).compile()
      except Exception as e:  # noqa: BLE001 - a path this backend refuses is reported, not fatal
        rows.append({"tokens": seq, "path": name, "note": f"{type(e).__name__}: {e}"[:300]})
        continue
      memory[name] = compiled.memory_analysis().temp_size_in_bytes
      outputs[name] = np.asarray(jax.jit(lambda v, x, layer=layer, mask=mask: layer.apply(
          v, x, mask, True, None, False))(variables, x), np.float32)
      runners[name] = lambda compiled=compiled: jax.block_until_ready(compiled(variables, x))
    seconds = interleaved(runners, reps=reps, warmup=1)
    for name in runners:
      rows.append({"tokens": seq, "path": name,
                   "forward+backward ms": round(seconds[name] * 1e3, 1),
                   "ms per 1,024 tokens": round(seconds[name] * 1e3 * 1024 / seq, 1),
                   "XLA temporaries MB": round(memory[name] / 2**20, 1),
                   "max abs diff vs full mask": f"{np.abs(outputs[name] - outputs['full mask']).max():.1e}"})
  return rows


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.long_sequence", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--seqs", default="1024,2048,4096")
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--out", help="write the rows and the machine here as JSON")
  args = parser.parse_args(argv)
  rows = measure([int(s) for s in args.seqs.split(",")], args.dtype, args.reps)
  columns = list(dict.fromkeys(k for r in rows for k in r))
  print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
  for r in rows:
    print("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |")
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"machine": f"{platform.node()}, {platform.processor() or platform.machine()}, "
                            f"{jax.default_backend()}", "dtype": args.dtype, "rows": rows}, f,
                indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
