r"""How often a run opens the files of its start folder: `python -m train` started from
`config.init.hf`, traced by strace, counting the opens of the start's config.json and weights.

  python -m benchmarks.start_reads [--model DIR] [--out benchmarks/results/start_reads.json]

Each task (rerank, sparse, embed: the contrastive task of configs/embed.py) trains one step
of a few lines, its seq_len the start's default, in its own process under `strace -f -e
trace=openat`. The start is the published all-MiniLM-L6-v2 where the tests' cache holds it
(tests/published.py); rerank's is a reranker made of it (transformers'
BertForSequenceClassification of one label, saved beside its tokenizer), whose classifier the
run goes on from. A file counts once per successful open by any thread or child. What the run
copies into WORKDIR/start is opened there, not in the start folder, and is not counted. Needs
strace (Debian's package), torch and transformers (the reranker).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from benchmarks.embeddings import published_minilm
from train.tasks.start import START_COPIED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("red", "green", "blue", "cat", "dog", "bird", "sun", "moon", "rain", "snow")
COUNTED = ("config.json", "model.safetensors", "tokenizer.json")


def _text(i: int, n: int = 4) -> str:
  return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n))


def _write(path: str, lines: list[dict]) -> str:
  with open(path, "w") as f:
    f.writelines(json.dumps(line) + "\n" for line in lines)
  return path


def _data(scratch: str) -> dict[str, list[str]]:
  """task -> its data overrides: a few pairs, or rerank's groups."""
  pairs = [{"anchor": _text(i), "positive": _text(i + 1)} for i in range(24)]
  train_pairs = _write(os.path.join(scratch, "pairs.jsonl"), pairs)
  eval_pairs = _write(os.path.join(scratch, "eval_pairs.jsonl"), pairs[:8])
  groups = [{"query": _text(i), "positive": _text(i + 1), "negative": [_text(i + 5)]}
            for i in range(24)]
  held_out = [{"query": _text(i), "positive": _text(i + 1),
               "documents": [_text(i + 5), _text(i + 1)]} for i in range(8)]
  train_groups = _write(os.path.join(scratch, "groups.jsonl"), groups)
  eval_groups = _write(os.path.join(scratch, "eval_groups.jsonl"), held_out)
  pairs_data = [f"--config.data.train={train_pairs}", f"--config.data.eval={eval_pairs}"]
  return {"rerank": [f"--config.data.train={train_groups}", f"--config.data.eval={eval_groups}",
                     "--config.task.negatives=1"],
          "sparse": [*pairs_data, "--config.init.fresh_head=True"],
          "embed": pairs_data}


def opens(task: str, model: str, data: list[str], scratch: str) -> dict[str, int]:
  """{file name: successful opens of it in `model`} of one step of `task` from `model`."""
  trace, workdir = os.path.join(scratch, f"{task}.strace"), os.path.join(scratch, task)
  command = [sys.executable, "-m", "train", f"--config=configs/{task}.py",
             f"--workdir={workdir}", f"--config.init.hf={model}", *data,
             "--config.train.num_steps=1", "--config.train.batch_size=8",
             "--config.train.eval_every=1",
             "--config.train.checkpoint_every=1"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  done = subprocess.run(["strace", "-f", "-qq", "-e", "trace=openat", "-o", trace, *command],
                        cwd=ROOT, env=env, capture_output=True, text=True, check=False)
  if done.returncode:
    raise SystemExit(f"{task}: the run failed:\n{done.stderr[-2000:]}")
  real = os.path.realpath(model)
  counts = dict.fromkeys(COUNTED, 0)
  with open(trace) as f:
    for line in f:
      found = re.search(r'openat\([^,]+, "([^"]+)", [^)]*\) = \d+', line)
      if not found:
        continue
      path = os.path.realpath(found.group(1))
      if path.startswith(real + os.sep) and os.path.isfile(path):
        name = os.path.relpath(path, real)
        counts[name] = counts.get(name, 0) + 1
  return counts


def reranker(model: str, scratch: str) -> str:
  """A reranker of `model`: its encoder, BERT's pooler and a classifier of one label drawn
  afresh, as transformers saves a *ForSequenceClassification, with `model`'s tokenizer."""
  import transformers
  out = os.path.join(scratch, "reranker")
  transformers.AutoModelForSequenceClassification.from_pretrained(
      model, num_labels=1).save_pretrained(out)
  for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "vocab.txt"):
    if os.path.isfile(os.path.join(model, name)):
      shutil.copy(os.path.join(model, name), out)
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument("--model", help="the start folder (default: the published "
                      "all-MiniLM-L6-v2 in the tests' cache)")
  parser.add_argument("--tasks", default="rerank,sparse,embed", help="the tasks traced")
  parser.add_argument("--out", help="a JSON file for the counts")
  args = parser.parse_args(argv)
  model = args.model or published_minilm()
  if model is None:
    print("error: --model: unset, and all-MiniLM-L6-v2 is not in the tests' cache "
          "(tests/published.py fetches it)", file=sys.stderr)
    return 2
  if shutil.which("strace") is None:
    print("error: strace: not installed, expected Debian's strace", file=sys.stderr)
    return 2
  results = {}
  with tempfile.TemporaryDirectory() as scratch:
    data = _data(scratch)
    for task in args.tasks.split(","):
      start = reranker(model, scratch) if task == "rerank" else model
      results[task] = opens(task, start, data[task], scratch)
      others = {k: n for k, n in results[task].items() if k not in COUNTED}
      copied = [k for k in others if k in START_COPIED]
      print(f"{task:8s} " + "  ".join(f"{name} {results[task][name]}" for name in COUNTED) +
            f"  other files: {len(others)}, at most {max(others.values(), default=0)} opens "
            f"each ({', '.join(f'{k} {n}' for k, n in others.items())}; copied into "
            f"WORKDIR/start: {', '.join(copied) or 'none'})", flush=True)
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"model": model, "opens": results}, f, indent=2)
      f.write("\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
