r"""The Hugging Face path end to end, with the program's own commands, on a directory made here
(nothing can be downloaded): a small BERT with random weights and a WordPiece tokenizer trained
on the built-in corpus, saved by transformers; then, as a user with their own directory would:

  python -m flax_encoder.pytorch.parity --hf DIR                        # verify
  python -m train.prepare --input builtin:pydoc_data.topics --tokenizer DIR --out CORPUS
  python -m train --config.init.hf=DIR --config.data.prepared=CORPUS ...  # further pretrain
  python -m train.export --workdir PRETRAIN --layout hf --out PRETRAINED  # out again
  python -m train --config=configs/classify.py --config.init.hf=PRETRAINED ...  # fine-tune
  python -m train.export --workdir FINETUNE --layout hf --out CLASSIFIER

and the same fine-tuning from the random directory, for comparison. Prints a table of what each
step measured (held-out accuracy against the majority class, tokens/s, seconds) and writes it
to --out/results.json.

  python -m benchmarks.hf_walkthrough --out runs/hf-walkthrough
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = dict(hidden_size=128, num_hidden_layers=3, num_attention_heads=4, intermediate_size=512,
             max_position_embeddings=512)


def wordpiece(texts: list[str], vocab_size: int):
  """A BERT WordPiece tokenizer (`tokenizers.Tokenizer`) of at most `vocab_size` pieces trained
  on `texts`, with [PAD], [UNK], [CLS], [SEP], [MASK] and BERT's template around a text or a
  pair; and the special tokens' names for transformers."""
  from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
  from tokenizers import trainers
  tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
  tok.normalizer = normalizers.BertNormalizer(lowercase=False)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size,
                                                           special_tokens=special))
  cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
      special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
  tok.decoder = decoders.WordPiece()
  return tok, dict(unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                   mask_token="[MASK]")


def write_directory(path: str, vocab_size: int) -> None:
  """A random BertForMaskedLM of SIZES and a WordPiece tokenizer of `vocab_size` trained on the
  built-in corpus, as save_pretrained writes them."""
  import torch
  import transformers

  from train.data.sources import BUILTIN, documents, plan
  texts = [text for _, text, _ in documents(plan([BUILTIN], 1 << 30), "text")]
  tok, special = wordpiece(texts, vocab_size)
  transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **special).save_pretrained(path)
  torch.manual_seed(0)
  config = transformers.BertConfig(vocab_size=tok.get_vocab_size(), **SIZES)
  transformers.BertForMaskedLM(config).save_pretrained(path)


def run(args: list[str], log) -> float:
  """Runs `python -m ARGS` from the checkout, its output to `log`; the seconds it took."""
  print("$ python -m " + " ".join(args), file=log, flush=True)
  start = time.perf_counter()
  subprocess.run([sys.executable, "-m", *args], cwd=ROOT, stdout=log, stderr=log, check=True)
  return time.perf_counter() - start


def final_eval(workdir: str) -> dict:
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  evals = [r for r in records if r.get("split") == "eval"]
  speeds = sorted(r["tokens_per_s"] for r in records
                  if r.get("split") == "train" and "tokens_per_s" in r)
  return {**evals[-1], "median_tokens_per_s": speeds[len(speeds) // 2] if speeds else None}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.hf_walkthrough",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", required=True, help="a new directory for everything")
  parser.add_argument("--vocab-size", type=int, default=8000)
  parser.add_argument("--pretrain-steps", type=int, default=1500)
  parser.add_argument("--finetune-steps", type=int, default=800)
  args = parser.parse_args(argv)
  os.makedirs(args.out)
  at = lambda name: os.path.join(os.path.abspath(args.out), name)
  results = {"sizes": SIZES}
  with open(at("log.txt"), "w") as log:
    write_directory(at("bert-random"), args.vocab_size)
    results["parity_s"] = run(["flax_encoder.pytorch.parity", "--hf", at("bert-random")], log)
    results["prepare_s"] = run(["train.prepare", "--input", "builtin:pydoc_data.topics",
                                "--tokenizer", at("bert-random"), "--seq-len", "128",
                                "--out", at("corpus")], log)
    results["pretrain_s"] = run([
        "train", f"--workdir={at('pretrain')}", f"--config.init.hf={at('bert-random')}",
        f"--config.data.prepared={at('corpus')}", "--config.train.seq_len=128",
        "--config.train.batch_size=32", f"--config.train.num_steps={args.pretrain_steps}",
        "--config.optim.recipe=adamw", "--config.optim.learning_rate=1e-3",
        "--config.optim.warmup_steps=100", "--config.optim.label_smoothing=0",
        f"--config.train.eval_every={args.pretrain_steps}"], log)
    results["pretrain"] = final_eval(at("pretrain"))
    run(["train.export", "--workdir", at("pretrain"), "--layout", "hf", "--out",
         at("bert-pretrained")], log)
    for start in ("random", "pretrained"):
      workdir = at(f"finetune-{start}")
      results[f"finetune_{start}_s"] = run([
          "train", "--config=configs/classify.py", f"--workdir={workdir}",
          f"--config.init.hf={at('bert-' + start)}", "--config.optim.learning_rate=1e-4",
          f"--config.train.num_steps={args.finetune_steps}"], log)
      results[f"finetune_{start}"] = final_eval(workdir)
    run(["train.export", "--workdir", at("finetune-pretrained"), "--layout", "hf", "--out",
         at("classifier")], log)
  with open(at("results.json"), "w") as f:
    json.dump(results, f, indent=1)
  pre, rnd, fin = results["pretrain"], results["finetune_random"], results["finetune_pretrained"]
  print(f"further pretraining, {args.pretrain_steps} steps: masked-token accuracy "
        f"{pre['accuracy']:.3f} (most frequent token {pre['baseline_accuracy']:.3f}), "
        f"{pre['median_tokens_per_s']:.0f} tokens/s, {results['pretrain_s']:.0f} s")
  for name, r in (("random", rnd), ("pretrained", fin)):
    print(f"fine-tuning from the {name} directory, {args.finetune_steps} steps: accuracy "
          f"{r['accuracy']:.3f}, macro-F1 {r['macro_f1']:.3f} (majority class "
          f"{r['baseline_accuracy']:.3f}), {results[f'finetune_{name}_s']:.0f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
