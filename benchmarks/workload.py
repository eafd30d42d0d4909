"""What the benchmarks run: the training step of `python -m train`, and the same on PyTorch.

The JAX side is `train`'s own: `MaskedLM` (encoder + output layer), `init_state`, `train_step`
with the paper's Adam and warm-up schedule and label smoothing, on a batch masked by
`train.data.mask_tokens`. The PyTorch side is the tutorial port (`flax_encoder.pytorch.reference`)
with the same weights, the same output layer, loss, optimizer and schedule.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from configs import default
from flax_encoder import Encoder, EncoderConfig
from train import data
from train.loop import init_state, train_step
from train.optim import make_optimizer
from train.task import MaskedLM

VOCAB_SIZE = 8192  # the output layer's width; byte-level training uses 260


def paper_base(**overrides) -> EncoderConfig:
  """The paper's base encoder (d_model 512, 8 heads, d_ff 2048, 6 layers, dropout 0.1)."""
  return EncoderConfig.base(VOCAB_SIZE, max_len=512, **overrides)


def optim_config():
  """The training program's optimizer settings with the paper's 4000 warm-up steps."""
  optim = default.get_config().optim
  optim.warmup_steps = 4000
  optim.lr_scale = 1.0
  return optim


def flops_per_token(cfg: EncoderConfig, seq: int, train: bool) -> float:
  """2 N_matmul + 4 L d seq for a forward without output layer; 6 (N_matmul + N_head) +
  12 L d seq for a training step (the standard count, as in the PaLM paper's appendix)."""
  n_matmul = cfg.n_layers * (4 * cfg.d_model**2 + 2 * cfg.d_model * cfg.d_ff)
  attention = cfg.n_layers * cfg.d_model * seq
  if train:
    return 6 * (n_matmul + cfg.d_model * cfg.vocab_size) + 12 * attention
  return 2 * n_matmul + 4 * attention


def masked_batch(cfg: EncoderConfig, batch: int, seq: int, seed: int = 0) -> dict:
  """Random ids, 15% of them corrupted and predicted, as the training pipeline builds them."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(data.NUM_SPECIAL, cfg.vocab_size, (batch, seq)).astype(np.int32)
  return data.mask_tokens(tokens, 0.15, rng)


def jax_side(cfg: EncoderConfig, batch: int, seq: int, seed: int = 0):
  """(forward runner, train runner, params, host batch) on the JAX side.

  The train runner returns the step's loss; it calls `train.loop.train_step` jitted with the
  state donated, as the training loop does; the forward runner the encoder alone, as inference
  does.
  """
  host_batch = masked_batch(cfg, batch, seq, seed)
  device_batch = jax.device_put(host_batch)
  model = MaskedLM(cfg)
  optim = optim_config()
  tx, schedule = make_optimizer(optim, cfg.d_model)
  state = [init_state(model, tx, seed, 1, seq)]
  params = jax.tree.map(np.asarray, state[0].params)  # a host copy: the state is donated
  step = jax.jit(functools.partial(train_step, model=model, tx=tx, schedule=schedule,
                                   label_smoothing=optim.label_smoothing), donate_argnums=0)
  forward = jax.jit(lambda p, t: Encoder(cfg).apply({"params": p}, t))
  encoder_params = jax.device_put(params["encoder"])
  tokens = jnp.asarray(host_batch["targets"])

  def run_forward():
    forward(encoder_params, tokens).block_until_ready()

  def run_train():
    state[0], metrics = step(state[0], device_batch)
    return metrics["loss"].block_until_ready()

  return run_forward, run_train, params, host_batch


def torch_side(cfg: EncoderConfig, params, host_batch: dict, compile_: bool):
  """(forward runner, train runner) for the PyTorch tutorial port with the same weights.

  The train runner returns the step's loss, which matches the JAX side's (tests/test_benchmarks).
  """
  import torch

  from flax_encoder.pytorch import reference, to_torch_state_dict

  dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype.name]
  encoder = reference.Encoder(cfg)
  encoder.load_state_dict(to_torch_state_dict({"params": params["encoder"]}, cfg))
  head = torch.nn.Linear(cfg.d_model, cfg.vocab_size)
  head.weight.data = torch.from_numpy(np.asarray(params["head"]["kernel"]).T.copy())
  head.bias.data = torch.from_numpy(np.asarray(params["head"]["bias"]).copy())
  device = "cuda" if torch.cuda.is_available() and jax.default_backend() == "gpu" else "cpu"
  encoder, head = encoder.to(device), head.to(device)
  as_tensor = lambda x: torch.from_numpy(np.asarray(x)).to(device)
  inputs, targets = as_tensor(host_batch["inputs"]).long(), as_tensor(host_batch["targets"]).long()
  weights = as_tensor(host_batch["weights"]).flatten()
  model = torch.nn.Sequential(encoder, head)
  eval_encoder = encoder
  if compile_:
    model = torch.compile(model)
    eval_encoder = torch.compile(encoder)
  optim = optim_config()
  _, schedule = make_optimizer(optim, cfg.d_model)
  optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(optim.b1, optim.b2),
                               eps=optim.eps)
  lr = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda count: float(schedule(count)))
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  autocast = functools.partial(torch.autocast, device_type=device, dtype=dtype,
                               enabled=dtype != torch.float32)

  def run_forward():
    encoder.eval()
    with torch.inference_mode(), autocast():
      eval_encoder(targets)
    sync()

  def run_train():
    model.train()
    optimizer.zero_grad(set_to_none=True)
    with autocast():
      logits = model(inputs)
    losses = torch.nn.functional.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten(), reduction="none",
        label_smoothing=optim.label_smoothing)
    loss = (losses * weights).sum() / weights.sum().clamp(min=1.0)
    loss.backward()
    optimizer.step()
    lr.step()
    sync()
    return loss.detach()

  return run_forward, run_train
