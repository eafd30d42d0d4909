"""The tiny training setup the tests share: a config that trains in seconds on 2 CPU cores
(also a config file for `python -m train --config=tests/tiny.py`), and its task, optimizer,
batches and jitted step."""

import tempfile

import jax
import numpy as np

from configs import default


def get_config():
  config = default.get_config()
  config.model.update(d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=32, dropout=0.1)
  config.optim.warmup_steps = 10
  config.optim.lr_scale = 2.0
  config.train.update(num_steps=30, batch_size=8, seq_len=32, log_every=1, eval_every=15,
                      checkpoint_every=8, keep_checkpoints=5)
  return config


def setup(config=None):
  """(config, task, tx, schedule) of the tiny config on the byte corpus."""
  from train.run import settings
  from train.tasks import masked_lm
  from train.run.optim import make_optimizer
  from train.data.tokens import BYTE_VOCAB_SIZE, FIRST_TOKEN_ID

  config = config or get_config()
  cfg = settings.encoder_config(config.model, BYTE_VOCAB_SIZE, "bytes", config.train.seq_len)
  task = masked_lm.task(config, cfg, baseline_token=FIRST_TOKEN_ID + ord(" "))
  tx, schedule = make_optimizer(config.optim, cfg.d_model, config.train.num_steps)
  return config, task, tx, schedule


def state(task, tx, config, seed=0, mesh=None):
  from train.run.step import init_state
  return init_state(task, tx, seed, config.train.seq_len, mesh)


def batches(config, seed=0, rows=None):
  """The training pipeline over the built-in corpus, at its start: this process's rows (or
  `rows` of each global batch)."""
  from train.data import dataset, pipeline, prepare
  with tempfile.TemporaryDirectory() as directory:
    prepare.prepare([prepare.BUILTIN], directory + "/data", seq_len=config.train.seq_len,
                    eval_fraction=config.data.eval_fraction, workers=1, progress=False)
    train = np.array(dataset.load_prepared(directory + "/data", config.train.seq_len).train)
  return pipeline.TrainBatches(train, config.train.batch_size, seed, rows=rows)


def jitted_step(task, tx, schedule):
  from train.run.step import make_train_step
  return jax.jit(make_train_step(task, tx, schedule))
