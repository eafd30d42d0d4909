r"""Packed fine-tuning against transformers' training loop with dynamic padding: real (non-padding)
tokens per second of training a MiniLM-sized BERT to classify short texts.

  python -m benchmarks.finetune_packed --out benchmarks/results/finetune_packed.json  # minutes
  python -m benchmarks.finetune_packed --examples 0      # all 1139 texts: 3 times as long
  python -m benchmarks.finetune_packed --quick           # a tiny BERT on 96 texts: seconds

The texts are short and real: the prose paragraphs of the pydoc topics this checkout ships
(train/data/builtin/pydoc_topics.json.xz: Python's language reference, split at blank lines;
the indented code and grammar blocks and the headings' underlines left out, paragraphs of at
least 4 words kept: 1139), each labelled by its topic (78 classes). They are tokenized by a
WordPiece vocabulary of at most 8000 pieces trained on them with `tokenizers`
(benchmarks.hf_walkthrough.wordpiece: BERT's [CLS] text [SEP]), cut to 128 ids: a median of
40 ids, a mean of 48, 6% cut. `--examples` of them (default 384) are trained on, evenly spaced
through the file and in its order.

The model is transformers' BertForSequenceClassification with MiniLM's sizes (6 layers, hidden
384, 12 heads, intermediate 1536, vocabulary 30522) and its random initialisation, saved with
save_pretrained and read back by both sides (load_hf on ours: the encoder and BERT's pooler; the
classifier from its Linear). Every implementation trains on the same examples once over (one
epoch, none dropped), in batches of `--batch` examples, AdamW (lr 5e-5, betas 0.9/0.999, eps
1e-8, weight decay 0.01 on every parameter, as both apply it without a mask), dropout off on both
sides unless `--dropout` (so that both compute the same function), float32:

  ours packed    the step `python -m train --config=configs/classify.py --config.task.packed=True`
                 runs (train.run.step.make_train_step over train.tasks.classify.ClassifyTask, BERT's
                 pooler) on the rows train.data.examples.pack makes of the examples (first-fit, 16 a
                 row at most); rows per batch: `--batch` times the rows per example, rounded, so
                 that a batch holds `--batch` examples on average (the last batch filled up with
                 empty rows).
  ours padded    the same step on the examples one a row, padded to 128 (the unpacked layout).
  transformers   model(**batch).loss, backward, torch.optim.AdamW's step, zero_grad; each batch
                 padded to its longest example (DataCollatorWithPadding's dynamic padding).

Each implementation first runs `--warmup` untimed steps (compiling, for ours); then the epoch's
batches in `--rounds` groups, interleaved across the implementations (ours packed, ours padded,
transformers, ours packed, ...) each after an untimed pause. A figure is the real ids of the
epoch (the same for all three) over the summed time of its groups. Before timing, the first
batch's loss must agree across the three to rtol 1e-4 (the packed side on that batch's examples
packed alone), and is in the JSON. torch.set_num_threads(os.cpu_count()), glibc malloc keeping
freed memory for both (train.run.host.keep_freed_memory, as python -m train runs).
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import re
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import bench
from benchmarks.hf_walkthrough import wordpiece
from flax_encoder.classifier import SequenceClassifier, segments_per_row
from flax_encoder.families import load_hf
from train.data import examples
from train.run.host import keep_freed_memory
from train.run.step import TrainState, make_train_step
from train.tasks.classify import ClassifyTask

TOPICS = os.path.join(examples.BUILTIN_DIRECTORY, "pydoc_topics.json.xz")
ADAMW = dict(learning_rate=5e-5, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)
MINILM = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
              intermediate_size=1536, max_position_embeddings=512)
QUICK = dict(vocab_size=8000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=37, max_position_embeddings=128)
SEQ_LEN = 128
VOCABULARY = 8000


# ---------------------------------------------------------------------------------------------
# The examples


def paragraphs() -> tuple[list[str], list[str]]:
  """(texts, their topics): the prose paragraphs of the pydoc topics, in the topics' order."""
  with lzma.open(TOPICS) as f:
    topics = json.load(f)
  texts, labels = [], []
  for topic, text in topics.items():
    for paragraph in re.split(r"\n\s*\n", text):
      lines = [line for line in paragraph.splitlines()
               if line.strip() and not set(line.strip()) <= set("*=-~")]  # not an underline
      if not lines or lines[0].startswith(" "):  # a code or grammar block
        continue
      words = " ".join(lines).split()
      if len(words) >= 4:
        texts.append(" ".join(words))
        labels.append(topic)
  return texts, labels


