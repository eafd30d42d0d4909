r"""The paper's base model (d_model 512, 8 heads, d_ff 2048, 6 layers) for a GPU or TPU.

  python -m train.prepare --input 'corpus/**/*.txt' --out data/corpus \
      --tokenizer sentencepiece --vocab-size 32000 --seq-len 512
  python -m train --config=configs/base.py --workdir=runs/base --config.data.prepared=data/corpus

bfloat16 compute with float32 parameters, the paper's 4000 warm-up steps. Without
config.data.prepared it trains on the built-in corpus (460 KB of bytes), which this model
overfits long before 100k steps: a check that the program runs, not a pretraining.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.model.update(d_model=512, n_heads=8, d_ff=2048, n_layers=6, dropout=0.1,
                      dtype="bfloat16", attention_impl="xla")
  config.optim.warmup_steps = 4000  # paper
  config.optim.lr_scale = 1.0  # paper: peak 7.0e-4 at step 4000
  config.train.update(num_steps=100_000, batch_size=128, seq_len=512, log_every=100,
                      eval_every=2000, checkpoint_every=2000)
  return config
