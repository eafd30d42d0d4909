r"""A Hugging Face encoder in Flax (`flax_encoder.families.load_hf`) against transformers' own
*ForMaskedLM: the same weights, the same batches, the masked-LM training step each runs.

  python -m benchmarks.hf --out benchmarks/results/hf.json     # BERT-base at 8x128: minutes
  python -m benchmarks.hf --family gte --out benchmarks/results/hf-gte.json   # GTE-base
  python -m benchmarks.hf --family deberta-v2 --out ...                       # DeBERTa-v3-base
  python -m benchmarks.hf --tiny [--family gte]                # a tiny one: seconds

The model is BERT-base's sizes (hidden 768, 12 layers, 12 heads, intermediate 3072, vocabulary
30522) in the `--family`'s transformers config (`bert`: `BertConfig()`, exact-erf GELU;
`gte`: gte-base-en-v1.5's architecture, rotary positions and GeGLU; `nomic_bert`:
nomic-embed-text's, SwiGLU without biases; `deberta-v2`: deberta-v3-base's, disentangled
attention over 256 position buckets) with random weights, built by transformers
(`AutoModelForMaskedLM.from_config`), saved with `save_pretrained` to a temporary directory
and read back by both sides: by `load_hf` on the Flax side, by `from_pretrained` on the
PyTorch side with `attn_implementation` "sdpa" (transformers' default) and "eager".

Sections:
  forward  the encoder's last_hidden_state (no pooler, no head): Flax `Encoder.apply` under
           jax.jit against `model.base_model(input_ids, attention_mask)` under
           torch.no_grad.
  train    one masked-LM step. Flax: the step `python -m train` runs further pretraining
           with (train.run.step.make_train_step over train.tasks.masked_lm.MaskedLMTask with BERT's
           head: masking drawn in the step, the encoder, the head's dense, GELU, LayerNorm and
           tied decoder at the predicted positions, cross-entropy there), jitted once, state
           donated. PyTorch: *ForMaskedLM(input_ids, labels=...).loss on the same masked
           ids (the head at every position, as transformers computes it), backward. Both
           AdamW (lr 1e-4, betas 0.9/0.999, eps 1e-8, weight decay 0.01: torch's defaults but
           the rate; decay on every parameter, biases and LayerNorms too, as both apply it
           without a mask), no clipping.

Dropout is off on both sides (torch eval mode, Flax deterministic), so that both compute the
same function; training with dropout costs both a little more. Each batch is `--size` random
ids; the Flax step masks round(0.15 seq) positions a row as BERT does (80% [MASK], 10% a
random id, 10% kept) from its step's key, and transformers gets the ids and labels that step
drew: the first four steps' batches, cycled through. Before timing, every implementation's
first step (batch 0, the same weights) must give Flax's loss to rtol 1e-4, and its second
(after one AdamW update) to rtol 1e-3; both are in the JSON.

Implementations: "flax" (jax.jit; attention_impl "reference", load_hf's default, or
`--attention xla`), "transformers sdpa", "transformers eager" (PyTorch eager
mode with each attention implementation) and the same through torch.compile ("... compiled";
`--no-compile`, or `--tiny`, leaves them out). float32 with full-precision matmuls on both
sides, torch.set_num_threads(os.cpu_count()), glibc malloc keeping freed memory for both
(train.run.host.keep_freed_memory, as benchmarks.bench and python -m train run). Timing is
benchmarks.bench's: warm-up, then repetitions interleaved across implementations after an
untimed 0.5 s pause each, medians.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import bench
from benchmarks.workload import flops_per_token
from flax_encoder import Encoder, EncoderConfig
from flax_encoder.families import load_hf
from flax_encoder.masked_lm import MaskedLM
from train.data.tokens import SpecialIds
from train.run.host import keep_freed_memory
from train.run.step import TrainState, make_train_step, step_keys
from train.tasks.masked_lm import MaskedLMTask, predictions_per_row

MASK_RATE = 0.15
N_BATCHES = 4
ADAMW = dict(learning_rate=1e-4, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)
ATTENTIONS = ("sdpa", "eager")  # transformers' attn_implementation; "sdpa" is its default
# transformers.BertConfig()'s sizes, spelled out for the builders that do without transformers.
BERT_BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512)
TINY = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=37, max_position_embeddings=64)
MASK_ID, SEP_ID = 103, 102  # bert-base-uncased's [MASK] and [SEP]
FIRST_ID = 1000  # random ids from here: no [PAD], [CLS], [SEP] or [MASK] among them


# ---------------------------------------------------------------------------------------------
# The model and the batches


FAMILIES = {"bert": "BertConfig", "gte": "GteConfig", "nomic_bert": "NomicBertConfig",
            "deberta-v2": "DebertaV2Config"}
# deberta-v3-base's settings beside BERT-base's sizes
DEBERTA_V3 = dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=256,
                  max_relative_positions=512, share_att_key=True, norm_rel_ebd="layer_norm",
                  position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7)


def bert_config(tiny: bool = False, family: str = "bert", **overrides):
  """`family`'s transformers config (FAMILIES) of BERT-base's sizes, or a tiny one."""
  import transformers
  sizes = TINY if tiny else BERT_BASE
  if family in ("gte", "nomic_bert"):  # positions are rotary: no table, no cap but the config's
    sizes = {**sizes, "max_position_embeddings": 8192, "pad_token_id": 0}
  if family == "deberta-v2":
    sizes = {**sizes, **DEBERTA_V3}
  return getattr(transformers, FAMILIES[family])(**sizes, **overrides)


def save_random_bert(config, directory: str) -> str:
  """A *ForMaskedLM of `config` with transformers' random initialisation (seed 0), saved
  with save_pretrained to `directory`."""
  import torch
  import transformers
  torch.manual_seed(0)
  transformers.AutoModelForMaskedLM.from_config(config).save_pretrained(directory)
  return directory


def vocab_size_of(directory: str) -> int:
  """The vocab_size of the model directory's config.json."""
  with open(os.path.join(directory, "config.json")) as f:
    return json.load(f)["vocab_size"]


