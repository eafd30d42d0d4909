r"""Speed experiments on the CPU, each measured in isolation; BENCHMARKS.md quotes them where a
design choice rests on one. Not part of the reported benchmark (benchmarks/bench.py).

  python -m benchmarks.experiments.levers matmuls    # x@w, dy@w.T, x.T@dy: JAX vs PyTorch
  python -m benchmarks.experiments.levers qkv        # three 512x512 projections vs one 512x1536
  python -m benchmarks.experiments.levers attention  # one attention at 8x512, fwd+bwd, vs PyTorch
  python -m benchmarks.experiments.levers dropout    # the training step with each dropout
                                                     # (with 4 devices: the words each draws)
  python -m benchmarks.experiments.levers busy       # the training step at 8x512: cores busy
"""

from __future__ import annotations

import contextlib
import re
import statistics
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.workload import jax_side, paper_base, torch_side
from flax_encoder import Dropout
from train.run.host import keep_freed_memory


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
  """The three matmuls of a dense layer's training step, at the paper base's 1024 tokens x 512 ->
  2048 and at all-MiniLM-L6-v2's contrastive step (6,912 packed ids x 384 -> 1536)."""
  import torch
  rng = np.random.default_rng(0)
  for m, k, n in ((1024, 512, 2048), (6912, 384, 1536)):
    x, w, dy = (rng.random(s, np.float32) for s in ((m, k), (k, n), (m, n)))
    jx, jw, jdy = (jnp.asarray(a) for a in (x, w, dy))
    tx, tw, tdy = (torch.from_numpy(a) for a in (x, w, dy))
    flops = 2 * m * k * n
    cases = {"x @ w (forward)": (jax.jit(lambda a, b: a @ b), (jx, jw), lambda: tx @ tw),
             "dy @ w.T (input grad)": (jax.jit(lambda a, b: a @ b.T), (jdy, jw),
                                       lambda: tdy @ tw.T),
             "x.T @ dy (weight grad)": (jax.jit(lambda a, b: a.T @ b), (jx, jdy),
                                        lambda: tx.T @ tdy)}
    for name, (fn, args, torch_fn) in cases.items():
      j = median_seconds(lambda fn=fn, args=args: fn(*args).block_until_ready())
      t = median_seconds(torch_fn)
      print(f"{m}x{k}x{n} {name:24s} jax {flops / j / 1e9:5.0f} GFLOP/s  "
            f"torch {flops / t / 1e9:5.0f} GFLOP/s")


def qkv() -> None:
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.random((1024, 512), np.float32))
  ws = [jnp.asarray(rng.random((512, 512), np.float32)) for _ in range(3)]
  separate = jax.jit(jax.grad(lambda ws, x: sum(jnp.sum(jnp.tanh(x @ w)) for w in ws)))
  fused = jax.jit(jax.grad(lambda ws, x: jnp.sum(jnp.tanh(x @ jnp.concatenate(ws, 1)))))
  for name, fn in (("three projections", separate), ("one fused projection", fused)):
    ms = median_seconds(lambda fn=fn: jax.block_until_ready(fn(ws, x))) * 1e3
    print(f"{name:22s} forward+backward {ms:.1f} ms")


def attention() -> None:
  """One paper-base attention at 8x512 (padding mask, no dropout), forward + backward."""
  import torch

  from flax_encoder import scaled_dot_product_attention
  from flax_encoder.pytorch import reference
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
    reference.scaled_dot_product_attention(tq, tk, tv, tmask)[0].backward(td)

  t = median_seconds(torch_fwd_bwd)
  print(f"attention forward+backward 8x512: jax {j * 1e3:.0f} ms, torch {t * 1e3:.0f} ms")


