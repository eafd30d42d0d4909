r"""Contrastive fine-tuning of sentence embeddings: `python -m train --config=configs/embed.py`
against sentence-transformers' own trainer, the same model, pairs, batch, length, loss and
steps, on this CPU: pairs per second, peak resident memory, and the trained models' MRR@10.

  python -m benchmarks.contrastive --out benchmarks/results/contrastive.json  # ~15 min, 2 cores
  python -m benchmarks.contrastive --steps 6 --batch-size 16 --repeats 1      # a few minutes
  python -m benchmarks.contrastive --cached --repeats 1  # also GradCache on both sides: ~15 min

The pairs are real text: the packages of Debian's database on this machine (/var/lib/dpkg/status),
each package's one-line description the anchor and its long description (the continuation
lines joined, lone "." lines dropped) the positive; packages without a long description are left
out, and so is a pair whose anchor (ignoring case) or positive an earlier package (by name)
already had: Debian gives a library's binary packages one description, and a repeated text in a
batch is a false negative. Every 5th pair is held out. They are written into the work directory
(`--workdir`, else a temporary one) as train.jsonl and eval.jsonl. The model is `--model`, by
default the published all-MiniLM-L6-v2 where the tests' cache holds it (tests/published.py).
sentence-transformers' trainer needs `datasets` and `accelerate`: the `bench` extra.

Sides, each run in a fresh process of its own (`--repeats` rounds, the order of the sides reversed
every other round):

  ours                    python -m train --config=configs/embed.py --config.init.hf=MODEL with
                          the pairs, --config.train.{num_steps,batch_size,seq_len} = --steps,
                          --batch-size, --seq-len; evaluation at the start and at the last step
                          only, one checkpoint (the last), a train record every step
                          (config.train.log_every=1: on a CPU, where a step takes over a second,
                          the loop waits for each step before the next anyway). Whatever the
                          step computes (packed rows, as it stands); jemalloc where installed,
                          as the program chooses; JAX_LOG_COMPILES=1, to see its compilations.
  sentence-transformers   benchmarks.st_trainer: SentenceTransformerTrainer with
                          MultipleNegativesRankingLoss, max_seq_length --seq-len, --batch-size
                          pairs a step, --steps steps, no evaluation, no logging, no saving until
                          after the last step; each batch padded to its longest text; glibc's
                          malloc (`--their-malloc jemalloc` preloads jemalloc as ours does).
  ... GradCache (--cached) the same with config.task.cached=True, and with
                          CachedMultipleNegativesRankingLoss, both config.task.mini_batch texts
                          at a time.

What the two share is read from configs/embed.py (and train.run.optim's pretrained recipe), not
restated: the loss's scale (20, cosine similarity), the learning rate (5e-5), its linear warm-up
over 6% of the steps (rounded as the program rounds it) and decay to 0, AdamW's betas, eps and
weight decay (0.01, not on biases and LayerNorms), no gradient clipping, the dropout (0.1) and
the attention dropout (0.0, where the model's config.json has 0.1; sentence-transformers is given
the program's). One difference stays: transformers' warm-up runs the first update at learning
rate 0, the program's at peak / warm-up steps. Neither side evaluates during the timed steps.

Timing is the steady state: the steps after the first `--skip-steps` (default 2: both sides'
first steps allocate, ours compiles before its first step and again for each new shape of packed
batch). Each side gives the time.time() at which each step ended: ours, the wall time of its
train record of that step (its TensorBoard event file's, written once the step's metrics reached
the host; the last before the final evaluation); sentence-transformers', a TrainerCallback's at
on_step_end (PyTorch on the CPU has finished the step then). pairs/s = batch size x (--steps -
--skip-steps) / the seconds between the ends of step --skip-steps and step --steps, less the
seconds our program spent in that time making a training step for a new shape (tracing,
lowering and compiling, from JAX's log lines; the JSON has the figure with them too). Each
side's figure is the median over rounds; the ratio is ours over theirs. Both sides use every
core (XLA's default; torch's default threads).

Peak memory is each process's own: ru_maxrss of that child alone (os.wait4), as the kernel
counts VmHWM. MRR@10 of the start model and of each run's final model (ours exported with
`python -m train.export --layout sentence-transformers`) is computed by one function here: each
loaded with SentenceTransformer, max_seq_length --seq-len, the held-out anchors and positives
encoded (normalised), each anchor ranked against every held-out positive
(train.tasks.contrastive.ranking_metrics). The program's own final evaluation is reported beside
it.

The machine may be shared: before each run the benchmark waits (up to `--idle-wait` seconds)
for the CPUs to be idle, and it samples every half second the CPU time other processes use, to
report their share of the CPUs during each run's timed steps. A figure taken while others used
a large share is slower than this machine alone gives, PyTorch's more than XLA's (an OpenMP
team waits at every barrier for its thread that was descheduled), so the table also gives the
pairs/s over the timed steps during which others used under 15% and nothing was compiled.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks import bench
from benchmarks.embeddings import published_minilm

STATUS = "/var/lib/dpkg/status"
HELD_OUT_EVERY = 5
OURS, THEIRS = "ours", "sentence-transformers"
CACHED = ", GradCache"
IDLE_BUSY = 0.15  # the share of the CPUs' time others may use while we call them idle


# ---------------------------------------------------------------------------------------------
# The pairs


def debian_pairs(path: str = STATUS) -> list[tuple[str, str]]:
  """(short description, long description) of each package of a dpkg status file with a long
  description, by package name, none repeating an earlier anchor (ignoring case) or positive."""
  with open(path, encoding="utf-8", errors="replace") as f:
    stanzas = f.read().split("\n\n")
  described = {}
  for stanza in stanzas:
    package = re.search(r"^Package: (.+)$", stanza, re.M)
    description = re.search(r"^Description: (.*)\n((?: .*\n?)*)", stanza, re.M)
    if not package or not description:
      continue
    # Continuation lines start with a space; " ." is a paragraph break.
    long = [line.strip() for line in description.group(2).splitlines()
            if line.strip() not in ("", ".")]
    if long:
      described[package.group(1)] = (" ".join(description.group(1).split()),
                                     " ".join(" ".join(long).split()))
  pairs, anchors, positives = [], set(), set()
  for name in sorted(described):
    anchor, positive = described[name]
    if anchor.lower() in anchors or positive in positives:
      continue
    anchors.add(anchor.lower())
    positives.add(positive)
    pairs.append((anchor, positive))
  return pairs


def write_pairs(directory: str, pairs: list[tuple[str, str]]) -> dict:
  """Writes train.jsonl and eval.jsonl (every HELD_OUT_EVERY-th pair) into `directory`;
  returns their paths {split: path}, the held-out pairs and the count of training pairs."""
  paths = {split: os.path.join(directory, f"{split}.jsonl") for split in ("train", "eval")}
  held_out = [p for i, p in enumerate(pairs) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
  with open(paths["train"], "w") as train, open(paths["eval"], "w") as held:
    for i, (anchor, positive) in enumerate(pairs):
      f = held if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 else train
      f.write(json.dumps({"anchor": anchor, "positive": positive}) + "\n")
  return {"paths": paths, "held_out": held_out, "train_pairs": len(pairs) - len(held_out)}


# ---------------------------------------------------------------------------------------------
# What both sides share, as the program sets it


def shared_recipe(model: str, steps: int) -> dict:
  """configs/embed.py's loss, optimizer and dropout for a run of `steps` from `model`, the
  pretrained recipe filled in as the program fills it."""
  from configs import embed
  from train.run import optim
  config = embed.get_config()
  config.init.hf = model
  config.train.num_steps = steps
  resolved = optim.resolve(config, steps)
  if resolved.recipe != "adamw" or resolved.clip_norm is not None:
    raise ValueError(f"configs/embed.py now trains with {resolved.recipe}, clip_norm "
                     f"{resolved.clip_norm}: benchmarks.st_trainer gives the Trainer AdamW and "
                     f"no clipping; update both")
  return {"learning_rate": resolved.learning_rate, "weight_decay": resolved.weight_decay,
          "warmup_steps": optim.warmup_steps(resolved, steps), "b1": resolved.b1,
          "b2": resolved.b2, "eps": resolved.eps, "scale": config.task.scale,
          "dropout": config.model.dropout, "attention_dropout": config.model.attention_dropout,
          "mini_batch": config.task.mini_batch, "pooling": config.task.pooling}


# ---------------------------------------------------------------------------------------------
# Running a side in a process of its own


def cpu_busy_seconds() -> float:
  """The CPU seconds all processes have used since boot (/proc/stat; not counting what a
  hypervisor stole)."""
  with open("/proc/stat") as f:
    fields = [int(v) for v in f.readline().split()[1:]]
  user, nice, system, _, _, irq, softirq = fields[:7]
  return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float | None:
  """The CPU seconds process `pid` (all its threads) has used; None once it has gone."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      # the fields after the command's name, which may hold spaces
      fields = f.read().rsplit(")", 1)[1].split()
  except OSError:
    return None
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def wait_until_idle(max_wait: float, sample_s: float = 3.0) -> float:
  """Waits until other processes use under IDLE_BUSY of the CPUs over `sample_s`, at most
  `max_wait` seconds; returns the seconds waited."""
  start = time.perf_counter()
  cores = os.cpu_count()
  while True:
    before = cpu_busy_seconds()
    time.sleep(sample_s)
    if (cpu_busy_seconds() - before) / (sample_s * cores) < IDLE_BUSY:
      return time.perf_counter() - start
    if time.perf_counter() - start >= max_wait:
      print(f"  the CPUs are still busy after {max_wait:.0f} s of waiting: running anyway",
            file=sys.stderr)
      return time.perf_counter() - start


