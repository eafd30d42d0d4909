r"""The speed levers tried on the CPU, each measured in isolation (BENCHMARKS.md, "Reading it").

  python -m benchmarks.levers matmuls     # x@w, dy@w.T, x.T@dy: JAX against PyTorch, GFLOP/s
  python -m benchmarks.levers qkv         # three 512x512 projections against one fused 512x1536
  python -m benchmarks.levers step        # forward+backward at 8x128, no dropout, ms
  python -m benchmarks.levers attention   # one attention at 8x512, forward+backward: JAX, PyTorch
  python -m benchmarks.levers dropout     # bench.py's training step at 8x512: dropout's cost
  python -m benchmarks.levers busy        # bench.py's steps at 8x512: wall ms, cores busy
  for f in "" --xla_cpu_use_onednn=true --xla_cpu_experimental_ynn_fusion_type=; do
    XLA_FLAGS=$f python -m benchmarks.levers step; done                    # matmul back ends
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.bench import WithHead, jax_side, paper_base
from flax_encoder.host import keep_freed_memory


def median_seconds(fn, reps: int = 7) -> float:
  fn()
  fn()
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def matmuls() -> None:
  import torch
  rng = np.random.default_rng(0)
  x, w, dy = (rng.random(s, np.float32) for s in ((1024, 512), (512, 2048), (1024, 2048)))
  jx, jw, jdy = (jnp.asarray(a) for a in (x, w, dy))
  tx, tw, tdy = (torch.from_numpy(a) for a in (x, w, dy))
  flops = 2 * 1024 * 512 * 2048
  cases = {"x @ w (forward)": (jax.jit(lambda a, b: a @ b), (jx, jw), lambda: tx @ tw),
           "dy @ w.T (input grad)": (jax.jit(lambda a, b: a @ b.T), (jdy, jw), lambda: tdy @ tw.T),
           "x.T @ dy (weight grad)": (jax.jit(lambda a, b: a.T @ b), (jx, jdy), lambda: tx.T @ tdy)}
  for name, (fn, args, torch_fn) in cases.items():
    j = median_seconds(lambda fn=fn, args=args: fn(*args).block_until_ready())
    t = median_seconds(torch_fn)
    print(f"{name:24s} jax {flops / j / 1e9:5.0f} GFLOP/s  torch {flops / t / 1e9:5.0f} GFLOP/s")


def qkv() -> None:
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.random((1024, 512), np.float32))
  ws = [jnp.asarray(rng.random((512, 512), np.float32)) for _ in range(3)]
  separate = jax.jit(jax.grad(lambda ws, x: sum(jnp.sum(jnp.tanh(x @ w)) for w in ws)))
  fused = jax.jit(jax.grad(lambda ws, x: jnp.sum(jnp.tanh(x @ jnp.concatenate(ws, 1)))))
  for name, fn in (("three projections", separate), ("one fused projection", fused)):
    ms = median_seconds(lambda fn=fn: jax.block_until_ready(fn(ws, x))) * 1e3
    print(f"{name:22s} forward+backward {ms:.1f} ms")


def step() -> None:
  cfg = paper_base(dropout=0.0)  # attention_impl "reference", the default
  model = WithHead(cfg)
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, cfg.vocab_size, (8, 128)), jnp.int32)
  params = nn.unbox(model.init(jax.random.key(0), tokens[:1]))["params"]
  loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(
      model.apply({"params": p}, tokens), tokens).mean()
  grad = jax.jit(jax.grad(loss))
  ms = median_seconds(lambda: jax.block_until_ready(grad(params)), reps=5) * 1e3
  print(f"forward+backward 8x128: {ms:.0f} ms")


def attention() -> None:
  """One paper-base attention at 8x512 (padding mask, no dropout), forward + backward."""
  import torch

  from flax_encoder import scaled_dot_product_attention, torch_port
  batch, seq, heads, head_dim = 8, 512, 8, 64
  rng = np.random.default_rng(0)
  q, k, v, d_out = (rng.standard_normal((batch, seq, heads, head_dim), np.float32)
                    for _ in range(4))
  mask = np.ones((batch, 1, 1, seq), bool)
  mask[0, ..., 400:] = False

  def fwd_bwd(q, k, v, d_out, mask):
    attend = lambda q, k, v: scaled_dot_product_attention(q, k, v, mask)[0]
    out, vjp = jax.vjp(attend, q, k, v)
    return out, vjp(d_out)

  fn = jax.jit(fwd_bwd)
  args = [jnp.asarray(a) for a in (q, k, v, d_out, mask)]
  j = median_seconds(lambda: jax.block_until_ready(fn(*args)))
  # The PyTorch port's attention on [batch, heads, seq, head_dim], as its MultiHeadAttention
  # calls it.
  tq, tk, tv, td = (torch.from_numpy(a).transpose(1, 2).contiguous() for a in (q, k, v, d_out))
  tq.requires_grad_(), tk.requires_grad_(), tv.requires_grad_()
  tmask = torch.from_numpy(mask)

  def torch_fwd_bwd():
    torch_port.scaled_dot_product_attention(tq, tk, tv, tmask)[0].backward(td)

  t = median_seconds(torch_fwd_bwd)
  print(f"attention forward+backward 8x512: jax {j * 1e3:.0f} ms, torch {t * 1e3:.0f} ms")


def dropout() -> None:
  """bench.py's training step at 8x512 with this port's dropout, flax.linen.Dropout, none."""
  from unittest import mock

  from flax_encoder import encoder, feed_forward, layer
  flax_dropout = [mock.patch.object(m, "Dropout", nn.Dropout)
                  for m in (encoder, feed_forward, layer)]
  cases = (("flax_encoder.Dropout", 0.1, [], "threefry2x32"),
           ("flax.linen.Dropout", 0.1, flax_dropout, "threefry2x32"),
           ("flax_encoder.Dropout", 0.1, [], "rbg"),
           ("no dropout", 0.0, [], "threefry2x32"))
  for name, rate, patches, prng in cases:
    with contextlib.ExitStack() as stack, jax.default_prng_impl(prng):
      for patch in patches:
        stack.enter_context(patch)
      _, train, _, _ = jax_side(paper_base(dropout=rate), 8, 512)
      ms = median_seconds(train, reps=5) * 1e3
    print(f"training step 8x512, {name:20s} rate {rate}, {prng:12s} PRNG: {ms:.0f} ms")


def busy() -> None:
  """bench.py's steps at 8x512 on both sides: wall time and how many cores were busy."""
  import resource

  from benchmarks.bench import torch_side
  cfg = paper_base(dropout=0.1)
  jax_forward, jax_train, params, (tokens, targets) = jax_side(cfg, 8, 512)
  torch_forward, torch_train = torch_side(cfg, params, tokens, targets, compile_=False)
  runners = {"jax forward": jax_forward, "torch forward": torch_forward,
             "jax train": jax_train, "torch train": torch_train}
  for name, fn in runners.items():
    fn()
    fn()
    time.sleep(0.5)
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fn()
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    print(f"{name:14s} 8x512: {wall * 1e3:6.0f} ms wall, {cpu / wall:.2f} cores busy")


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  levers = {"matmuls": matmuls, "qkv": qkv, "step": step, "attention": attention,
            "dropout": dropout, "busy": busy}
  if len(argv) != 1 or argv[0] not in levers:
    print(__doc__, file=sys.stderr)
    return 2
  keep_freed_memory()  # as bench.py does by default
  jax.config.update("jax_default_matmul_precision", "highest")
  levers[argv[0]]()
  return 0


if __name__ == "__main__":
  sys.exit(main())