def encoded(texts: list[str], labels: list[str]):
  """(each text's ids, [CLS] … [SEP] cut to SEQ_LEN; their class indices; the tokenizer)."""
  tokenizer, _ = wordpiece(texts, VOCABULARY)
  tokenizer.enable_truncation(SEQ_LEN)
  ids = [np.asarray(e.ids, np.int32) for e in tokenizer.encode_batch(texts)]
  classes = {label: i for i, label in enumerate(sorted(set(labels)))}
  return ids, np.asarray([classes[label] for label in labels], np.int32), tokenizer


def padded(ids: list[np.ndarray], length: int, rows: int | None = None) -> np.ndarray:
  """int32 [rows (default: one per example), length]: the examples' ids, then padding (0)."""
  out = np.zeros((rows or len(ids), length), np.int32)
  for i, row in enumerate(ids):
    out[i, :len(row)] = row
  return out


def packed_batches(ids: list, labels: np.ndarray, batch: int) -> tuple[list[dict], dict]:
  """The examples packed (train.data.examples.pack, as config.task.packed prepares them) into
  batches of rows holding `batch` examples on average; and what the packing came to."""
  segments = segments_per_row(SEQ_LEN)
  rows = examples.pack(ids, labels, SEQ_LEN, segments, 0, np.int32)
  n = len(rows["tokens"])
  per_batch = max(1, round(batch * n / len(ids)))
  fill = {"tokens": 0, "segments": 0, "labels": -1}
  out = []
  for start in range(0, n, per_batch):
    part = {k: v[start:start + per_batch] for k, v in rows.items()}
    short = per_batch - len(part["tokens"])
    part = {k: np.concatenate([v, np.full((short, *v.shape[1:]), fill[k], v.dtype)])
            for k, v in part.items()}
    out.append({"tokens": part["tokens"], "segment_ids": part["segments"].astype(np.int32),
                "labels": part["labels"]})
  real = sum(len(x) for x in ids)
  return out, {"rows": n, "max_segments": segments, "examples_per_row": len(ids) / n,
               "rows_per_batch": per_batch, "examples_per_batch": len(ids) / len(out),
               "fill": real / (n * SEQ_LEN)}


def example_batches(ids: list, labels: np.ndarray, batch: int) -> list[tuple[list, np.ndarray]]:
  """The examples in file order, `batch` at a time."""
  return [(ids[i:i + batch], labels[i:i + batch]) for i in range(0, len(ids), batch)]


# ---------------------------------------------------------------------------------------------
# The sides: each trains with a function of a batch that runs one step and returns its loss
# (a jax.Array or a torch tensor, not waited for).


def ours(directory: str, torch_model, num_labels: int, separator: int, dropout: float,
         attention: str, packed: bool):
  """The program's classification step on load_hf(directory) and the torch model's classifier
  (the same weights as transformers'); returns (step(batch) -> the step's loss, loss(batch) ->
  the loss before any update, a float). `separator`: [SEP], after which a pair's second text
  has token type 1, as a run from a BERT directory has them."""
  config, variables = load_hf(directory, dropout=dropout, attention_dropout=dropout,
                              attention_impl=attention)
  model = SequenceClassifier(config, num_labels, "pooler", separator,
                             segments_per_row(SEQ_LEN) if packed else None)
  task = ClassifyTask(model, label_smoothing=0.0, baseline_label=0)
  linear = torch_model.classifier
  params = jax.device_put({
      "encoder": variables["params"], "pooler": variables["heads"]["pooler"],
      "classifier": {"kernel": linear.weight.detach().numpy().T.copy(),
                     "bias": linear.bias.detach().numpy().copy()}})
  tx = optax.adamw(**ADAMW)
  state = [TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params),
                      rng=jax.random.PRNGKey(0))]
  step = jax.jit(make_train_step(task, tx, optax.constant_schedule(ADAMW["learning_rate"])),
                 donate_argnums=0)
  first_loss = jax.jit(lambda p, b: task.loss_sum(p, b, jax.random.PRNGKey(0)) /
                       task.loss_count(b))
  loss_of = lambda batch: float(first_loss(state[0].params, batch))

  def run(batch):
    state[0], metrics = step(state[0], batch)
    return metrics["loss"]

  return run, loss_of


