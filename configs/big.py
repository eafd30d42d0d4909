r"""The paper's big model (d_model 1024, 16 heads, d_ff 4096, 6 layers, dropout 0.3).

  python -m train --config=configs/big.py --workdir=runs/big

bfloat16 compute, float32 parameters; needs an accelerator with tens of GiB. As for base.py,
prepare your corpus with python -m train.prepare and pass --config.data.prepared.
"""

from configs import base


def get_config():
  config = base.get_config()
  config.model.update(d_model=1024, n_heads=16, d_ff=4096, dropout=0.3)
  config.train.num_steps = 300_000  # paper: 300k steps for the big model
  return config