class Others:
  """What other processes than `pid` use of the CPUs while it runs: (time.time(), all
  processes' busy CPU seconds, pid's) sampled every `every_s` in a thread."""

  def __init__(self, pid: int, every_s: float = 0.5):
    self.pid, self.samples, self.done = pid, [], threading.Event()
    self.thread = threading.Thread(target=self._sample, args=(every_s,), daemon=True)
    self.thread.start()

  def _sample(self, every_s: float) -> None:
    while not self.done.is_set():
      own = process_cpu_seconds(self.pid)
      if own is not None:
        self.samples.append((time.time(), cpu_busy_seconds(), own))
      self.done.wait(every_s)

  def stop(self) -> None:
    self.done.set()
    self.thread.join()

  def share(self, start: float, end: float) -> float | None:
    """The share of all the CPUs' time between `start` and `end` (time.time()) that other
    processes used (from the samples nearest either end), None without two samples there."""
    inside = [s for s in self.samples if start - 1 <= s[0] <= end + 1]
    if len(inside) < 2:
      return None
    first = min(inside, key=lambda s: abs(s[0] - start))
    last = min(inside, key=lambda s: abs(s[0] - end))
    seconds = last[0] - first[0]
    if seconds <= 0:
      return None
    return max(0.0, (last[1] - first[1]) - (last[2] - first[2])) / (seconds * os.cpu_count())