def transformers_side(directory: str, dropout: float):
  """(the model, step(batch) -> loss): BertForSequenceClassification read from `directory`
  (attention by torch's scaled_dot_product_attention, transformers' default), trained as
  transformers' examples (run_glue_no_trainer.py) train it."""
  import torch
  import transformers
  model = transformers.BertForSequenceClassification.from_pretrained(
      directory, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
      attn_implementation="sdpa")
  model.train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=ADAMW["learning_rate"],
                                betas=(ADAMW["b1"], ADAMW["b2"]), eps=ADAMW["eps"],
                                weight_decay=ADAMW["weight_decay"])

  def run(batch):
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()

  return model, run


def torch_batch(ids: list, labels: np.ndarray) -> dict:
  """A batch as DataCollatorWithPadding gives it: padded to its longest example."""
  import torch
  tokens = padded(ids, max(len(x) for x in ids))
  return {"input_ids": torch.from_numpy(tokens).long(),
          "attention_mask": torch.from_numpy(tokens != 0).long(),
          "token_type_ids": torch.zeros(tokens.shape, dtype=torch.long),
          "labels": torch.from_numpy(labels).long()}


# ---------------------------------------------------------------------------------------------
# Measuring


def timed_epochs(runners: dict, rounds: int, warmup: int) -> dict:
  """{name: seconds} of each runner's batches, (run(batch), finish(result), batches), run in
  `rounds` groups interleaved across the runners after `warmup` untimed steps each."""
  for run, finish, batches in runners.values():
    for batch in batches[:warmup]:
      finish(run(batch))
  seconds = dict.fromkeys(runners, 0.0)
  for r in range(rounds):
    for name, (run, finish, batches) in runners.items():
      group = np.array_split(np.arange(len(batches)), rounds)[r]
      time.sleep(bench.PAUSE_S)
      start = time.perf_counter()
      result = None
      for i in group:
        result = run(batches[i])
      if result is not None:
        finish(result)
      seconds[name] += time.perf_counter() - start
  return seconds


def measure(quick: bool, batch: int, rounds: int, warmup: int, dropout: float,
            attention: str, count: int) -> dict:
  """The records of the three implementations on `count` of the texts (0: all), and what the
  data and the packing came to."""
  import torch
  import transformers
  texts, topics = paragraphs()
  ids, labels, tokenizer = encoded(texts, topics)  # the vocabulary of all of them
  if count:
    chosen = np.unique(np.linspace(0, len(ids) - 1, min(count, len(ids))).round().astype(int))
    ids, labels = [ids[i] for i in chosen], labels[chosen]
  lengths = np.asarray([len(x) for x in ids])
  num_labels = len(set(topics))
  sizes = QUICK if quick else MINILM
  config = transformers.BertConfig(**sizes, num_labels=num_labels)
  torch.manual_seed(0)
  with tempfile.TemporaryDirectory() as directory:
    transformers.BertForSequenceClassification(config).save_pretrained(directory)
    model, torch_run = transformers_side(directory, dropout)
    separator = tokenizer.token_to_id("[SEP]")
    packed_run, packed_loss = ours(directory, model, num_labels, separator, dropout, attention,
                                   packed=True)
    padded_run, padded_loss = ours(directory, model, num_labels, separator, dropout, attention,
                                   packed=False)

  packed, packing = packed_batches(ids, labels, batch)
  plain = example_batches(ids, labels, batch)
  padded_rows = [{"tokens": padded(i, SEQ_LEN, batch), "labels": _filled(l, batch)}
                 for i, l in plain]  # the last batch filled up with rows of no example
  torch_batches = [torch_batch(i, l) for i, l in plain]

  # The same first batch's loss on every side, before any update.
  first_ids, first_labels = plain[0]
  alone, _ = packed_batches(first_ids, first_labels, len(first_ids))
  with torch.no_grad():
    model.eval()
    theirs = float(model(**torch_batches[0]).loss)
    model.train()
  losses = {"ours packed": packed_loss(alone[0]), "ours padded": padded_loss(padded_rows[0]),
            "transformers": theirs}
  if dropout == 0:
    for name, loss in losses.items():
      if abs(loss - theirs) > 1e-4 * abs(theirs):
        raise AssertionError(f"{name}'s first loss {loss} differs from transformers' {theirs}: "
                             f"not the same step")

  block = lambda metrics: jax.block_until_ready(metrics)
  runners = {"ours packed": (packed_run, block, packed),
             "ours padded": (padded_run, block, padded_rows),
             "transformers": (torch_run, float, torch_batches)}
  seconds = timed_epochs(runners, rounds, warmup)
  real = int(lengths.sum())
  computed = {"ours packed": packing["rows"] * SEQ_LEN, "ours padded": len(ids) * SEQ_LEN,
              "transformers": sum(int(b["input_ids"].numel()) for b in torch_batches)}
  steps = {name: len(r[2]) for name, r in runners.items()}
  records = [{"impl": name, "seconds": s, "steps": steps[name],
              "ms_per_step": 1e3 * s / steps[name], "real_tokens": real,
              "computed_tokens": computed[name], "real_fraction": real / computed[name],
              "real_tokens_per_s": real / s, "examples_per_s": len(ids) / s}
             for name, s in seconds.items()]
  base = seconds["transformers"]
  for r in records:
    r["speed_over_transformers"] = base / r["seconds"]
  return {"records": records, "first_losses": losses,
          "data": {"source": "pydoc topics' prose paragraphs (train/data/builtin)",
                   "examples": len(ids), "classes": num_labels,
                   "tokenizer": f"WordPiece, {tokenizer.get_vocab_size()} pieces "
                                f"(tokenizers, trained on the texts)",
                   "seq_len": SEQ_LEN, "median_tokens": float(np.median(lengths)),
                   "mean_tokens": float(lengths.mean()),
                   "cut_fraction": float(np.mean(lengths >= SEQ_LEN))},
          "packing": packing, "model": sizes}


