"""The benchmark scripts run end to end on a tiny model (their figures come from real runs)."""

import dataclasses

import pytest

from benchmarks import bench, report


def test_flop_count_is_the_standard_one():
  cfg = bench.paper_base()
  n_matmul = 6 * 12 * 512**2  # 4 d^2 attention + 2 d d_ff = 12 d^2 per layer
  assert bench.flops_per_token(cfg, 128, train=False) == 2 * n_matmul + 4 * 6 * 512 * 128
  assert bench.flops_per_token(cfg, 128, train=True) == (
      6 * (n_matmul + 512 * bench.VOCAB_SIZE) + 12 * 6 * 512 * 128)


def test_side_by_side_run_and_report(tmp_path):
  pytest.importorskip("torch")
  cfg = dataclasses.replace(bench.paper_base(), d_model=16, n_heads=2, d_ff=32, n_layers=2,
                            vocab_size=50)
  records = bench.speed(cfg, batch=2, seq=8, reps=2, warmup=1, with_compile=False)
  speed = {(r["section"], r["impl"]): r for r in records}
  assert set(speed) == {(s, i) for s in ("forward", "train") for i in ("jax", "torch")}
  assert speed[("train", "torch")]["ratio_to_torch"] == 1.0
  assert all(r["seconds"] > 0 for r in records)
  results = {"environment": bench.environment(), "dtype": "float32", "attention": "xla",
             "matmul_peak_flops_per_s": 1e11, "records": records + bench.compile_times(
                 cfg, layers=(1, 2), batch=2, seq=8)}
  text = report.tables(results)
  assert "| train | 2 × 8 | jax |" in text and "| 2 |" in text
  report.plot(results, str(tmp_path / "plot.png"))
  assert (tmp_path / "plot.png").stat().st_size > 1000
