r"""sentence-transformers' own training of a sentence-embedding model on pairs: the side that
benchmarks.contrastive compares `python -m train --config=configs/embed.py` against, run in a
process of its own so that its peak memory is its own.

  python -m benchmarks.st_trainer --model DIR --train pairs.jsonl --out trained/ \
      --report report.json --steps 30 --batch-size 64 --seq-len 128 --warmup-steps 2 \
      [--cached --mini-batch 32]

SentenceTransformerTrainer with MultipleNegativesRankingLoss (scale 20, cosine; with
`--cached` CachedMultipleNegativesRankingLoss, `--mini-batch` texts a column at once) on the
{"anchor", "positive"} lines of `--train`, `--steps` optimizer steps of `--batch-size` pairs
(the trainer's default sampler: the pairs shuffled, an incomplete last batch dropped), texts
cut to `--seq-len` tokens, no evaluation, no logging, no checkpoint. The optimizer is the
Trainer's AdamW with what benchmarks.contrastive passes to match the program's (betas, eps,
peak learning rate, linear warm-up then decay, weight decay off biases and LayerNorms, no
clipping); the dropout and attention dropout are `--dropout` and `--attention-dropout` (set
by BERT's config.json names). malloc is the process's own: glibc's defaults, or whatever
LD_PRELOAD the caller set. After training (untimed) the model is saved to `--out`, and
`--report` gets a JSON object: each step's end (time.time(), the clock python -m train stamps
its records with), the trainer's mean training loss, this process's VmHWM and its malloc.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from train.run.host import allocator


def peak_resident_bytes() -> int | None:
  """This process's peak resident memory so far (VmHWM; None where there is no /proc)."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def read_pairs(path: str) -> dict[str, list[str]]:
  """{"anchor": [...], "positive": [...]} of a JSON-lines file of pairs."""
  columns = {"anchor": [], "positive": []}
  with open(path) as f:
    for line in f:
      record = json.loads(line)
      for name, texts in columns.items():
        texts.append(record[name])
  return columns


def train(args) -> dict:
  """Trains as the module docstring says; returns the report."""
  import datasets
  import transformers
  from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
  from sentence_transformers import SentenceTransformerTrainingArguments
  from sentence_transformers.sentence_transformer import losses

  transformers.utils.logging.set_verbosity_error()
  datasets.disable_progress_bars()
  model = SentenceTransformer(args.model, device="cpu", config_kwargs={  # BERT's names
      "hidden_dropout_prob": args.dropout, "attention_probs_dropout_prob": args.attention_dropout})
  model.max_seq_length = args.seq_len
  if args.cached:
    loss = losses.CachedMultipleNegativesRankingLoss(model, scale=args.scale,
                                                     mini_batch_size=args.mini_batch)
  else:
    loss = losses.MultipleNegativesRankingLoss(model, scale=args.scale)
  training = SentenceTransformerTrainingArguments(
      output_dir=os.path.join(args.out, "trainer"), max_steps=args.steps,
      per_device_train_batch_size=args.batch_size, learning_rate=args.learning_rate,
      lr_scheduler_type="linear", warmup_steps=args.warmup_steps,
      weight_decay=args.weight_decay, adam_beta1=args.b1, adam_beta2=args.b2,
      adam_epsilon=args.eps, max_grad_norm=0.0, optim="adamw_torch",
      dataloader_drop_last=True, eval_strategy="no", save_strategy="no",
      logging_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=0)

  ends = []

  class StepTimes(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
      ends.append((state.global_step, time.time()))

  trainer = SentenceTransformerTrainer(
      model=model, args=training, loss=loss,
      train_dataset=datasets.Dataset.from_dict(read_pairs(args.train)),
      callbacks=[StepTimes()])
  start = time.perf_counter()
  output = trainer.train()
  seconds = time.perf_counter() - start
  model.save(args.out)
  return {"step_ends": ends, "train_seconds": seconds,
          "steps": output.global_step, "mean_train_loss": output.training_loss,
          "vm_hwm_bytes": peak_resident_bytes(), "torch_threads": _torch_threads(),
          "malloc": allocator()}


def _torch_threads() -> int:
  import torch
  return torch.get_num_threads()


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.st_trainer", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", required=True, help="a sentence-transformers folder")
  parser.add_argument("--train", required=True, help="JSON lines of anchor and positive")
  parser.add_argument("--out", required=True, help="where the trained model is saved")
  parser.add_argument("--report", required=True, help="the report's JSON file")
  parser.add_argument("--steps", type=int, required=True)
  parser.add_argument("--batch-size", type=int, required=True)
  parser.add_argument("--seq-len", type=int, required=True)
  parser.add_argument("--warmup-steps", type=int, required=True)
  parser.add_argument("--learning-rate", type=float, default=5e-5)
  parser.add_argument("--weight-decay", type=float, default=0.01)
  parser.add_argument("--b1", type=float, default=0.9)
  parser.add_argument("--b2", type=float, default=0.999)
  parser.add_argument("--eps", type=float, default=1e-8)
  parser.add_argument("--scale", type=float, default=20.0)
  parser.add_argument("--dropout", type=float, default=0.1)
  parser.add_argument("--attention-dropout", type=float, default=0.1)
  parser.add_argument("--cached", action="store_true")
  parser.add_argument("--mini-batch", type=int, default=32)
  args = parser.parse_args(argv)
  report = train(args)
  with open(args.report, "w") as f:
    json.dump(report, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
