"""benchmarks/finetune_packed.py runs end to end in its quick mode: both sides train on the same
examples, their first losses agree, and the JSON has both figures."""

import json

import pytest


def test_the_packed_fine_tuning_benchmark_reports_ours_and_transformers(tmp_path, monkeypatch):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from benchmarks import bench, finetune_packed
  monkeypatch.setattr(bench, "PAUSE_S", 0.0)
  out = tmp_path / "finetune_packed.json"
  assert finetune_packed.main(["--quick", "--warmup", "1", "--out", str(out)]) == 0
  results = json.loads(out.read_text())
  records = {r["impl"]: r for r in results["records"]}
  assert list(records) == ["ours packed", "ours padded", "transformers"]
  assert all(r["real_tokens_per_s"] > 0 for r in records.values())
  # The same examples' ids on every side; packed rows compute fewer padding ids.
  assert len({r["real_tokens"] for r in records.values()}) == 1
  assert records["ours packed"]["computed_tokens"] < records["ours padded"]["computed_tokens"]
  assert records["transformers"]["speed_over_transformers"] == 1.0
  theirs = results["first_losses"]["transformers"]
  assert all(abs(loss - theirs) <= 1e-4 * theirs for loss in results["first_losses"].values())
  assert results["data"]["examples"] == 96 and results["packing"]["examples_per_row"] > 1
