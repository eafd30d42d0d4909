r"""A smaller encoder for a CPU: d_model 312, 6 heads, d_ff 1248, 3 layers, 80 positions.

  python -m train --config=configs/small.py --workdir=runs/small

The default task and schedule with a wider, shallower model on 80-byte windows; slower per step
than the default on a CPU.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.model.update(d_model=312, n_heads=6, d_ff=4 * 312, n_layers=3, max_len=80)
  config.model.dropout = 0.05  # a light regulariser for the wider model
  config.train.seq_len = 80  # = max_len
  return config
