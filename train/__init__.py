"""The training program: `python -m train --workdir DIR [--config configs/….py]`."""
