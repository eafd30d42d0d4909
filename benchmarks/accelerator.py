r"""One command that checks the whole program on the accelerator JAX sees, and measures it.

  python -m benchmarks.accelerator --out DIR                  # every part, about 25 minutes
  python -m benchmarks.accelerator --out DIR --parts parity,attention
  python -m benchmarks.accelerator --out DIR --tiny           # tiny sizes, on any machine

Parts, in this order, each in a process of its own with a time limit (a part that fails or
runs out of time is recorded and the next one runs); DIR/results.json, DIR/results.md and
DIR/log.txt are written again as each part ends:

  environment  the device; jax, jaxlib, flax, optax, orbax, torch, CUDA and cuDNN versions
  suite        the library's tests with JAX on the accelerator, then the whole test suite with
               JAX on this machine's CPU (its Python and packages)
  parity       the Flax encoder against the PyTorch port, both on the accelerator, float32 with
               full-precision matmuls on both sides (no TF32), every stage; then bfloat16
               compute against float32, every stage
  train_step   the training step python -m train runs (benchmarks/workload.py), paper-base
               size, bfloat16 compute with float32 parameters, at 64x512 and 256x128, against
               the PyTorch port under torch.compile with bfloat16 autocast on the same weights
               and batches: tokens/s, MFU against the device's dense bf16 peak and against a
               large matmul measured here
  bert         BERT-base read by load_hf (benchmarks/hf.py's masked-LM step: encoder, BERT's
               head at every position, AdamW), bfloat16 compute, at 256x128 and 64x512,
               against transformers' BertForMaskedLM under torch.compile (sdpa, bfloat16
               autocast) on the same weights and batches: tokens/s, MFU; the transformers
               side is skipped, with a note, where torch has no CUDA or transformers is missing
  embed        sentence embeddings (benchmarks/accelerator_embed.py): SentenceEncoder, bfloat16,
               texts packed, against SentenceTransformer.encode (float16, sdpa) at batch 32,
               128 and 512, on 8,192 pydoc paragraphs, for a random MiniLM-L6-sized and a
               BERT-base-sized BERT (each in a process of its own): sentences/s and real
               tokens/s; the vectors checked first (min cosine >= 0.99); sentence-transformers'
               side skipped, with a note, where torch has no CUDA or it is not installed; and
               ours with the dense layers in int8 (quantized("int8"): qwix, the wheels' own),
               its least cosine to ours in bfloat16
  contrastive  the training step of configs/embed.py (contrastive, packed pairs, AdamW) at
               BERT-base size, bfloat16 compute, 256 made-up pairs at seq_len 128, GradCache
               off and on: pairs/s, MFU against the measured matmul and the datasheet peak
  retrieval    Reranker, SparseEncoder and MultiVectorEncoder (bfloat16, packed) at BERT-base
               size on 2,048 pydoc paragraphs, against sentence-transformers' CrossEncoder,
               SparseEncoder and MultiVectorEncoder (float16, batch 32) where it is installed:
               texts/s (pairs/s for the reranker)
  attention    reference, xla and cudnn attention: max error against float32, forward and
               backward time, at 512 and 2048 tokens with padding
  long         one sliding-window layer of ModernBERT-base's shape at 8,192 tokens, bfloat16
               (benchmarks/long_sequence.py): the windowed path that builds no [seq, seq]
               array against the full mask by XLA and by cuDNN: forward+backward time and
               the compiled program's temporaries
  big          the big model with scanned layers, remat none, full and save_dots: step time
               and peak memory
  train_run    python -m train --config=configs/base.py for 2 minutes on the built-in data:
               tokens/s and data_wait_fraction
  profile      a JAX profiler trace of 3 training steps at 64x512 and its top kernels

Without an accelerator (or with --tiny) every part runs at tiny sizes on the CPU in two to three
minutes, and the suite part is skipped: tests/test_accelerator.py runs it so, so that it keeps
working. BENCHMARKS.md ("GPU") has the recipe for a lent GPU machine and its figures.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (part, variant, seconds allowed on an accelerator); tiny runs get a fraction of that.
JOBS = (("environment", None, 90), ("suite", None, 360), ("parity", None, 150),
        ("train_step", None, 330), ("bert", None, 420),
        ("embed", "minilm", 180), ("embed", "base", 240), ("contrastive", None, 300),
        ("retrieval", None, 240),
        ("attention", None, 180),
        ("long", None, 150),
        ("big", "none", 120), ("big", "full", 120), ("big", "save_dots", 120),
        ("train_run", None, 200), ("profile", None, 150))
PARTS = tuple(dict.fromkeys(part for part, _, _ in JOBS))
TINY_LIMIT_S = 120  # on a quiet machine of 4 cores or more; scaled up for fewer or busier



def tiny_limit_s() -> float:
  """TINY_LIMIT_S scaled by how much slower this machine is than 4 free cores: by its cores
  and its load (a tiny part took 111 s on a quiet 2-core machine, more on a loaded one)."""
  cores = os.cpu_count() or 1
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
  return TINY_LIMIT_S * max(1.0, 4 / cores) * max(1.0, (load + 1) / cores)


# ---------------------------------------------------------------------------------------------
# The parts. Each returns {"rows": [dict, ...], "notes": [str, ...]} and runs in its own
# process (`--part`), so that a crash or a hang in one costs only that one.


def environment(tiny: bool, variant=None) -> dict:
  import flax
  import jax
  import jaxlib
  import optax
  import orbax.checkpoint
  device = jax.devices()[0]
  rows = [("backend", jax.default_backend()), ("device", device.device_kind),
          ("devices", jax.device_count()), ("python", platform.python_version()),
          ("jax", jax.__version__), ("jaxlib", jaxlib.__version__), ("flax", flax.__version__),
          ("optax", optax.__version__), ("orbax-checkpoint", orbax.checkpoint.__version__)]
  try:
    from jax._src.lib import cuda_versions  # noqa: PLC0415 - present with the CUDA plugin only
    rows += [("CUDA runtime (jax)", cuda_versions.cuda_runtime_get_version()),
             ("cuDNN (jax)", cuda_versions.cudnn_get_version())]
  except (ImportError, AttributeError, RuntimeError):
    rows.append(("CUDA (jax)", "none"))
  try:
    import torch
    rows += [("torch", torch.__version__), ("CUDA (torch)", torch.version.cuda),
             ("cuDNN (torch)", torch.backends.cudnn.version() if torch.cuda.is_available()
              else None)]
  except ImportError:
    rows.append(("torch", "not installed"))
  try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                          "clocks.max.sm", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=20, check=False).stdout.strip()
    rows.append(("nvidia-smi", smi or "no GPU"))
  except (OSError, subprocess.TimeoutExpired):
    rows.append(("nvidia-smi", "not found"))
  return {"rows": [{"what": k, "value": str(v)} for k, v in rows], "notes": []}


def suite(tiny: bool, variant=None, limit_s: float = 340) -> dict:
  if tiny:
    return {"rows": [], "notes": ["skipped: no accelerator (the suite runs as it always does)"]}
  deadline = time.monotonic() + limit_s
  rows = []
  for name, env, args in (
      # The tests marked `library` (flax_encoder alone; float32 matmuls pinned to full
      # precision by tests/conftest.py); the rest of the suite tests the program on the CPU.
      ("library tests, JAX on the accelerator", {}, ["tests", "-m", "library"]),
      ("whole suite, JAX on the CPU", {"JAX_PLATFORMS": "cpu"},
       ["tests", "--ignore=tests/test_accelerator.py"])):
    remaining = deadline - time.monotonic()
    if remaining < 30:
      rows.append({"run": name, "result": "not run: out of time"})
      continue
    start = time.monotonic()
    try:
      result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p",
                               "no:cacheprovider", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=remaining, env={**os.environ, **env},
                              check=False)
      lines = [x for x in result.stdout.splitlines() if x.strip()]
      summary = lines[-1] if lines else result.stderr[-300:]
      failures = [x for x in lines if x.startswith(("FAILED", "ERROR"))][:5]
    except subprocess.TimeoutExpired as e:
      out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
      summary = f"timed out; {out.count('.')} tests had passed"
      failures = []
    rows.append({"run": name, "result": summary, "seconds": round(time.monotonic() - start),
                 "failures": "; ".join(failures)})
  return {"rows": rows, "notes": ["the whole suite with JAX on the CPU tests the program on "
                                  "this machine's Python and packages; tests/test_multiprocess "
                                  "simulates its devices on the CPU either way"]}


def _paper_cfg(tiny: bool, **overrides):
  import dataclasses

  from benchmarks.workload import paper_base
  cfg = paper_base(**overrides)
  if tiny:
    cfg = dataclasses.replace(cfg, d_model=32, n_heads=2, d_ff=64, n_layers=2, vocab_size=300)
  return cfg


def _best_attention() -> str:
  import jax
  return "cudnn" if jax.default_backend() == "gpu" else "xla"


def parity(tiny: bool, variant=None) -> dict:
  import dataclasses

  import jax
  import torch

  from flax_encoder.pytorch import parity as report
  from flax_encoder.pytorch import reference
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  cfg = _paper_cfg(tiny, dropout=0.0)
  device = "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"
  torch.manual_seed(0)
  module = reference.Encoder(cfg).to(device)
  tokens = report.random_tokens(cfg, 4, 32 if tiny else 128, seed=0)
  rows, _ = report.compare_module(module, cfg, tokens, prefix=None)
  # The Flax encoder in bfloat16 (float32 parameters) against the same float32 PyTorch run.
  bf16 = {r.name: r for r in report.compare_module(
      module, dataclasses.replace(cfg, dtype="bfloat16"), tokens, prefix=None)[0]}
  table = [{"stage": r.name, "float32 max abs err": f"{r.max_abs:.2e}",
            "float32 max rel err": f"{r.max_rel:.2e}", "passes": r.passes(1e-5, 1e-4),
            "bfloat16 max rel err": f"{bf16[r.name].max_rel:.2e}"} for r in rows]
  worst = max(rows, key=lambda r: r.max_rel)
  return {"rows": table, "notes": [
      f"{device}: {cfg.n_layers} layers, d_model {cfg.d_model}, tokens {list(tokens.shape)}, "
      f"PyTorch's N(0, 1) embedding; worst float32 relative error {worst.max_rel:.2e} at "
      f"{worst.name} (target 1e-5); 'passes' is the parity report's rule, max abs err <= "
      f"1e-5 + 1e-4 * max|PyTorch value|; relative errors are max abs err / max|PyTorch value|"]}


def _speed_row(batch: int, seq: int, impl: str, seconds: dict, flops: float, measured: float,
               nominal: float | None, other: str) -> dict:
  """A results row of `impl`'s step time (`seconds[impl]`, of `flops`): tokens/s, MFU
  against the measured matmul and the datasheet peak, and its speed against `other`'s."""
  s = seconds[impl]
  row = {"batch x seq": f"{batch}x{seq}", "impl": impl, "ms": round(s * 1e3, 2),
         "tokens/s": round(batch * seq / s), "MFU (measured matmul)": f"{flops / s / measured:.1%}"}
  if nominal:
    row["MFU (datasheet peak)"] = f"{flops / s / nominal:.1%}"
  if other in seconds:
    row[f"tokens/s vs {other}"] = f"{seconds[other] / s:.2f}x"
  return row


