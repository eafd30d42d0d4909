"""flax_encoder: the Transformer encoder of "Attention Is All You Need" in Flax linen.

Computes what the PyTorch tutorial port of the encoder computes (Post-LN, -1e9 mask fill,
LayerNorm eps 1e-5, embedding * sqrt(d_model), interleaved sinusoids). Importing it imports no
torch: the PyTorch bridge (weight conversion, the reference port, the parity report) is
`flax_encoder.pytorch`, behind the `torch` extra.
"""

from flax_encoder.attention import (
    MASK_FILL,
    MultiHeadAttention,
    scaled_dot_product_attention,
)
from flax_encoder.config import ConfigError, EncoderConfig
from flax_encoder.dropout import Dropout
from flax_encoder.embedding import PositionalEncoding, sinusoidal_positions
from flax_encoder.encoder import Encoder, stack_layers, unstack_layers
from flax_encoder.feed_forward import PositionwiseFeedForward
from flax_encoder.inputs import check_token_shape, check_token_values, checked_apply
from flax_encoder.layer import EncoderLayer
from flax_encoder.masks import padding_mask
from flax_encoder.packing import segment_mask, segment_positions

__all__ = [
    "MASK_FILL", "ConfigError", "Dropout", "Encoder", "EncoderConfig", "EncoderLayer", "MultiHeadAttention",
    "PositionalEncoding", "PositionwiseFeedForward", "check_token_shape", "check_token_values",
    "checked_apply", "padding_mask", "scaled_dot_product_attention", "segment_mask",
    "segment_positions", "sinusoidal_positions", "stack_layers", "unstack_layers",
]