def run_process(command: list[str], log: str, env: dict | None = None) -> tuple[dict, Others]:
  """Runs `command`, its output to `log`: its wall and CPU seconds, its own peak resident
  memory and the CPU seconds other processes used meanwhile; and the samples of those.
  Raises if it fails."""
  busy, start = cpu_busy_seconds(), time.perf_counter()
  with open(log, "w") as out:
    child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    others = Others(child.pid)
    _, status, usage = os.wait4(child.pid, 0)  # the usage of this child alone
    child.returncode = os.waitstatus_to_exitcode(status)
    others.stop()
  wall = time.perf_counter() - start
  if child.returncode:
    with open(log) as f:
      tail = f.read()[-3000:]
    raise RuntimeError(f"{' '.join(command[:4])} … exited {child.returncode}; the end of "
                       f"{log}:\n{tail}")
  cpu = usage.ru_utime + usage.ru_stime
  return {"wall_s": wall, "cpu_s": cpu, "peak_rss_gb": usage.ru_maxrss * 1024 / 1e9,
          "others_cpu_s": max(0.0, cpu_busy_seconds() - busy - cpu)}, others


def event_times(workdir: str, tag: str = "train/loss") -> dict[int, float]:
  """{step: wall time} at which the run wrote its train records (its TensorBoard event files:
  TFRecord framing, an Event proto each)."""
  from tensorboard.compat.proto.event_pb2 import Event
  directory = os.path.join(workdir, "tensorboard")
  times = {}
  for name in sorted(os.listdir(directory)):
    with open(os.path.join(directory, name), "rb") as f:
      data = f.read()
    at = 0
    while at + 12 <= len(data):
      (length,) = struct.unpack_from("<Q", data, at)  # then a CRC of the length
      event = Event.FromString(data[at + 12:at + 12 + length])
      at += 12 + length + 4  # the data, then its CRC
      if any(v.tag == tag for v in event.summary.value):
        times[event.step] = event.wall_time
  return times