def token_rows(vocab_size: int, batch: int, seq: int, n: int = N_BATCHES,
               seed: int = 0) -> list[np.ndarray]:
  """`n` batches of random ids int32 [batch, seq], none of them a special id."""
  rng = np.random.default_rng(seed)
  first = _first_id(vocab_size)
  return [rng.integers(first, vocab_size, (batch, seq)).astype(np.int32) for _ in range(n)]


def _first_id(vocab_size: int) -> int:
  return FIRST_ID if vocab_size > 2 * FIRST_ID else 1


def special_ids(vocab_size: int) -> SpecialIds:
  """bert-base-uncased's padding, [MASK] and [SEP], the random ids' first as the first text
  id (a tiny vocabulary's [MASK] is its last id)."""
  return SpecialIds(pad=0, mask=min(MASK_ID, vocab_size - 1), separator=SEP_ID % vocab_size,
                    first_token=_first_id(vocab_size))


def train_flops_per_token(config: EncoderConfig, seq: int) -> float:
  """The standard count (benchmarks.workload.flops_per_token) with the head's decoder at every
  position, plus its d x d transform."""
  return flops_per_token(config, seq, train=True, predicted=1.0) + 6 * config.d_model**2


# ---------------------------------------------------------------------------------------------
# The two sides. Each runner takes the next of the batches in turn; train runners return the
# step's loss as a float.


def flax_side(directory: str, rows: list[np.ndarray], dtype: str = "float32",
              attention_impl: str = "reference"):
  """(config, forward runner, train runner, the masked batches its first steps draw) of
  load_hf(directory) in the program's masked-LM step. The batches, {"input_ids", "labels"
  (-100 where nothing is predicted)} as numpy arrays, are what transformers is given."""
  config, variables = load_hf(directory, dtype=dtype, attention_impl=attention_impl,
                              dropout=0.0, attention_dropout=0.0)
  seq = rows[0].shape[1]
  task = MaskedLMTask(MaskedLM(config, checkpoint_head=True), mask_rate=MASK_RATE,
                      predictions=predictions_per_row(MASK_RATE, seq), label_smoothing=0.0,
                      baseline_token=0, ids=special_ids(config.vocab_size))
  tx = optax.adamw(**ADAMW)
  params = jax.device_put({"encoder": variables["params"],
                           "masked_lm": variables["heads"]["masked_lm"]})
  rng = jax.random.PRNGKey(0)
  state = [TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params),
                      rng=rng)]
  step = jax.jit(make_train_step(task, tx, optax.constant_schedule(ADAMW["learning_rate"])),
                 donate_argnums=0)
  masked = [_for_transformers(jax.jit(task.batch)(r, step_keys(rng, k)[1]))
            for k, r in enumerate(rows)]
  encoder = Encoder(config)
  forward = jax.jit(lambda p, ids: encoder.apply({"params": p}, ids))
  forward_params = jax.device_put(variables["params"])  # the train state is donated
  next_forward = itertools.cycle([jax.device_put(b["input_ids"]) for b in masked]).__next__
  next_train = itertools.cycle([jax.device_put(r) for r in rows]).__next__

  def run_forward():
    forward(forward_params, next_forward()).block_until_ready()

  def run_train():
    state[0], metrics = step(state[0], next_train())
    return float(metrics["loss"])

  return config, run_forward, run_train, masked


