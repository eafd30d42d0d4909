"""The PyTorch bridge: weights in and out, the reference PyTorch port, the parity report.

Needs the `torch` extra (`pip install 'flax-encoder[torch]'`).

    from flax_encoder.pytorch import (config_from_torch_state_dict, from_torch_state_dict,
                                      load_torch_checkpoint)
    state_dict = load_torch_checkpoint("model.pt")   # a state dict, or a training checkpoint
    config = config_from_torch_state_dict(state_dict, n_heads=8, prefix="auto")
    variables = from_torch_state_dict(state_dict, config, prefix="auto")

State-dict layouts ("tutorial": the PyTorch tutorial port's names; "torch_nn":
torch.nn.TransformerEncoderLayer's) and how the encoder is found inside a larger model are
described in `flax_encoder.pytorch.layouts`. The reference port is
`flax_encoder.pytorch.reference` (imports torch); the parity report, against that port or
against your own module, is `python -m flax_encoder.pytorch.parity`.
"""

from flax_encoder.pytorch.convert import (
    config_from_torch_state_dict,
    from_torch_state_dict,
    load_torch_checkpoint,
    to_torch_state_dict,
)
from flax_encoder.pytorch.layouts import LAYOUTS, EncoderKeys, expected_shapes, find_encoder

__all__ = ["LAYOUTS", "EncoderKeys", "config_from_torch_state_dict", "expected_shapes",
           "find_encoder", "from_torch_state_dict", "load_torch_checkpoint",
           "to_torch_state_dict"]
