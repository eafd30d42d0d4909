"""The compiled training step's memory against what the device has, known before the first
step runs.

XLA's `compiled.memory_analysis()` gives, per device, the bytes of the step's arguments (the
train state and the batch), outputs (the new state, aliased to the donated old one) and
temporaries (activations, gradients). The step is compiled for the state's shapes before the
state is allocated, so what must fit is the arguments + outputs - aliased + temporaries.
Accelerators report their free memory (`memory_stats()`: bytes_limit - bytes_in_use); on the
CPU it is the host's available memory, shared by every local device.
"""

from __future__ import annotations

import dataclasses

import jax

from train.errors import RunError


@dataclasses.dataclass(frozen=True)
class StepMemory:
  """Bytes per device of a compiled step, and what the device has free for it (None where the
  backend does not say)."""

  state: int  # the arguments: the train state and a batch
  step: int  # outputs not aliased to donated arguments, plus temporaries
  temporaries: int
  available: int | None

  @property
  def needed(self) -> int:
    return self.state + self.step

  def __str__(self) -> str:
    free = "how much is free is unknown" if self.available is None else (
        f"{_size(self.available)} available")
    return (f"the training step needs {_size(self.needed)} per device: the state and a batch "
            f"{_size(self.state)}, the step {_size(self.step)} (temporaries "
            f"{_size(self.temporaries)}); {free}")


def _size(n: int) -> str:
  return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def step_memory(compiled) -> StepMemory:
  analysis = compiled.memory_analysis()
  needed = (analysis.output_size_in_bytes - analysis.alias_size_in_bytes
            + analysis.temp_size_in_bytes)
  return StepMemory(state=analysis.argument_size_in_bytes, step=needed,
                    temporaries=analysis.temp_size_in_bytes, available=available_bytes())


def available_bytes() -> int | None:
  """Free bytes per local device: the accelerator's own, or the host's shared by the CPU
  devices; None where neither is known."""
  device = jax.local_devices()[0]
  stats = device.memory_stats() if device.platform != "cpu" else None
  if stats and "bytes_limit" in stats:
    return stats["bytes_limit"] - stats.get("bytes_in_use", 0)
  try:
    with open("/proc/meminfo") as f:
      info = dict(line.split(":", 1) for line in f)
    return int(info["MemAvailable"].split()[0]) * 1024 // jax.local_device_count()
  except (OSError, KeyError, ValueError):
    return None


def check_fits(memory: StepMemory) -> None:
  """RunError, with both figures and what would make it fit, if the step cannot fit."""
  if memory.available is not None and memory.needed > memory.available:
    raise RunError(f"{memory}: it does not fit. Set config.train.grad_accum_steps (k "
                   f"microbatches hold 1/k of the activations), config.model.remat='full' "
                   f"(recompute each layer in the backward pass), a smaller "
                   f"config.train.batch_size, config.mesh.fsdp (split the state over the "
                   f"devices), or a smaller model")
