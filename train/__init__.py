"""The training program: `python -m train --workdir DIR [--config configs/….py]`."""


def load_encoder(workdir: str):
  """(EncoderConfig, variables) of the newest verified checkpoint of a run; see train.loop."""
  from train.loop import load_encoder as load
  return load(workdir)