def _for_transformers(batch: dict) -> dict:
  """The masked batch a step drew -> BertForMaskedLM's input_ids and labels."""
  batch = jax.device_get(batch)
  labels = np.full(batch["inputs"].shape, -100, np.int64)
  chosen = batch["weights"] > 0
  rows = np.nonzero(chosen)[0]
  labels[rows, batch["predict_at"][chosen]] = batch["targets"][chosen]
  return {"input_ids": np.asarray(batch["inputs"], np.int32), "labels": labels}


def torch_side(directory: str, batches: list[dict], attention: str, compile_: bool,
               dtype: str = "float32", device: str = "cpu", section: str = "train"):
  """A runner of `section` ("forward" or "train") for transformers' *ForMaskedLM read
  from `directory` with attn_implementation `attention`, through torch.compile if
  `compile_`, under bfloat16 autocast if `dtype` says so, on `batches` (flax_side's)."""
  import torch
  import transformers
  model = transformers.AutoModelForMaskedLM.from_pretrained(
      directory, attn_implementation=attention).to(device).eval()  # eval: no dropout
  tensors = [{"input_ids": torch.from_numpy(b["input_ids"]).long().to(device),
              "attention_mask": torch.ones(b["input_ids"].shape, dtype=torch.long,
                                           device=device),
              "labels": torch.from_numpy(b["labels"]).long().to(device)} for b in batches]
  next_batch = itertools.cycle(tensors).__next__
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  autocast = lambda: torch.autocast(device_type=device, dtype=torch.bfloat16,
                                    enabled=dtype == "bfloat16")
  if section == "forward":
    encoder = torch.compile(model.base_model) if compile_ else model.base_model

    def run_forward():
      b = next_batch()
      with torch.no_grad(), autocast():
        encoder(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
      sync()

    return run_forward
  optimizer = torch.optim.AdamW(model.parameters(), lr=ADAMW["learning_rate"],
                                betas=(ADAMW["b1"], ADAMW["b2"]), eps=ADAMW["eps"],
                                weight_decay=ADAMW["weight_decay"])
  trained = torch.compile(model) if compile_ else model

  def run_train():
    optimizer.zero_grad(set_to_none=True)
    with autocast():
      loss = trained(**next_batch()).loss
    loss.backward()
    optimizer.step()
    sync()
    return float(loss.detach())

  return run_train


# ---------------------------------------------------------------------------------------------
# Measuring


def implementations(compile_: bool, attentions=ATTENTIONS) -> list[tuple[str, str, bool]]:
  """(name, attn_implementation, compiled) of each PyTorch implementation."""
  impls = [(f"transformers {a}", a, False) for a in attentions]
  return impls + ([(f"transformers {a} compiled", a, True) for a in attentions]
                  if compile_ else [])


def attentions_of(directory: str) -> tuple[str, ...]:
  """The attn_implementations transformers has for the model of `directory`: DeBERTa's eager
  one alone."""
  return ("eager",) if json.load(open(os.path.join(directory, "config.json")))[
      "model_type"] == "deberta-v2" else ATTENTIONS


def check_losses(losses: dict[str, list[float]]) -> list[dict]:
  """Rows of each implementation's first two losses against Flax's; raises if step 0 differs
  by more than rtol 1e-4 or step 1 by more than 1e-3."""
  rows = []
  for name, ls in losses.items():
    rel = [abs(a - b) / abs(b) for a, b in zip(ls, losses["flax"])]
    rows.append({"impl": name, "loss_step0": ls[0], "loss_step1": ls[1],
                 "rel_diff_step0": rel[0], "rel_diff_step1": rel[1]})
    if rel[0] > 1e-4 or rel[1] > 1e-3:
      raise AssertionError(f"{name}'s losses {ls} differ from Flax's {losses['flax']} "
                           f"(relative {rel[0]:.1e}, {rel[1]:.1e}): not the same step")
  return rows


def _records(section: str, seconds: dict, batch: int, seq: int, flops: float) -> list[dict]:
  return [{"section": section, "impl": name, "batch": batch, "seq": seq,
           "ms": s * 1e3, "tokens_per_s": batch * seq / s, "flops_per_s": flops / s,
           "flax_over_this": seconds["flax"] / s} for name, s in seconds.items()]


def measure(directory: str, batch: int, seq: int, reps: int, warmup: int, compile_: bool,
            attention_impl: str = "reference") -> dict:
  """{"records": forward and train timings, "losses": check_losses' rows}, one section at a
  time (each section's models are freed before the next's are built)."""
  import torch
  rows = token_rows(vocab_size_of(directory), batch, seq)
  impls = implementations(compile_, attentions_of(directory))
  config, flax_forward, flax_train, batches = flax_side(directory, rows,
                                                        attention_impl=attention_impl)
  forward = {"flax": flax_forward}
  for name, attention, compiled in impls:
    forward[name] = torch_side(directory, batches, attention, compiled, section="forward")
  seconds = bench.interleaved(forward, reps, warmup)
  records = _records("forward", seconds, batch, seq,
                     flops_per_token(config, seq, train=False) * batch * seq)
  _report(records)
  del forward, flax_forward
  train = {"flax": flax_train}
  for name, attention, compiled in impls:
    train[name] = torch_side(directory, batches, attention, compiled)
  losses = {name: [run(), run()] for name, run in train.items()}  # also compiles
  loss_rows = check_losses(losses)
  seconds = bench.interleaved(train, reps, warmup)
  train_records = _records("train", seconds, batch, seq,
                           train_flops_per_token(config, seq) * batch * seq)
  _report(train_records)
  torch.compiler.reset()
  return {"records": records + train_records, "losses": loss_rows}


def ratios(records: list[dict]) -> dict:
  """{section: {"flax / <impl>": time ratio}} and, per section, Flax against the faster of
  transformers' eager-mode (uncompiled) implementations."""
  out = {}
  for section in ("forward", "train"):
    rows = {r["impl"]: r for r in records if r["section"] == section}
    out[section] = {f"flax / {name}": r["flax_over_this"] for name, r in rows.items()
                    if name != "flax"}
    best = min((r["ms"], name) for name, r in rows.items()
               if name.startswith("transformers") and not name.endswith("compiled"))
    out[section]["flax / best transformers eager mode"] = rows["flax"]["ms"] / best[0]
  return out


def _report(records: list[dict]) -> None:
  for r in records:
    print(f"{r['section']:8s} {r['batch']}x{r['seq']:<5d} {r['impl']:30s} {r['ms']:9.1f} ms"
          f"  flax/this {r['flax_over_this']:.2f}", file=sys.stderr, flush=True)


def environment() -> dict:
  import transformers
  return {**bench.environment(), "transformers": transformers.__version__}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.hf", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--size", default=None, help="batch x seq (default 8x128; 2x16 tiny)")
  parser.add_argument("--family", default="bert", choices=tuple(FAMILIES),
                      help="the transformers family of the model (default bert)")
  parser.add_argument("--tiny", action="store_true",
                      help="a tiny model, no torch.compile, 2 repetitions: seconds")
  parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
  parser.add_argument("--attention", default="reference", choices=("reference", "xla"),
                      help="the Flax side's attention_impl (default: load_hf's)")
  parser.add_argument("--reps", type=int, default=None, help="default 10 (2 tiny)")
  parser.add_argument("--warmup", type=int, default=None, help="default 2 (1 tiny)")
  parser.add_argument("--out", default=None, help="results JSON (default: print only)")
  args = parser.parse_args(argv)
  size = args.size or ("2x16" if args.tiny else "8x128")
  batch, seq = (int(x) for x in size.split("x"))
  reps = args.reps or (2 if args.tiny else 10)
  warmup = args.warmup or (1 if args.tiny else 2)
  compile_ = not (args.no_compile or args.tiny)

  malloc = "keep" if keep_freed_memory() else "default (not glibc)"
  import torch
  import transformers
  transformers.utils.logging.disable_progress_bar()
  torch.set_num_threads(os.cpu_count())
  jax.config.update("jax_default_matmul_precision", "highest")
  config = bert_config(args.tiny, args.family)
  load_before = os.getloadavg()
  with tempfile.TemporaryDirectory() as directory:
    save_random_bert(config, directory)
    measured = measure(directory, batch, seq, reps, warmup, compile_, args.attention)
  # Other processes on a small machine slow both sides, PyTorch's spinning threads the more.
  load = {"load_average_before": load_before, "load_average_after": os.getloadavg(),
          "malloc": malloc}
  results = {"environment": {**environment(), **load}, "dtype": "float32", "size": size,
             "flax_attention": args.attention, "reps": reps, "warmup": warmup,
             "dropout": "off on both sides (torch eval mode, flax deterministic)",
             "family": args.family,
             "bert_config": {k: v for k, v in config.to_dict().items()
                             if isinstance(v, (int, float, str))},
             **measured, "ratios": ratios(measured["records"])}
  for section, rs in results["ratios"].items():
    print(f"{section}: " + ", ".join(f"{k} {v:.2f}" for k, v in rs.items()), file=sys.stderr)
  if args.out:
    bench.write_results(args.out, results)
  return 0


if __name__ == "__main__":
  sys.exit(main())
