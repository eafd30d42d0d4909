"""The PyTorch bridge: weights in and out, the reference PyTorch port, the parity report.

Needs the `torch` extra (`pip install 'flax-encoder[torch]'`). Conversion reads and writes two
state-dict layouts, "tutorial" (the PyTorch tutorial port's names, w_q … w_o, w_1/w_2) and
"torch_nn" (torch.nn.TransformerEncoderLayer's); see `flax_encoder.pytorch.convert`.

    from flax_encoder.pytorch import load_torch_checkpoint, from_torch_state_dict
    variables = from_torch_state_dict(load_torch_checkpoint("model.pt"), config)

The reference port is `flax_encoder.pytorch.reference` (imports torch); the parity report is
`python -m flax_encoder.pytorch.parity`.
"""

from flax_encoder.pytorch.convert import (
    LAYOUTS,
    expected_shapes,
    from_torch_state_dict,
    load_torch_checkpoint,
    to_torch_state_dict,
)

__all__ = ["LAYOUTS", "expected_shapes", "from_torch_state_dict", "load_torch_checkpoint",
           "to_torch_state_dict"]