# What JAX_LOG_COMPILES=1 makes JAX log (through absl: level, MMDD, local time) of each stage of
# making the training step: tracing, lowering, XLA's compilation.
_COMPILE_LINE = re.compile(
    r"^[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+) .*Finished (?:tracing train_step|"
    r"jaxpr to MLIR module conversion jit\(train_step\)|XLA compilation of jit\(train_step\))"
    r".* in ([\d.]+) sec", re.M)


def step_compiles(log: str) -> list[tuple[float, float]]:
  """(time.time() at its end, seconds) of each stage of making a training step that the run's
  `log` shows (JAX_LOG_COMPILES=1)."""
  with open(log, errors="replace") as f:
    text = f.read().replace("\r", "\n")
  year = time.localtime().tm_year
  found = []
  for month, day, hour, minute, second, fraction, seconds in _COMPILE_LINE.findall(text):
    at = time.mktime((year, int(month), int(day), int(hour), int(minute), int(second), 0, 0, -1))
    found.append((at + float("0." + fraction), float(seconds)))
  return found


def steady(ends: dict[int, float], skip: int, steps: int, others: Others,
           compiles: list[tuple[float, float]] = ()) -> dict:
  """The timing of steps skip + 1 … steps from each step's end (time.time()): their seconds
  and each step's, the seconds of `compiles` (end, seconds) in them and each step's, and the
  share of the CPUs other processes used in them and in each step."""
  timed = range(skip + 1, steps + 1)
  compiling = [sum(s for at, s in compiles if ends[k - 1] < at <= ends[k]) for k in timed]
  return {"steady_s": ends[steps] - ends[skip], "compile_s_in_steady": sum(compiling),
          "others_share_steady": others.share(ends[skip], ends[steps]),
          "step_s": [ends[k] - ends[k - 1] for k in timed], "step_compile_s": compiling,
          "step_others_share": [others.share(ends[k - 1], ends[k]) for k in timed]}


def run_ours(args, work: str, data: dict, cached: bool, name: str) -> dict:
  """One run of the program; its timing, memory, windows and exported model."""
  workdir = os.path.join(work, name)
  command = [sys.executable, "-m", "train", "--config=configs/embed.py", f"--workdir={workdir}",
             f"--config.init.hf={args.model}", f"--config.data.train={data['paths']['train']}",
             f"--config.data.eval={data['paths']['eval']}",
             f"--config.train.num_steps={args.steps}",
             f"--config.train.batch_size={args.batch_size}",
             f"--config.train.seq_len={args.seq_len}", "--config.train.log_every=1",
             f"--config.train.eval_every={args.steps}",
             f"--config.train.checkpoint_every={args.steps}",
             "--config.train.keep_checkpoints=1", "--config.train.eval_at_start=True",
             f"--config.task.cached={cached}"]
  log = workdir + ".log"
  process, others = run_process(command, log, {**os.environ, "JAX_LOG_COMPILES": "1"})
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  train = [r for r in records if r["split"] == "train"]
  evals = [r for r in records if r["split"] == "eval"]
  ends = event_times(workdir)
  compiles = step_compiles(log)
  timing = steady(ends, args.skip_steps, args.steps, others, compiles)
  exported = os.path.join(work, name + "-export")
  run_process([sys.executable, "-m", "train.export", f"--workdir={workdir}",
               "--layout=sentence-transformers", f"--out={exported}"], exported + ".log")
  return {**process, **timing, "model": exported,
          "step_compiles": [{"seconds": s, "after_step_1_s": at - ends[1]} for at, s in compiles],
          "host_resident_gb": [r.get("host_resident_gb") for r in train],
          "final_train_loss": train[-1]["loss"],
          "own_eval_mrr_at_10": {r["step"]: r["mrr_at_10"] for r in evals},
          "command": " ".join(command[1:])}


