"""The PyTorch tutorial port of the encoder: the reference the Flax modules must match.

Post-LN layers with separate w_q/w_k/w_v/w_o projections and a w_1/w_2 feed-forward, masked
scores filled with -1e9, LayerNorm eps 1e-5, embedding * sqrt(d_model), interleaved sinusoids
and a final LayerNorm. Module names are the state-dict names of the "tutorial" layout;
`layout="torch_nn"` builds the layers from torch.nn.TransformerEncoderLayer instead. Mask
polarity: True / 1 = attend. Used by the parity report and the tests; importing it imports torch.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from flax_encoder.reference_attention import MASK_FILL
from flax_encoder.config import EncoderConfig
from flax_encoder.pytorch.layouts import check_layout


def scaled_dot_product_attention(q, k, v, mask=None, dropout: nn.Module | None = None):
  """q, k, v [batch, heads, seq, head_dim]; masked scores filled with -1e9 (not -inf)."""
  scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(k.size(-1))
  if mask is not None:
    scores = scores.masked_fill(mask == 0, MASK_FILL)
  weights = torch.softmax(scores, dim=-1)
  dropped = dropout(weights) if dropout is not None else weights
  return torch.matmul(dropped, v), weights


class MultiHeadAttention(nn.Module):

  def __init__(self, d_model: int, n_heads: int, attention_dropout: float = 0.0):
    super().__init__()
    self.n_heads, self.head_dim = n_heads, d_model // n_heads
    self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))
    self.attention_dropout = nn.Dropout(attention_dropout)

  def forward(self, q, k, v, mask=None):
    batch = q.size(0)
    split = lambda x: x.view(batch, -1, self.n_heads, self.head_dim).transpose(1, 2)
    context, weights = scaled_dot_product_attention(
        split(self.w_q(q)), split(self.w_k(k)), split(self.w_v(v)), mask, self.attention_dropout)
    context = context.transpose(1, 2).reshape(batch, -1, self.n_heads * self.head_dim)
    return self.w_o(context), weights


class PositionwiseFeedForward(nn.Module):

  def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu"):
    super().__init__()
    self.w_1, self.w_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
    self.activation = nn.ReLU() if activation == "relu" else nn.GELU()
    self.dropout = nn.Dropout(dropout)

  def forward(self, x):
    return self.w_2(self.dropout(self.activation(self.w_1(x))))


class EncoderLayer(nn.Module):

  def __init__(self, config: EncoderConfig):
    super().__init__()
    c = config
    self.norm_first = c.norm_position == "pre"
    self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout)
    self.feed_forward = PositionwiseFeedForward(c.d_model, c.d_ff, c.dropout, c.activation)
    self.norm1 = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
    self.norm2 = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
    self.dropout1, self.dropout2 = nn.Dropout(c.dropout), nn.Dropout(c.dropout)

  def forward(self, x, mask=None):
    if self.norm_first:
      h = self.norm1(x)
      x = x + self.dropout1(self.self_attn(h, h, h, mask)[0])
      return x + self.dropout2(self.feed_forward(self.norm2(x)))
    x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, mask)[0]))
    return self.norm2(x + self.dropout2(self.feed_forward(x)))


class PositionalEncoding(nn.Module):

  def __init__(self, d_model: int, dropout: float, max_len: int,
               table_dtype: torch.dtype = torch.float32, persistent: bool = True):
    super().__init__()
    self.dropout = nn.Dropout(dropout)
    position = torch.arange(max_len, dtype=table_dtype).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=table_dtype)
                         * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model, dtype=table_dtype)
    pe[:, 0::2] = torch.sin(position * inv_freq)
    pe[:, 1::2] = torch.cos(position * inv_freq)
    self.register_buffer("pe", pe.unsqueeze(0), persistent=persistent)

  def forward(self, x):
    return self.dropout(x + self.pe[:, :x.size(1)].to(x.dtype))


class Encoder(nn.Module):
  """embedding * sqrt(d_model) + positions, dropout, N layers, final LayerNorm."""

  def __init__(self, config: EncoderConfig, layout: str = "tutorial",
               table_dtype: torch.dtype = torch.float32):
    super().__init__()
    check_layout(layout)
    c = self.config = config
    self.layout = layout
    self.embedding = nn.Embedding(c.vocab_size, c.d_model)
    self.pos_encoder = PositionalEncoding(c.d_model, c.dropout, c.max_len, table_dtype,
                                          persistent=layout == "tutorial")
    if layout == "tutorial":
      layers = [EncoderLayer(c) for _ in range(c.n_layers)]
    else:
      layers = [nn.TransformerEncoderLayer(
          c.d_model, c.n_heads, c.d_ff, c.dropout, activation=c.activation,
          layer_norm_eps=c.layer_norm_eps, batch_first=True, norm_first=c.norm_position == "pre")
                for _ in range(c.n_layers)]
    self.layers = nn.ModuleList(layers)
    self.norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.final_norm else None

  def forward(self, src, mask=None):
    """src: int [batch, seq]; mask: bool True = attend, [batch, 1, 1|seq, seq]; default padding."""
    if mask is None:
      mask = (src != self.config.pad_id).unsqueeze(1).unsqueeze(2)
    x = self.pos_encoder(self.embedding(src) * math.sqrt(self.config.d_model))
    if self.layout == "torch_nn":
      # nn.MultiheadAttention fills with -inf (NaN for an all-masked row) and uses the opposite
      # polarity; an additive -1e9 float mask matches the fill on every row with a real key.
      batch, seq = src.shape
      additive = torch.zeros(mask.shape, dtype=x.dtype).masked_fill(~mask.bool(), MASK_FILL)
      heads = self.config.n_heads
      attn_mask = additive.expand(batch, heads, seq, seq).reshape(batch * heads, seq, seq)
      for layer in self.layers:
        x = layer(x, src_mask=attn_mask)
    else:
      for layer in self.layers:
        x = layer(x, mask)
    return self.norm(x) if self.norm is not None else x