def train_step(tiny: bool, variant=None) -> dict:
  import jax

  from benchmarks.bench import interleaved, matmul_peak
  from benchmarks.workload import flops_per_token, jax_side, predictions, torch_side
  from train.run.throughput import device_peak
  cfg = _paper_cfg(tiny, dtype="bfloat16", attention_impl=_best_attention())
  device = jax.devices()[0].device_kind
  on_gpu = jax.default_backend() == "gpu"
  sizes = ((8, 32),) if tiny else ((64, 512), (256, 128))
  # The JAX step timed before torch is imported too: on an H200 it ran at a fifth of
  # torch.compile's speed beside torch, while a model 4x larger alone (part big) ran at 168
  # TFLOP/s. Both rows tell whether sharing the process with torch is what costs.
  sides = {size: jax_side(cfg, *size) for size in sizes}  # compiled once, timed twice
  alone = {size: interleaved({"jax": side[1]}, reps=3 if tiny else 10, warmup=2)["jax"]
           for size, side in sides.items()}
  peak = matmul_peak("bfloat16", sizes=(64,) if tiny else (8192,), reps=3)
  measured = max(r["flops_per_s"] for r in peak if r["impl"] == "jax")
  nominal = device_peak(device)
  rows = []
  notes = [f"{device}; attention {cfg.attention_impl}; bfloat16 matmul measured "
           + ", ".join(f"{r['impl']} {r['flops_per_s'] / 1e12:.1f} TFLOP/s" for r in peak)
           + (f"; datasheet dense bf16 peak {nominal / 1e12:.0f} TFLOP/s" if nominal else "")]
  for batch, seq in sizes:
    _, jax_train, params, host_batches = sides[batch, seq]
    runners = {"jax": jax_train}
    # Tiny runs compare with PyTorch eager: inductor alone takes minutes to compile a step on
    # a small CPU, and what the tiny run guards is this script, not torch.compile.
    other = "torch" if tiny else "torch.compile"
    if jax.default_backend() in ("gpu", "cpu"):
      try:
        _, torch_train = torch_side(cfg, params, host_batches, compile_=not tiny)
        torch_train()  # compiles here, so that a failure is noted, not fatal
        runners[other] = torch_train
      except Exception as e:  # noqa: BLE001 - torch.compile's failures are many and varied
        notes.append(f"{other} at {batch}x{seq} failed: {type(e).__name__}: {str(e)[:200]}")
    seconds = interleaved(runners, reps=3 if tiny else 10, warmup=2)
    seconds["jax, before torch was imported"] = alone[batch, seq]
    flops = flops_per_token(cfg, seq, train=True, predicted=predictions(seq) / seq) * batch * seq
    rows += [_speed_row(batch, seq, impl, seconds, flops, measured, nominal, other)
             for impl in seconds]
  if not on_gpu and not tiny:
    notes.append("torch.compile runs on the CPU here: the comparison is a GPU one")
  return {"rows": rows, "notes": notes}