def dropout() -> None:
  """The training step at 8x512 with this package's Dropout, with flax.linen.Dropout's
  computation in its place (one bernoulli draw per element, autodiff through the select),
  and with no dropout."""

  def linen_dropout(next_fun, args, kwargs, context):
    if not isinstance(context.module, Dropout) or context.method_name != "__call__":
      return next_fun(*args, **kwargs)
    x, rate = args[0], context.module.rate
    if kwargs.get("deterministic", args[1] if len(args) > 1 else True) or rate == 0.0:
      return x
    keep = jax.random.bernoulli(context.module.make_rng("dropout"), 1.0 - rate, x.shape)
    return jax.lax.select(keep, x / (1.0 - rate), jnp.zeros_like(x))

  cases = (("flax_encoder.Dropout", 0.1, None), ("flax.linen.Dropout's", 0.1, linen_dropout),
           ("jax's threefry loop", 0.1, "loop"), ("XLA's RngBitGenerator", 0.1, "rbg"),
           ("no dropout", 0.0, None))
  for name, rate, interceptor in cases:
    _, train, _, _ = jax_side(paper_base(dropout=rate), 8, 512)
    if interceptor is None:
      ms = median_seconds(train, reps=5) * 1e3
    elif interceptor in ("rbg", "loop"):
      with _rbg_bits() if interceptor == "rbg" else _jax_words():  # while the step is traced
        ms = median_seconds(train, reps=5) * 1e3
    else:
      with nn.intercept_methods(interceptor):
        ms = median_seconds(train, reps=5) * 1e3
    print(f"training step 8x512, {name:22s} rate {rate}: {ms:.0f} ms")
  if jax.device_count() > 1:  # XLA_FLAGS=--xla_force_host_platform_device_count=4
    _rbg_over_a_mesh()


@contextlib.contextmanager
def _words_from(words):
  """flax_encoder's masks (its Dropout's and the reference attention's) with their words from
  `words(rng, shape)` in place of `random_words`, while a step is traced."""
  from flax_encoder import dropout as module
  saved = module.random_words
  module.random_words = words
  try:
    yield
  finally:
    module.random_words = saved


def _jax_words():
  """The same words from `jax.random.bits` itself: its threefry rounds a loop on the CPU."""
  return _words_from(lambda rng, shape: jax.random.bits(rng, shape, jnp.uint32))


def _rbg_bits():
  """Words drawn by XLA's RngBitGenerator (jax's "rbg" keys, seeded from the given key)."""
  def words(rng, shape):
    seed = jax.random.bits(rng, (4,), jnp.uint32)
    return jax.random.bits(jax.random.wrap_key_data(seed, impl="rbg"), shape, jnp.uint32)
  return _words_from(words)


def _rbg_over_a_mesh() -> None:
  """The words each device draws for a mask of [64, 128, 384] split over the devices' batch:
  threefry draws its share (the largest array is its words split in halves), XLA's
  RngBitGenerator the whole."""
  from jax.sharding import NamedSharding, PartitionSpec
  from flax_encoder import dropout as module
  split = NamedSharding(jax.make_mesh((jax.device_count(),), ("data",)), PartitionSpec("data"))
  for name, context in (("threefry", contextlib.nullcontext()), ("RngBitGenerator", _rbg_bits())):
    with context:
      masked = jax.jit(lambda key, x: jnp.where(module.keep_mask(key, 0.1, x.shape), x, 0),
                       in_shardings=(None, split), out_shardings=split)
      text = masked.lower(jax.random.key(0), jnp.ones((64, 128, 384))).compile().as_text()
    largest = max((int(np.prod([int(n) for n in m.split(",")]))
                   for m in re.findall(r"u32\[([\d,]+)\]", text)), default=0)
    print(f"{name:16s} over {jax.device_count()} devices: the largest array of words on each "
          f"holds {largest:,} (the whole mask's words: {64 * 128 * 384 // 2:,})")


def busy() -> None:
  """The training step and forward at 8x512 on both sides: wall time and cores busy."""
  import resource

  cfg = paper_base(dropout=0.1)
  jax_forward, jax_train, params, host_batches = jax_side(cfg, 8, 512)
  torch_forward, torch_train = torch_side(cfg, params, host_batches, compile_=False)
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
  levers = {"matmuls": matmuls, "qkv": qkv, "attention": attention,
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
