"""A training config small enough for tests: a few seconds per run on 2 CPU cores."""

from configs import default


def get_config():
  config = default.get_config()
  config.model.update(d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=32, dropout=0.1)
  config.optim.warmup_steps = 10
  config.optim.lr_scale = 2.0
  config.train.update(num_steps=30, batch_size=8, seq_len=32, log_every=1, eval_every=15,
                      checkpoint_every=8, keep_checkpoints=5)
  return config
