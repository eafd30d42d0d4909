r"""The smaller encoder of seed 003 (d_model 312, 6 heads, d_ff 4x, 3 layers, max_len 80), done right.

  python -m train --config=configs/book.py --workdir=runs/book

Residual Add & Norm in every layer, scores scaled by 1/sqrt(head_dim), the padding mask on the
keys with True = attend, separate weights per layer. Runs on a CPU (slower than the default).
"""

from configs import default


def get_config():
  config = default.get_config()
  # Seed 003 applied one shared attention and feed-forward module n times, with no residuals, no
  # 1/sqrt(d) scale, ReLU and LayerNorm after the second linear, and mask*-1e5 that penalised
  # the real tokens (mask = tokens != 0) on the query axis instead of the padding keys.
  config.model.update(d_model=312, n_heads=6, d_ff=4 * 312, n_layers=3, max_len=80)
  config.model.dropout = 0.05  # the seed's positional dropout
  config.train.seq_len = 80  # = max_len
  return config