def run_theirs(args, work: str, data: dict, cached: bool, recipe: dict, name: str) -> dict:
  """One run of benchmarks.st_trainer; its timing, memory and trained model."""
  trained, report = os.path.join(work, name), os.path.join(work, name + ".json")
  command = [sys.executable, "-m", "benchmarks.st_trainer", f"--model={args.model}",
             f"--train={data['paths']['train']}", f"--out={trained}", f"--report={report}",
             f"--steps={args.steps}", f"--batch-size={args.batch_size}",
             f"--seq-len={args.seq_len}", f"--warmup-steps={recipe['warmup_steps']}",
             f"--learning-rate={recipe['learning_rate']}",
             f"--weight-decay={recipe['weight_decay']}", f"--b1={recipe['b1']}",
             f"--b2={recipe['b2']}", f"--eps={recipe['eps']}", f"--scale={recipe['scale']}",
             f"--dropout={recipe['dropout']}",
             f"--attention-dropout={recipe['attention_dropout']}",
             f"--mini-batch={recipe['mini_batch']}"] + (["--cached"] if cached else [])
  env = None
  if args.their_malloc == "jemalloc":
    from train.run.host import jemalloc_environment
    env = jemalloc_environment()
  process, others = run_process(command, trained + ".log", env)
  with open(report) as f:
    reported = json.load(f)
  timing = steady(dict(reported["step_ends"]), args.skip_steps, args.steps, others)
  return {**process, **timing, "model": trained,
          "vm_hwm_gb": reported["vm_hwm_bytes"] / 1e9,
          "mean_train_loss": reported["mean_train_loss"], "malloc": reported["malloc"],
          "torch_threads": reported["torch_threads"], "command": " ".join(command[1:])}


# ---------------------------------------------------------------------------------------------
# The trained models, ranked by one function


def ranking(folder: str, held_out: list[tuple[str, str]], seq_len: int) -> dict:
  """MRR@10 (and nDCG@10, recall@1, recall@10) of the sentence-transformers folder: each
  held-out anchor ranked against every held-out positive by cosine."""
  from sentence_transformers import SentenceTransformer
  from train.tasks.contrastive import ranking_metrics
  model = SentenceTransformer(folder, device="cpu")
  model.max_seq_length = seq_len
  encode = lambda texts: model.encode(texts, batch_size=32, normalize_embeddings=True,
                                      convert_to_numpy=True)
  anchors, positives = encode([a for a, _ in held_out]), encode([p for _, p in held_out])
  return ranking_metrics(anchors @ positives.T)


# ---------------------------------------------------------------------------------------------
# Report


def machine() -> dict:
  """The CPU's model name, cores and memory, from /proc."""
  found = {"cores": os.cpu_count(), "platform": platform.platform()}
  try:
    with open("/proc/cpuinfo") as f:
      found["cpu_model"] = next((line.split(":", 1)[1].strip() for line in f
                                 if line.startswith("model name")), platform.processor())
    with open("/proc/meminfo") as f:
      found["memory_gb"] = int(f.readline().split()[1]) * 1024 / 1e9
  except OSError:
    pass
  return found


def pairs_per_s(run: dict, batch: int, steady_steps: int) -> float:
  """A run's steady pairs per second, the step's compilations in that time left out."""
  return batch * steady_steps / (run["steady_s"] - run["compile_s_in_steady"])


def quiet_pairs_per_s(run: dict, batch: int) -> tuple[float | None, int]:
  """Pairs per second over the timed steps during which other processes used under IDLE_BUSY
  of the CPUs and nothing was compiled, and how many such steps there were (None under 3)."""
  quiet = [s for s, share, compiling in zip(run["step_s"], run["step_others_share"],
                                            run["step_compile_s"])
           if share is not None and share < IDLE_BUSY and not compiling]
  return (batch * len(quiet) / sum(quiet) if len(quiet) >= 3 else None), len(quiet)