def _bert_directory(directory: str, tiny: bool) -> str:
  """BERT-base (or benchmarks/hf.py's tiny BERT) with Flax's random initialisation, saved as
  a transformers directory (config.json, model.safetensors): transformers, which GPU images
  often lack, is needed for its own side only."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  from safetensors.numpy import save_file

  from benchmarks import hf
  from flax_encoder import Encoder
  from flax_encoder.heads import MaskedLMHead
  from flax_encoder.families import config_from_hf, hf_config, to_hf_state_dict
  config = config_from_hf({"model_type": "bert", **(hf.TINY if tiny else hf.BERT_BASE)})
  encoder_key, head_key = jax.random.split(jax.random.key(0))
  params = nn.unbox(Encoder(config).init(encoder_key, jnp.ones((1, 8), jnp.int32))["params"])
  head = nn.unbox(MaskedLMHead(config).init(head_key, jnp.zeros((1, 8, config.d_model)),
                                            params["embedding"]["embedding"])["params"])
  state = to_hf_state_dict({"params": params, "heads": {"masked_lm": head}}, config, "bert",
                           prefix="bert.")
  save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf_config(config, "bert", architectures=["BertForMaskedLM"]), f)
  return directory


def _bert_torch_device() -> tuple[str | None, str]:
  """(where transformers' side runs, or None, and a note saying why not)."""
  import importlib.util

  import jax
  missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
  if missing:
    return None, f"transformers' side skipped: {' and '.join(missing)} not installed"
  import torch
  if jax.default_backend() == "cpu":
    return "cpu", "tiny sizes on the CPU: transformers eager, not compiled"
  if jax.default_backend() != "gpu":
    return None, f"transformers' side skipped: JAX runs on {jax.default_backend()}, not a GPU"
  if not torch.cuda.is_available():
    return None, f"transformers' side skipped: torch {torch.__version__} has no CUDA"
  return "cuda", ""


def bert(tiny: bool, variant=None) -> dict:
  """BERT-base's masked-LM step (benchmarks/hf.py) in bfloat16, Flax against transformers."""
  # JAX takes 75% of a GPU by default; transformers' side needs room beside it.
  os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")
  import jax

  from benchmarks import hf
  from benchmarks.bench import interleaved, matmul_peak
  from train.run.throughput import device_peak
  device = jax.devices()[0].device_kind
  peak = matmul_peak("bfloat16", sizes=(64,) if tiny else (8192,), reps=3)
  measured = max(r["flops_per_s"] for r in peak if r["impl"] == "jax")
  nominal = device_peak(device)
  torch_device, why = _bert_torch_device()
  other = "transformers" if tiny or torch_device != "cuda" else "transformers compiled"
  rows, notes = [], [f"{device}; Flax attention {_best_attention()}; bfloat16 compute, float32 "
                     f"parameters (transformers: bfloat16 autocast, sdpa attention)", why]
  with tempfile.TemporaryDirectory() as directory:
    _bert_directory(directory, tiny)
    for batch, seq in ((4, 32),) if tiny else ((256, 128), (64, 512)):
      ids = hf.token_rows(hf.vocab_size_of(directory), batch, seq)
      config, _, flax_train, batches = hf.flax_side(directory, ids, "bfloat16",
                                                    _best_attention())
      runners, first = {"flax": flax_train}, {}
      if torch_device:
        try:
          torch_train = hf.torch_side(directory, batches, "sdpa", other.endswith("compiled"),
                                      "bfloat16", torch_device)
          # Both on batch 0 from the same weights (and compiled here, outside the timing).
          first = {"flax": flax_train(), other: torch_train()}
          runners[other] = torch_train
        except Exception as e:  # noqa: BLE001 - torch.compile's failures are many and varied
          notes.append(f"{other} at {batch}x{seq} failed: {type(e).__name__}: {str(e)[:200]}")
      seconds = interleaved(runners, reps=3 if tiny else 10, warmup=2)
      flops = hf.train_flops_per_token(config, seq) * batch * seq
      for impl in seconds:
        row = _speed_row(batch, seq, impl, seconds, flops, measured, nominal, other)
        if other in seconds:
          row["first-step loss"] = round(first[impl], 4)
        rows.append(row)
  notes.append("masked-LM step of benchmarks/hf.py (Flax: the program's step, BERT's head at "
               "the masked 15%; transformers: BertForMaskedLM, its head at every position; "
               "AdamW), dropout off; MFU counts transformers' work, 6 (N_matmul + d vocab + "
               "d^2) + 12 L d seq flops a token; random weights from Flax's init")
  return {"rows": rows, "notes": notes}


def embed(tiny: bool, variant: str | None = None) -> dict:
  """Sentence embeddings, SentenceEncoder against sentence-transformers; `variant`: one model
  of accelerator_embed.EMBED_MODELS (a process of its own), or None for each in turn."""
  # JAX takes 75% of a GPU by default; sentence-transformers' side needs room beside it.
  os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")
  from benchmarks import accelerator_embed
  if tiny:
    accelerator_embed.quick_cpu_compiles()
  return accelerator_embed.embed(tiny, variant, _best_attention())


def contrastive(tiny: bool, variant=None) -> dict:
  """The contrastive training step (configs/embed.py) at BERT-base size, GradCache off and on."""
  from benchmarks import accelerator_embed
  if tiny:
    accelerator_embed.quick_cpu_compiles()
  return accelerator_embed.contrastive(tiny, _best_attention())


def retrieval(tiny: bool, variant=None) -> dict:
  """Rerankers, SPLADE and ColBERT models at BERT-base size against sentence-transformers'."""
  os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")
  from benchmarks import accelerator_embed
  if tiny:
    accelerator_embed.quick_cpu_compiles()
  return accelerator_embed.retrieval(tiny, _best_attention())


def attention(tiny: bool, variant=None) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from benchmarks.bench import interleaved
  from flax_encoder.kernels import KERNELS
  from flax_encoder.reference_attention import scaled_dot_product_attention
  impls = [k.name for k in KERNELS.values() if k.backend in (None, jax.default_backend())]
  heads, head_dim = (2, 16) if tiny else (8, 64)
  rows = []
  for seq, batch in ((64, 2), (128, 2)) if tiny else ((512, 8), (2048, 2), (8192, 1)):
    rng = np.random.default_rng(seq)
    q, k, v = (rng.standard_normal((batch, seq, heads, head_dim)).astype(np.float32)
               for _ in range(3))
    lengths = rng.integers(seq * 3 // 4, seq + 1, batch)  # right padding, a quarter at most
    real = np.arange(seq)[None, :] < lengths[:, None]
    mask = jnp.asarray(real)[:, None, None, :]
    segments = jnp.asarray(real, jnp.int32)  # what the segment kernels take instead
    with jax.default_matmul_precision("highest"):
      expected = np.asarray(jax.jit(lambda q, k, v: scaled_dot_product_attention(
          q, k, v, mask)[0])(q, k, v))
    q16, k16, v16 = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    cotangent = jnp.asarray(rng.standard_normal(q.shape), jnp.bfloat16)
    runners, errors = {}, {}
    for impl in impls:
      kernel = KERNELS[impl]
      if kernel.takes_segment_ids:
        fn = lambda q, k, v, kernel=kernel: kernel.function(q, k, v, segments)
      elif kernel.has_dropout:  # the reference, which returns its weights too
        fn = lambda q, k, v, kernel=kernel: kernel.function(q, k, v, mask)[0]
      else:
        fn = lambda q, k, v, kernel=kernel: kernel.function(q, k, v, mask)
      errors[impl] = float(np.abs(np.asarray(jax.jit(fn)(q16, k16, v16), np.float32)
                                  - expected)[real].max())  # padding queries mean nothing
      grad = jax.jit(jax.grad(lambda q, k, v, fn=fn: jnp.sum(
          (fn(q, k, v) * cotangent).astype(jnp.float32)), argnums=(0, 1, 2)))
      runners[impl] = lambda grad=grad: jax.block_until_ready(grad(q16, k16, v16))
    seconds = interleaved(runners, reps=3 if tiny else 20, warmup=2)
    for impl in impls:
      rows.append({"tokens": seq, "batch": batch, "impl": impl,
                   "max abs err vs float32": f"{errors[impl]:.2e}",
                   "forward+backward ms": round(seconds[impl] * 1e3, 3)})
  return {"rows": rows, "notes": [f"bfloat16 q, k, v [batch, tokens, {heads} heads, {head_dim}], "
                                  f"keys padded from a random length in [3/4, 1] of the row; "
                                  f"the float32 reference at full precision"]}


def long(tiny: bool, variant=None) -> dict:
  from benchmarks.long_sequence import measure
  rows = measure([256] if tiny else [8192], "float32" if tiny else "bfloat16",
                 reps=2 if tiny else 10, tiny=tiny)
  return {"rows": rows, "notes": [
      "one local layer (window 128, ModernBERT-base shape), one row, forward+backward; "
      "cuDNN's own sliding window is one-sided or causal, so on cudnn the symmetric window "
      "is a mask, and attention_impl='cudnn' runs its local layers by the windowed path"]}


def big(tiny: bool, variant: str | None = None) -> dict:
  """`variant`: one remat policy (a process of its own, for its own peak memory), or None for
  all three in this process (tiny runs)."""
  import dataclasses

  import jax

  from benchmarks.bench import interleaved
  from benchmarks.workload import VOCAB_SIZE, jax_side
  from flax_encoder import EncoderConfig
  rows = []
  for remat in [variant] if variant else ["none", "full", "save_dots"]:
    cfg = EncoderConfig.big(VOCAB_SIZE, max_len=512, dtype="bfloat16", scan_layers=True,
                            remat=remat, attention_impl=_best_attention())
    batch, seq = (4, 32) if tiny else (64, 512)
    if tiny:
      cfg = dataclasses.replace(cfg, d_model=32, n_heads=2, d_ff=64, vocab_size=300)
    _, train, _, _ = jax_side(cfg, batch, seq, steps_masked=1)
    seconds = interleaved({"step": train}, reps=3 if tiny else 10, warmup=2)["step"]
    temporaries = train.compiled().memory_analysis().temp_size_in_bytes
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    rows.append({"remat": remat, "batch x seq": f"{batch}x{seq}",
                 "step ms": round(seconds * 1e3, 2), "tokens/s": round(batch * seq / seconds),
                 "peak memory GB (device)": "n/a" if peak is None else round(peak / 1e9, 2),
                 "temporaries GB (compiled)": round(temporaries / 1e9, 3)})
  return {"rows": rows,
          "notes": ["big model (d_model 1024, 16 heads, d_ff 4096, 6 layers), scanned layers, "
                    "bfloat16; peak memory from memory_stats() of a process that ran one "
                    "variant alone"]}


def train_run(tiny: bool, variant=None, seconds: float = 120) -> dict:
  from train.run.metrics import read_metrics
  with tempfile.TemporaryDirectory() as workdir:
    if tiny:
      args = ["--config=configs/default.py", "--config.model.d_model=32",
              "--config.model.n_heads=2", "--config.model.d_ff=64", "--config.model.n_layers=1",
              "--config.train.num_steps=40", "--config.train.batch_size=16",
              "--config.train.log_every=10", "--config.train.eval_every=40",
              "--config.train.checkpoint_every=40"]
    else:
      args = ["--config=configs/base.py", "--config.train.num_steps=1000000",
              "--config.train.log_every=20", "--config.train.eval_every=1000000",
              "--config.train.checkpoint_every=1000000"]
    proc = subprocess.Popen([sys.executable, "-m", "train", f"--workdir={workdir}", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
      _, err = proc.communicate(timeout=None if tiny else seconds)
    except subprocess.TimeoutExpired:
      proc.send_signal(signal.SIGTERM)  # stops at the next step, saves, exits 143
      _, err = proc.communicate(timeout=120)
    records = [r for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))
               if r["split"] == "train"] if os.path.exists(
                   os.path.join(workdir, "metrics.jsonl")) else []
  if not records:
    raise RuntimeError(f"python -m train logged nothing (exit {proc.returncode}): {err[-800:]}")
  windows = records[1:] or records  # the first window holds the compilation
  memory_line = next((x for x in err.splitlines() if x.startswith("memory:")), "")
  return {"rows": [{"steps": records[-1]["step"], "exit code": proc.returncode,
                    "tokens/s (median of log windows)": round(statistics.median(
                        r["tokens_per_s"] for r in windows)),
                    "data_wait_fraction (median)":
                        f"{statistics.median(r['data_wait_fraction'] for r in windows):.4f}",
                    "final train loss": round(records[-1]["loss"], 3)}],
          "notes": [" ".join(args) + (f"; stopped by SIGTERM after {seconds:.0f} s" if not tiny
                                      else ""), memory_line]}


def profile(tiny: bool, variant=None) -> dict:
  import jax

  from benchmarks.workload import jax_side
  cfg = _paper_cfg(tiny, dtype="bfloat16", attention_impl=_best_attention())
  batch, seq = (8, 32) if tiny else (64, 512)
  _, train, _, _ = jax_side(cfg, batch, seq, steps_masked=1)
  train(), train()
  with tempfile.TemporaryDirectory() as directory:
    jax.profiler.start_trace(directory)
    for _ in range(3):
      train()
    jax.profiler.stop_trace()
    traces = sorted(glob.glob(f"{directory}/**/*.trace.json.gz", recursive=True))
    with gzip.open(traces[-1]) as f:
      events = json.load(f)["traceEvents"]
  names = {e["pid"]: e["args"]["name"] for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  devices = {pid for pid, name in names.items() if "device" in name.lower()}
  kernels, total = Counter(), 0.0
  for e in events:
    if e.get("ph") != "X" or (devices and e.get("pid") not in devices):
      continue
    kernels[e["name"]] += e.get("dur", 0) / 1e3 / 3
    total += e.get("dur", 0) / 1e3 / 3
  rows = [{"kernel": name[:90], "ms per step": round(ms, 3), "share": f"{ms / total:.1%}"}
          for name, ms in kernels.most_common(12)]
  where = "device" if devices else "host (no device timeline in the trace)"
  return {"rows": rows, "notes": [f"paper base, bfloat16, attention {cfg.attention_impl}, "
                                  f"{batch}x{seq}: {total:.1f} ms of {where} events per step"]}


# ---------------------------------------------------------------------------------------------
# The driver: one process per part, results rewritten as each part ends.


def _run_part(name: str, variant, tiny: bool, limit_s: float, log) -> dict:
  with tempfile.TemporaryDirectory() as directory:
    record = os.path.join(directory, "record.json")
    cmd = [sys.executable, "-m", "benchmarks.accelerator", "--part", name, "--record", record,
           "--limit", str(limit_s)]
    cmd += (["--variant", variant] if variant else []) + (["--tiny"] if tiny else [])
    start = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
      result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit_s,
                              env=env, check=False)
      output, status = result.stdout + result.stderr, (
          "ok" if result.returncode == 0 else f"failed (exit {result.returncode})")
    except subprocess.TimeoutExpired as e:
      output = "".join(x.decode() if isinstance(x, bytes) else (x or "")
                       for x in (e.stdout, e.stderr))
      status = f"timed out after {limit_s:.0f} s"
    log.write(f"===== {name} {variant or ''}: {status}\n{output}\n")
    log.flush()
    entry = {"part": name, "variant": variant, "status": status,
             "seconds": round(time.monotonic() - start, 1)}
    if os.path.exists(record):
      with open(record) as f:
        entry.update(json.load(f))
    elif status.startswith("failed"):
      entry["error"] = output.strip().splitlines()[-1][:500] if output.strip() else ""
    return entry


def markdown(results: dict) -> str:
  lines = [f"# Accelerator check ({results['mode']})", "",
           f"{results['started']}, {results['machine']}", ""]
  for entry in results["parts"]:
    title = entry["part"] + (f" ({entry['variant']})" if entry.get("variant") else "")
    lines += [f"## {title}: {entry['status']}, {entry['seconds']} s", ""]
    rows = entry.get("rows") or []
    if rows:
      columns = list(dict.fromkeys(k for r in rows for k in r))
      lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
      lines += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
      lines.append("")
    lines += [f"- {note}" for note in entry.get("notes", []) if note]
    if entry.get("error"):
      lines.append(f"- error: {entry['error']}")
    lines.append("")
  return "\n".join(lines)


def _probe() -> tuple[str, str]:
  """(JAX's default backend, its first device's kind), asked of a process of its own: this
  one holds no device while the parts run, each of which then has all of its memory (JAX
  preallocates 75% of a GPU in the first process that touches it)."""
  code = "import jax; print(jax.default_backend()); print(jax.devices()[0].device_kind)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True).stdout.split("\n")
  return out[0], out[1]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.accelerator", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", help="directory for results.json, results.md, log.txt")
  parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated, of " +
                      ", ".join(PARTS))
  parser.add_argument("--tiny", action="store_true",
                      help="tiny sizes (the default where JAX sees no accelerator)")
  parser.add_argument("--part", help=argparse.SUPPRESS)  # one part, in a process of its own
  parser.add_argument("--variant", help=argparse.SUPPRESS)
  parser.add_argument("--record", help=argparse.SUPPRESS)
  parser.add_argument("--limit", type=float, default=0, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.part:
    if args.tiny:  # tiny runs guard this script, not timings: no settling pauses
      from benchmarks import bench
      bench.PAUSE_S = 0.0
    kwargs = {"limit_s": args.limit - 20} if args.part == "suite" else {}
    record = globals()[args.part](args.tiny, args.variant, **kwargs)
    with open(args.record, "w") as f:
      json.dump(record, f, default=str)
    return 0
  if not args.out:
    parser.error("--out DIR is required")
  unknown = set(args.parts.split(",")) - set(PARTS)
  if unknown:
    parser.error(f"--parts: unknown {sorted(unknown)}; the parts are {', '.join(PARTS)}")
  backend, device = _probe()
  tiny = args.tiny or backend == "cpu"
  os.makedirs(args.out, exist_ok=True)
  results = {"mode": "tiny sizes" if tiny else f"on {device}",
             "machine": f"{platform.node()}, {os.cpu_count()} cores, {backend} ({device})",
             "started": time.strftime("%Y-%m-%d %H:%M"), "parts": []}
  wanted = args.parts.split(",")
  # Tiny runs measure each part's variants in one process: the three remat variants' peaks
  # mean nothing there, and the embedding models are tiny.
  jobs = {(n, None if tiny and n in ("big", "embed") else v): s for n, v, s in JOBS}
  with open(os.path.join(args.out, "log.txt"), "w") as log:
    for (name, variant), limit_s in jobs.items():
      if name not in wanted:
        continue
      print(f"{name} {variant or ''}...", file=sys.stderr, flush=True)
      entry = _run_part(name, variant, tiny, tiny_limit_s() if tiny else limit_s, log)
      results["parts"].append(entry)
      print(f"{name} {variant or ''}: {entry['status']} ({entry['seconds']} s)", file=sys.stderr,
            flush=True)
      with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
      with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(markdown(results))
  failed = [e["part"] for e in results["parts"] if e["status"] != "ok"]
  print(f"{len(results['parts']) - len(failed)} of {len(results['parts'])} parts ok"
        + (f"; not ok: {', '.join(failed)}" if failed else "")
        + f"; {os.path.join(args.out, 'results.md')}", file=sys.stderr)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
