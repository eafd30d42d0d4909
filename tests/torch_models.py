"""PyTorch models as users write them, for the interop and parity tests (and the parity CLI's
--module / --call in them): an encoder built from torch.nn.TransformerEncoder, and the tutorial
port nested inside a model with an output layer."""

import math

import torch
from torch import nn

from flax_encoder import EncoderConfig
from flax_encoder.pytorch import reference

CONFIG = EncoderConfig(vocab_size=11, d_model=8, n_heads=2, d_ff=12, n_layers=2, max_len=10)


class TorchNNModel(nn.Module):
  """Embedding, the tutorial's sinusoid table, a torch.nn.TransformerEncoder container and an
  output layer: keys embedding.weight, pos_encoder.pe, encoder.layers.{i}…, encoder.norm…,
  head…"""

  def __init__(self, config=CONFIG, norm_first=False, eps=None):
    super().__init__()
    c = self.config = config
    eps = c.layer_norm_eps if eps is None else eps
    self.embedding = nn.Embedding(c.vocab_size, c.d_model)
    self.pos_encoder = reference.PositionalEncoding(c.d_model, c.dropout, c.max_len)
    layer = nn.TransformerEncoderLayer(c.d_model, c.n_heads, c.d_ff, c.dropout,
                                       activation=c.activation, layer_norm_eps=eps,
                                       batch_first=True, norm_first=norm_first)
    norm = nn.LayerNorm(c.d_model, eps=eps) if c.final_norm else None
    self.encoder = nn.TransformerEncoder(layer, c.n_layers, norm=norm,
                                         enable_nested_tensor=False)
    self.head = nn.Linear(c.d_model, c.vocab_size)

  def hidden(self, tokens):
    x = self.pos_encoder(self.embedding(tokens) * math.sqrt(self.config.d_model))
    return self.encoder(x, src_key_padding_mask=tokens == self.config.pad_id)

  def forward(self, tokens):
    return self.head(self.hidden(tokens))


class Classifier(nn.Module):
  """The tutorial port as `encoder` inside a model with an output layer."""

  def __init__(self, config=CONFIG):
    super().__init__()
    self.encoder = reference.Encoder(config)
    self.head = nn.Linear(config.d_model, config.vocab_size)

  def forward(self, tokens):
    return self.head(self.encoder(tokens))


def build():
  torch.manual_seed(0)
  return TorchNNModel()


def build_pre_ln():
  torch.manual_seed(0)
  return TorchNNModel(norm_first=True)


def run(module, tokens):
  """The encoder's output of a TorchNNModel (its forward adds the output layer)."""
  return module.hidden(tokens)


BUILT = []  # every module build_encoder made, for tests to look at after the report ran


def build_encoder():
  """The tutorial port alone: a module whose weights sit under a prefix in a bigger model's
  training checkpoint (a Classifier's `encoder.`)."""
  torch.manual_seed(1)
  BUILT.append(reference.Encoder(CONFIG))
  return BUILT[-1]
