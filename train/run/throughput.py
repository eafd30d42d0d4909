"""How much of a device's peak a run uses: MFU, in metrics.jsonl where the device's peak is
known.

The flops of a step are XLA's count for the compiled step (`compiled.cost_analysis()`, per
device); MFU is those flops times the steps of a log window, over the window's seconds, over
the device's dense bfloat16 peak from its datasheet. Under `config.model.remat` the count
holds the recomputed layers too, so there it measures the hardware's use rather than the
model's.
"""

from __future__ import annotations

import jax

# Dense bfloat16 matmul peak by device kind (the vendors' datasheets).
DEVICE_PEAKS = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("A100", 312e12),
                ("L4", 121e12), ("TPU v4", 275e12), ("TPU v5 lite", 197e12),
                ("TPU v5e", 197e12), ("TPU v5p", 459e12), ("TPU v6", 918e12))


def device_peak(device_kind: str) -> float | None:
  """The dense bfloat16 peak in flop/s of a device of `device_kind`, or None if unknown."""
  return next((peak for kind, peak in DEVICE_PEAKS if kind in device_kind), None)


def step_flops(compiled) -> float | None:
  """XLA's count of the flops of one compiled step on one device, or None if it gives none."""
  try:
    analysis = compiled.cost_analysis()
  except Exception:  # noqa: BLE001 - backends that do not analyse
    return None
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else {}
  flops = (analysis or {}).get("flops")
  return float(flops) if flops and flops > 0 else None


def flops_per_second_peak() -> float | None:
  """The peak of this process's devices (the first's kind), or None where it is unknown (a
  CPU, an unlisted device)."""
  return device_peak(jax.devices()[0].device_kind)
