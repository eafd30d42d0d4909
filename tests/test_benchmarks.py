"""The benchmark scripts run end to end on a tiny model (their figures come from real runs),
and both sides of the comparison compute the same training step."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from benchmarks import bench, report, workload


def _tiny(**overrides):
  return dataclasses.replace(workload.paper_base(), d_model=16, n_heads=2, d_ff=32, n_layers=2,
                             vocab_size=300, **overrides)  # >= the 260 ids masking draws


def test_flop_count_is_the_standard_one():
  cfg = workload.paper_base()
  n_matmul = 6 * 12 * 512**2  # 4 d^2 attention + 2 d d_ff = 12 d^2 per layer
  assert workload.flops_per_token(cfg, 128, train=False) == 2 * n_matmul + 4 * 6 * 512 * 128
  assert workload.flops_per_token(cfg, 128, train=True) == (
      6 * (n_matmul + 512 * workload.VOCAB_SIZE) + 12 * 6 * 512 * 128)
  assert workload.predictions(128) == 20  # ceil(0.15 * 128): the output layer's positions
  assert workload.flops_per_token(cfg, 128, train=True, predicted=20 / 128) == (
      6 * (n_matmul + 512 * workload.VOCAB_SIZE * 20 / 128) + 12 * 6 * 512 * 128)


def test_the_jax_and_pytorch_steps_compute_the_same_losses():
  pytest.importorskip("torch")
  cfg = _tiny(dropout=0.0)
  _, jax_train, params, host_batches = workload.jax_side(cfg, batch=4, seq=16, steps_masked=3)
  _, torch_train = workload.torch_side(cfg, params, host_batches, compile_=False)
  assert [b["weights"].sum() for b in host_batches] == [4 * 2] * 3  # round(0.15 * 16) a row
  assert (host_batches[0]["predict_at"] != host_batches[1]["predict_at"]).any()
  for _ in range(3):  # the same loss, then the same update (Adam, schedule) three times over
    np.testing.assert_allclose(float(jax_train()), float(torch_train()), rtol=2e-5)


@pytest.mark.slow
def test_side_by_side_run_and_report(tmp_path, monkeypatch):
  pytest.importorskip("torch")
  monkeypatch.setattr(bench, "PAUSE_S", 0.0)
  cfg = _tiny()
  records = bench.speed(cfg, batch=2, seq=8, reps=2, warmup=1, with_compile=False)
  speed = {(r["section"], r["impl"]): r for r in records}
  assert set(speed) == {(s, i) for s in ("forward", "train") for i in ("jax", "torch")}
  assert speed[("train", "torch")]["ratio_to_torch"] == 1.0
  assert all(r["seconds"] > 0 for r in records)
  # compile_times empties JAX's caches so that each compile is a real one: not this worker's
  monkeypatch.setattr(jax, "clear_caches", lambda: None)
  results = {"environment": bench.environment(), "dtype": "float32", "attention": "xla",
             "matmul_peak_flops_per_s": 1e11, "records": records + bench.compile_times(
                 cfg, layers=(1,), batch=2, seq=8)}
  text = report.tables(results)
  assert "| train | 2 × 8 | jax |" in text and "| 1 |" in text
  report.plot(results, str(tmp_path / "plot.png"))
  assert (tmp_path / "plot.png").stat().st_size > 1000


def test_input_pipeline_benchmark_runs(capsys):
  from benchmarks import input_pipeline
  assert input_pipeline.main(["--megabytes", "1", "--workers", "0", "--batches", "5"]) == 0
  lines = [line for line in capsys.readouterr().out.splitlines() if "tokens/s" in line]
  assert [line.split(" (")[0] for line in lines] == ["64 x 128", "64 x 512"]
  assert all(float(line.split(": ")[1].split()[0]) > 0 for line in lines)


def test_the_hugging_face_bert_benchmark_compares_equal_losses(tmp_path, monkeypatch):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from benchmarks import hf
  monkeypatch.setattr(bench, "PAUSE_S", 0.0)
  out = tmp_path / "hf.json"
  assert hf.main(["--tiny", "--reps", "1", "--out", str(out)]) == 0
  results = json.loads(out.read_text())
  assert {"jax", "torch", "transformers", "cpu", "cores"} <= set(results["environment"])
  impls = ["flax", "transformers sdpa", "transformers eager"]
  assert [r["impl"] for r in results["losses"]] == impls  # no torch.compile when tiny
  for r in results["losses"]:  # step 0 to 1e-4, step 1 (after an AdamW update) to 1e-3
    assert r["rel_diff_step0"] <= 1e-4 and r["rel_diff_step1"] <= 1e-3
  assert results["losses"][0]["loss_step0"] > 0
  records = {(r["section"], r["impl"]): r for r in results["records"]}
  assert set(records) == {(s, i) for s in ("forward", "train") for i in impls}
  assert all(r["ms"] > 0 and r["tokens_per_s"] > 0 for r in records.values())
  assert set(results["ratios"]["train"]) == {
      "flax / transformers sdpa", "flax / transformers eager",
      "flax / best transformers eager mode"}


def test_the_long_sequence_benchmark_shows_the_windowed_layer_growing_linearly(monkeypatch):
  from benchmarks import long_sequence
  monkeypatch.setattr(bench, "PAUSE_S", 0.0)
  rows = long_sequence.measure([128, 256, 512], reps=1, tiny=True)
  memory = {(r["path"], r["tokens"]): r["XLA temporaries MB"] for r in rows}
  assert {r["path"] for r in rows} == {"windowed", "full mask"}
  assert all(float(r["max abs diff vs full mask"]) < 1e-5 for r in rows)
  for seq in (128, 256):  # twice the tokens: about twice the memory, against about four times
    assert memory["windowed", 2 * seq] < 2.3 * memory["windowed", seq]
    assert memory["full mask", 2 * seq] > 3 * memory["full mask", seq]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"),
                    reason="the benchmark reads and resets its run's memory in /proc (Linux)")
def test_the_big_batch_benchmark_sets_the_announced_memory_against_the_memory_held(tmp_path):
  from benchmarks import big_batch
  out = tmp_path / "big_batch.json"
  assert big_batch.main(["--pairs", "32", "--devices", "2", "--mini-batch", "16", "--steps", "2",
                         "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  assert (result["steps"], result["chunks"]) == (2, 4)
  assert result["announced_gb_per_device"] > 0
  assert result["announced_gb"] == pytest.approx(2 * result["announced_gb_per_device"])
  assert 0 < result["compiled_rss_gb"] <= result["peak_rss_gb"]
  assert 0 < result["training_peak_rss_gb"] <= result["peak_rss_gb"]
  assert 0 < result["host_resident_gb"] <= result["peak_rss_gb"]


def test_the_retrieval_benchmark_ranks_each_query_against_every_document():
  from benchmarks.retrieval import metrics
  scores = np.eye(12)
  scores[1, [5, 7]] = 2  # two above the relevant one: rank 3
  scores[2] = 5
  scores[2, 2] = 1  # every other above: rank 12, outside the top 10
  scores[3, 4] = 1  # a tie ranks above the relevant one: rank 2
  got = metrics(scores)
  ranks = [1, 3, None, 2] + [1] * 8
  assert got["mrr_at_10"] == pytest.approx(np.mean([1 / r if r else 0 for r in ranks]))
  assert got["ndcg_at_10"] == pytest.approx(
      np.mean([1 / np.log2(r + 1) if r else 0 for r in ranks]))


def test_the_int8_dots_benchmark_measures_each_product_in_a_process_of_its_own(tmp_path, capsys):
  from benchmarks import int8_dots
  assert int8_dots.main(["--quick", "--reps", "2", "--out", str(tmp_path / "d.json")]) == 0
  table = capsys.readouterr().out.splitlines()
  assert table[2].startswith("| default | 256 x 64 x 64 | ")
  rows = json.loads((tmp_path / "d.json").read_text())["results"]["default"]
  assert all(rows[0][kind] > 0 for kind in ("float32", "int8", "bfloat16"))


def test_the_search_benchmark_times_each_side_on_the_same_documents(tmp_path):
  from benchmarks import search
  out = tmp_path / "search.json"
  assert search.main(["--queries", "20", "--documents", "500", "--dim", "16", "--k", "10",
                      "--repeats", "1", "--out", str(out)]) == 0
  rows = json.loads(out.read_text())["rows"]
  assert rows["flax-encoder (search.top_k)"]["ours_x"] == 1.0
  assert all(row["queries_per_s"] > 0 for row in rows.values())
