"""The accelerator path, guarded on a machine without one: the training step and the exported
encoder lower for TPU and CUDA from the CPU, and the accelerator command runs end to end at
tiny sizes."""

import json
import os
import subprocess
import sys

import pytest

from tests import runs


def test_the_training_step_and_the_exported_encoder_lower_for_tpu_and_cuda():
  env = runs.environment(4)
  result = subprocess.run([sys.executable, "-m", "tests.lowering"], cwd=runs.ROOT, env=env,
                          capture_output=True, text=True, timeout=runs.limit(600), check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  for platform in ("tpu", "cuda"):
    assert (f"train step lowered for {platform}: mesh yes, batch over data x fsdp yes, "
            f"parameters over fsdp yes, bfloat16 yes") in result.stdout, result.stdout
  assert "encoder exported for tpu,cuda: deserialized for tpu,cuda" in result.stdout


def _accelerator(tmp_path, parts: tuple[str, ...]) -> dict:
  """(part, variant) -> entry of `python -m benchmarks.accelerator --parts PARTS` at tiny
  sizes, checked to have run each part, in order, without a failure; its results.md holds a
  section for each."""
  pytest.importorskip("torch")  # its parity and train_step parts compare with PyTorch
  out = tmp_path / "accelerator"
  env = {**runs.environment(), "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, "-m", "benchmarks.accelerator", "--out", str(out),
                           "--parts", ",".join(parts)],
                          cwd=runs.ROOT, env=env, capture_output=True, text=True,
                          timeout=runs.limit(900), check=False)
  assert result.returncode == 0, result.stderr[-3000:] + (out / "log.txt").read_text()[-3000:]
  results = json.loads((out / "results.json").read_text())
  entries = {(e["part"], e["variant"]): e for e in results["parts"]}
  assert [p for p, _ in entries] == list(parts)
  assert all(e["status"] == "ok" for e in entries.values()), entries
  assert (out / "results.md").read_text().count("\n## ") == len(parts)
  assert os.path.getsize(out / "log.txt") > 0
  return entries


# The command's parts, in two runs the suite's workers take at once.
FIRST_PARTS = ("environment", "suite", "parity", "train_step", "bert", "embed", "contrastive")
SECOND_PARTS = ("retrieval", "attention", "long", "big", "train_run", "profile")


def test_every_part_of_the_accelerator_command_is_one_of_the_two_runs():
  from benchmarks.accelerator import PARTS
  assert FIRST_PARTS + SECOND_PARTS == PARTS


@pytest.mark.slow
def test_the_accelerator_command_runs_its_parity_training_and_embedding_parts(tmp_path):
  parts = _accelerator(tmp_path, FIRST_PARTS)
  assert "skipped" in parts[("suite", None)]["notes"][0]
  parity = parts[("parity", None)]["rows"]
  assert parity[-1]["stage"] == "output" and all(r["passes"] for r in parity)
  steps = parts[("train_step", None)]["rows"]
  # torch.compile where there is a GPU; the JAX step is timed before torch is imported too
  assert {r["impl"] for r in steps} == {"jax", "torch", "jax, before torch was imported"}
  assert all(r["tokens/s"] > 0 for r in steps)
  bert = parts[("bert", None)]
  flax, transformers = bert["rows"]
  assert (flax["impl"], transformers["impl"]) == ("flax", "transformers")  # compiled on a GPU
  assert flax["tokens/s"] > 0 and transformers["tokens/s"] > 0
  # The same step on the same weights and batch, both in bfloat16.
  assert abs(flax["first-step loss"] / transformers["first-step loss"] - 1) < 0.02
  # Each model size: ours (and ours in int8) against sentence-transformers (on the CPU here) at
  # each batch size, the same vectors to a cosine of 0.99 first.
  embed = parts[("embed", None)]["rows"]
  assert [(r["model"], r["impl"]) for r in embed] == [
      (model, impl) for model in ("MiniLM-L6 size", "BERT-base size")
      for impl in ("ours", "ours int8", "sentence-transformers, batch 8",
                   "sentence-transformers, batch 32")]
  assert all(r["sentences/s"] > 0 and r["real tokens/s"] > 0 for r in embed)
  assert all(r["min cosine vs sentence-transformers"] >= 0.99 for r in embed
             if r["impl"] == "ours")
  assert all(r["min cosine vs ours bfloat16"] >= 0.95 for r in embed if r["impl"] == "ours int8")
  steps = parts[("contrastive", None)]["rows"]
  assert [r["step"] for r in steps] == ["plain", "GradCache, 4 texts a chunk"]
  assert all(r["pairs/s"] > 0 and r["first-step loss"] > 0 for r in steps)


@pytest.mark.slow
def test_the_accelerator_command_runs_its_retrieval_attention_memory_and_profile_parts(tmp_path):
  parts = _accelerator(tmp_path, SECOND_PARTS)
  # Each type: ours, then sentence-transformers' (on the CPU here), on the same folder.
  retrieval = parts[("retrieval", None)]["rows"]
  assert [(r["model"], r["impl"]) for r in retrieval] == [
      (kind, impl) for impl in ("ours", "sentence-transformers")
      for kind in ("rerank", "sparse", "multi_vector")]
  assert all(r["texts/s"] > 0 for r in retrieval)
  impls = {r["impl"] for r in parts[("attention", None)]["rows"]}
  assert impls == {"reference", "xla"}  # cudnn needs an NVIDIA GPU
  assert all(float(r["max abs err vs float32"]) < 0.05
             for r in parts[("attention", None)]["rows"])
  long = parts[("long", None)]["rows"]
  assert {r["path"] for r in long} == {"windowed", "full mask"}  # and cudnn on a GPU
  assert all(float(r["max abs diff vs full mask"]) < 1e-5 for r in long)
  assert [r["remat"] for r in parts[("big", None)]["rows"]] == ["none", "full", "save_dots"]
  assert parts[("train_run", None)]["rows"][0]["steps"] == 40
  assert parts[("profile", None)]["rows"]