def summarise(runs: list[dict], batch: int, steady_steps: int) -> list[dict]:
  """A record per side: its median pairs/s over the rounds, the highest peak memory, MRR@10."""
  sides = {}
  for run in runs:
    sides.setdefault(run["side"], []).append(run)
  records = []
  for side, of_side in sides.items():
    rates = [pairs_per_s(r, batch, steady_steps) for r in of_side]
    records.append({
        "side": side, "pairs_per_s": statistics.median(rates), "pairs_per_s_each_round": rates,
        "pairs_per_s_with_compiles_each_round": [batch * steady_steps / r["steady_s"]
                                                 for r in of_side],
        "others_share_steady_each_round": [r["others_share_steady"] for r in of_side],
        # (pairs/s, steps) of each round over its quiet steps alone
        "quiet_steps_each_round": [quiet_pairs_per_s(r, batch) for r in of_side],
        "peak_rss_gb": max(r["peak_rss_gb"] for r in of_side),
        "mrr_at_10": statistics.mean(r["ranking"]["mrr_at_10"] for r in of_side),
        "mrr_at_10_each_round": [r["ranking"]["mrr_at_10"] for r in of_side]})
  for record in records:
    theirs = next((r for r in records if r["side"] == record["side"].replace(OURS, THEIRS)
                   and r["side"].startswith(THEIRS)), None)
    if record["side"].startswith(OURS) and theirs:
      record["over_sentence_transformers"] = record["pairs_per_s"] / theirs["pairs_per_s"]
  return records