def _filled(labels: np.ndarray, batch: int) -> np.ndarray:
  """A batch's labels, then -1 (no example) up to `batch`."""
  return np.concatenate([labels, np.full(batch - len(labels), -1, np.int32)])


def table(records: list[dict]) -> str:
  lines = ["| implementation | steps | ms / step | real tokens / s | real / computed tokens "
           "| speed over transformers |", "|---|---:|---:|---:|---:|---:|"]
  for r in records:
    lines.append(f"| {r['impl']} | {r['steps']} | {r['ms_per_step']:,.0f} | "
                 f"{r['real_tokens_per_s']:,.0f} | {r['real_fraction']:.0%} | "
                 f"{r['speed_over_transformers']:.2f} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.finetune_packed",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true",
                      help="a tiny BERT, 96 of the texts, 1 round: seconds")
  parser.add_argument("--batch", type=int, default=None,
                      help="examples per batch (default 32; 8 quick)")
  parser.add_argument("--rounds", type=int, default=None,
                      help="groups the epoch is timed in, interleaved (default 4; 1 quick)")
  parser.add_argument("--examples", type=int, default=None,
                      help="texts trained on, evenly spaced (default 384; 96 quick; 0: all)")
  parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
  parser.add_argument("--dropout", type=float, default=0.0,
                      help="hidden and attention dropout on both sides (default 0: off)")
  parser.add_argument("--attention", default="reference", choices=("reference", "xla"),
                      help="our attention_impl (default: load_hf's; xla's has no dropout)")
  parser.add_argument("--out", default=None, help="results JSON (default: print only)")
  args = parser.parse_args(argv)
  batch = args.batch or (8 if args.quick else 32)
  rounds = args.rounds or (1 if args.quick else 4)

  malloc = "keep" if keep_freed_memory() else "default (not glibc)"
  import torch
  import transformers
  transformers.utils.logging.disable_progress_bar()
  transformers.utils.logging.set_verbosity_error()
  torch.set_num_threads(os.cpu_count())
  jax.config.update("jax_default_matmul_precision", "highest")
  load_before = os.getloadavg()
  attention = args.attention
  count = args.examples if args.examples is not None else (96 if args.quick else 384)
  measured = measure(args.quick, batch, rounds, args.warmup, args.dropout, attention, count)
  results = {"environment": {**bench.environment(), "transformers": transformers.__version__,
                             "cpu_model": _cpu_model(), "malloc": malloc,
                             "load_average_before": load_before,
                             "load_average_after": os.getloadavg()},
             "dtype": "float32", "batch_examples": batch, "rounds": rounds,
             "warmup": args.warmup, "dropout": args.dropout, "our_attention": attention,
             **measured}
  print(table(measured["records"]))
  speeds = {r["impl"]: r["speed_over_transformers"] for r in measured["records"]}
  print(f"ours packed over transformers: {speeds['ours packed']:.2f}x real tokens/s "
        f"({measured['packing']['examples_per_row']:.2f} examples a row, "
        f"{measured['packing']['fill']:.0%} of the packed ids real)", file=sys.stderr)
  if args.out:
    bench.write_results(args.out, results)
  return 0


def _cpu_model() -> str | None:
  """lscpu's "Model name" (/proc/cpuinfo's "model name")."""
  try:
    with open("/proc/cpuinfo") as f:
      return next((line.split(":", 1)[1].strip() for line in f
                   if line.startswith("model name")), None)
  except OSError:
    return None


if __name__ == "__main__":
  sys.exit(main())
