r"""The built-in default: a small Post-LN encoder learning masked bytes on a 2-core CPU.

  python -m train --workdir runs/demo

Trains on the standard library's pydoc topics (~460 KB, no download) for 1200 steps of 64
windows of 64 bytes: a few minutes on 2 CPU cores. README, "Quick start", has the measured
time and accuracy, against always guessing the most frequent byte.
"""

import ml_collections
from ml_collections import config_dict

from flax_encoder.config import EncoderConfig


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()

  # Every field of flax_encoder.EncoderConfig at the library's default (flax_encoder/config.py
  # says what each does: the paper's encoder, and the switches that make BERT, RoBERTa,
  # DistilBERT, ALBERT, MPNet and ModernBERT of it), but pad_id, which is the data's.
  config.model = model = ml_collections.ConfigDict(
      {name: value for name, value in EncoderConfig.defaults().items() if name != "pad_id"})
  # Unset: taken from the data (260 for bytes: 256 + pad, mask, separator and one unused id).
  model.vocab_size = config_dict.placeholder(int)
  # This config's own sizes: a small Post-LN encoder (the paper's Add & Norm, ReLU, sinusoids,
  # LayerNorm eps 1e-5 as PyTorch's) that trains in minutes on a CPU.
  model.d_model = 128
  model.n_heads = 4
  model.d_ff = 512  # 4 x d_model, as in the paper
  model.n_layers = 3
  # The paper's 0.1 regularises long runs; this short one underfits, and learns faster without.
  model.dropout = 0.0
  model.attention_dropout = 0.0
  model.max_len = 512  # positions in the sinusoid table; >= train.seq_len
  # Execution: model.dtype "bfloat16" computes in mixed precision on GPU/TPU;
  # model.attention_impl "xla", "cudnn" on NVIDIA GPUs with bfloat16, "triton" (GPU) and
  # "splash" (TPU) take the documents' segment ids in a flash-attention kernel (seq_len a
  # multiple of 128); model.scan_layers True compiles in a time independent of depth;
  # model.remat "full" or "save_dots" trades compute for activation memory.

  config.data = ml_collections.ConfigDict()
  # A directory python -m train.prepare wrote (any size, any tokenizer), or several as one
  # dataset: comma-separated directories or globs ('data/part-*', 'data/web,data/code'); else
  # windows of bytes are cut from config.data.paths, small UTF-8 files, or the built-in corpus.
  config.data.prepared = config_dict.placeholder(str)
  # One weight per entry of config.data.prepared ('0.7,0.3'): batches draw windows from the
  # entries in these proportions; unset: uniformly over all their windows.
  config.data.weights = config_dict.placeholder(str)
  config.data.paths = ()
  config.data.eval_fraction = 0.05  # held-out fraction of the windows (of config.data.paths)
  config.data.max_eval_windows = 4096  # each evaluation reads the first ones of those
  # grain worker processes reading batches (0: a thread of the training process, which keeps up
  # with an accelerator: BENCHMARKS.md, "Input pipeline").
  config.data.workers = 0

  # Masked-token prediction (train.tasks.masked_lm): what is predicted and the output layer.
  # Further pretraining of a Hugging Face BERT, RoBERTa or DistilBERT directory (its encoder
  # and masked-LM head; config.model's architecture fields do not apply, its training and
  # execution fields do) on a corpus prepared with its ids: python -m train.prepare
  # --tokenizer DIR ... then --config.data.prepared=...
  config.init = ml_collections.ConfigDict()
  config.init.hf = config_dict.placeholder(str)
  # A directory without a masked-LM head (a bare BertModel, a sentence-transformers model) is
  # refused unless this is True: then the head (dense, LayerNorm, output bias; its decoder the
  # word embeddings) starts afresh.
  config.init.fresh_head = False

  config.task = ml_collections.ConfigDict()
  # The task: "masked_lm" (pretraining); fine-tuning is "classify", "regress" or "tag"
  # (configs/classify.py, regress.py, tag.py).
  config.task.name = "masked_lm"
  # Fraction of each window's tokens to predict (of them 80% masked, 10% random, 10% kept),
  # drawn on the device at every step, as BERT; padding and separators are never predicted.
  config.task.mask_rate = 0.15
  # Positions predicted per window, as BERT's max_predictions_per_seq; unset: enough for
  # mask_rate of a full window, ceil(mask_rate * seq_len).
  config.task.max_predictions_per_seq = config_dict.placeholder(int)
  config.task.tie_embeddings = False  # True: logits from the embedding table, as BERT
  # The documents packed into a window: False keeps them apart (each attends only to itself,
  # its positions counted from its start, as if it were alone), True lets them see each other.
  # BENCHMARKS.md ("Documents apart, gradient accumulation") has both measured, accuracy and
  # step time.
  config.task.cross_document_attention = False

  config.optim = ml_collections.ConfigDict()
  # "paper": Adam with the paper's warm-up then 1/sqrt(step) (lr_scale, warmup_steps);
  # "adamw": AdamW at learning_rate, warm-up then linear decay to 0 at num_steps, weight_decay
  # on weights but not biases or LayerNorm scales (the usual fine-tuning recipe). recipe,
  # warmup_steps, learning_rate and weight_decay unset (configs/classify.py) take the
  # recipe's for where the encoder starts (train/run/optim.py, resolve).
  config.optim.recipe = "paper"
  config.optim.warmup_steps = 200  # steps of linear warm-up (the paper: 4000 at 100k steps)
  # Peak lr = lr_scale * d_model^-0.5 * warmup^-0.5: 0.5 gives 3.1e-3. Post-LN layers are
  # sensitive to the peak rate; twice that was sometimes unstable early at this size.
  config.optim.lr_scale = 0.5
  config.optim.b1 = 0.9  # paper
  config.optim.b2 = 0.98  # paper
  config.optim.eps = 1e-9  # paper
  config.optim.learning_rate = 1e-4  # "adamw": the peak learning rate
  config.optim.weight_decay = 0.01  # "adamw": decoupled weight decay
  config.optim.label_smoothing = 0.1  # paper; the eval loss is reported without it
  config.optim.clip_norm = config_dict.placeholder(float)  # global-norm clipping; unset = off

  # Device mesh (flax_encoder.sharding): batch rows split over data x fsdp; fsdp also splits
  # parameters and optimizer state. -1 = all devices left over. One CPU: a 1 x 1 mesh.
  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = -1
  config.mesh.fsdp = 1

  config.train = ml_collections.ConfigDict()
  config.train.num_steps = 1200
  # Passes over the training rows instead of num_steps (then unset): ceil(epochs * rows /
  # batch_size) steps, evaluated and saved once per epoch where eval_every and
  # checkpoint_every are unset (configs/classify.py; a pretraining config sets num_steps).
  config.train.epochs = config_dict.placeholder(float)
  # 64-byte windows: a masked byte is predicted mostly from its neighbours, and halving the
  # window from 128 nearly doubles the tokens/s (attention's cost grows with its square).
  config.train.batch_size = 64  # windows per step
  config.train.seq_len = 64  # bytes per window
  config.train.seed = 0  # parameters, dropout, data order and masking all follow from it
  config.train.log_every = 25  # steps between train records (and the only host syncs)
  # Steps between evaluations on the held-out split, and between checkpoints; both also at
  # the last step. Unset: once per epoch with epochs, else every 200 steps.
  config.train.eval_every = 200
  config.train.eval_at_start = False  # also evaluate the starting parameters, at step 0
  config.train.checkpoint_every = 400
  config.train.keep_checkpoints = 3  # newest checkpoints kept
  # Microbatches per step: each update averages the gradients of k microbatches of
  # batch_size / k rows, one after the other on the device, so a batch k times the memory fits.
  config.train.grad_accum_steps = 1
  # A JAX profiler trace of steps profile_start … profile_start + profile_steps - 1, written by
  # process 0 under WORKDIR/profile (TensorBoard's profile plugin or Perfetto read it); 0 = off.
  config.train.profile_start = 10
  config.train.profile_steps = 0
  return config