def table(records: list[dict], start_mrr: float) -> str:
  lines = ["| side | pairs / s (steady) | ours / theirs | peak RSS (GB) | held-out MRR@10 | "
           "others' CPU share while timed | pairs / s over quiet steps (steps) |",
           "|---|---:|---:|---:|---:|---:|---:|",
           f"| start model (no training) | | | | {start_mrr:.3f} | | |"]
  for r in records:
    ratio = f"{r['over_sentence_transformers']:.2f}" if "over_sentence_transformers" in r else ""
    shares = ", ".join("?" if x is None else f"{x:.0%}"
                       for x in r["others_share_steady_each_round"])
    quiet = ", ".join(f"{'-' if rate is None else f'{rate:.2f}'} ({n})"
                      for rate, n in r["quiet_steps_each_round"])
    lines.append(f"| {r['side']} | {r['pairs_per_s']:.2f} | {ratio} | {r['peak_rss_gb']:.2f} | "
                 f"{r['mrr_at_10']:.3f} | {shares} | {quiet} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.contrastive", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", default=None, help="a sentence-transformers folder (default: "
                      "the published all-MiniLM-L6-v2 in the tests' cache)")
  parser.add_argument("--steps", type=int, default=30, help="optimizer steps of each run")
  parser.add_argument("--batch-size", type=int, default=64, help="pairs a step")
  parser.add_argument("--seq-len", type=int, default=128, help="ids a text at most")
  parser.add_argument("--skip-steps", type=int, default=2,
                      help="first steps of each run left out of the timing")
  parser.add_argument("--repeats", type=int, default=2, help="rounds, the sides interleaved")
  parser.add_argument("--cached", action="store_true",
                      help="also GradCache on both sides (config.task.cached; "
                           "CachedMultipleNegativesRankingLoss)")
  parser.add_argument("--their-malloc", default="glibc", choices=("glibc", "jemalloc"),
                      help="sentence-transformers' malloc (ours: jemalloc where installed)")
  parser.add_argument("--idle-wait", type=float, default=120,
                      help="seconds to wait at most, before each run, for idle CPUs")
  parser.add_argument("--status", default=STATUS, help="the dpkg status file of the pairs")
  parser.add_argument("--workdir", default=None,
                      help="where the pairs, runs and models go (kept; default: temporary)")
  parser.add_argument("--out", default=None, help="results JSON (default: print only)")
  args = parser.parse_args(argv)
  if not os.path.isfile(args.status):
    print(f"error: {args.status}: no such file; the pairs are the packages of Debian's "
          f"database (dpkg), give another with --status", file=sys.stderr)
    return 2
  args.model = args.model or published_minilm()
  if not args.model or not os.path.isfile(os.path.join(args.model, "modules.json")):
    given = args.model or "unset, and all-MiniLM-L6-v2 is not in the tests' cache"
    print(f"error: --model: {given}, expected a sentence-transformers folder (the tests that "
          f"need all-MiniLM-L6-v2 fetch it: tests/published.py)", file=sys.stderr)
    return 2
  missing = [m for m in ("datasets", "accelerate") if importlib.util.find_spec(m) is None]
  if missing:
    print(f"error: sentence-transformers' trainer needs {' and '.join(missing)}: pip install "
          f"{' '.join(missing)}", file=sys.stderr)
    return 2
  if not 0 < args.skip_steps < args.steps:
    print(f"error: --skip-steps: {args.skip_steps}, expected 1 … --steps - 1", file=sys.stderr)
    return 2

  pairs = debian_pairs(args.status)
  recipe = shared_recipe(args.model, args.steps)
  sides = [(OURS, False), (THEIRS, False)] + (
      [(OURS + CACHED, True), (THEIRS + CACHED, True)] if args.cached else [])
  load_before = os.getloadavg()
  with tempfile.TemporaryDirectory() as scratch:
    work = args.workdir or scratch
    os.makedirs(work, exist_ok=True)
    data = write_pairs(work, pairs)
    print(f"{len(pairs)} pairs: {data['train_pairs']} to train on, {len(data['held_out'])} "
          f"held out; model {args.model}; work directory {work}", file=sys.stderr)
    runs = []
    for round_ in range(args.repeats):
      for side, cached in (sides if round_ % 2 == 0 else sides[::-1]):
        waited = wait_until_idle(args.idle_wait)
        name = f"{side.replace(', ', '-').replace(' ', '-').lower()}-{round_}"
        run = (run_ours(args, work, data, cached, name) if side.startswith(OURS) else
               run_theirs(args, work, data, cached, recipe, name))
        run.update(side=side, round=round_, waited_for_idle_s=waited)
        runs.append(run)
        share = run["others_share_steady"]
        print(f"round {round_ + 1}/{args.repeats}, {side}: "
              f"{pairs_per_s(run, args.batch_size, args.steps - args.skip_steps):.2f} pairs/s "
              f"over steps {args.skip_steps + 1}-{args.steps} (compiling "
              f"{run['compile_s_in_steady']:.1f} s of them left out; other processes used "
              f"{'?' if share is None else f'{share:.0%}'} of the CPUs meanwhile), peak "
              f"{run['peak_rss_gb']:.2f} GB, {run['wall_s']:.0f} s in all", file=sys.stderr)
    start = ranking(args.model, data["held_out"], args.seq_len)
    for run in runs:
      run["ranking"] = ranking(run.pop("model"), data["held_out"], args.seq_len)
  records = summarise(runs, args.batch_size, args.steps - args.skip_steps)

  import sentence_transformers
  import transformers
  results = {"environment": {**bench.environment(), "machine": machine(),
                             "transformers": transformers.__version__,
                             "sentence_transformers": sentence_transformers.__version__,
                             "load_average_before": load_before,
                             "load_average_after": os.getloadavg()},
             "model": args.model,
             "data": {"source": args.status, "pairs": len(pairs),
                      "train_pairs": data["train_pairs"], "held_out": len(data["held_out"]),
                      "held_out_every": HELD_OUT_EVERY},
             "settings": {"steps": args.steps, "batch_size": args.batch_size,
                          "seq_len": args.seq_len, "skip_steps": args.skip_steps,
                          "repeats": args.repeats, "their_malloc": args.their_malloc,
                          **recipe},
             "start_ranking": start, "records": records, "runs": runs}
  where = results["environment"]["machine"]
  print(f"{where.get('cpu_model', '?')}, {where['cores']} cores; {args.model}; "
        f"{args.steps} steps of {args.batch_size} pairs at {args.seq_len} ids, timed over steps "
        f"{args.skip_steps + 1}-{args.steps}, median of {args.repeats}")
  print(table(records, start["mrr_at_10"]))
  if args.out:
    bench.write_results(args.out, results)
  return 0


if __name__ == "__main__":
  sys.exit(main())
