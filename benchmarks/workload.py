"""What the benchmarks run: the training step of `python -m train`, and the same on PyTorch.

The JAX side is `train`'s own: `MaskedLM` (encoder + output layer at the masked positions),
`init_state`, `train_step` (which masks the batch's token ids, as `train.task.mask_tokens`
draws them) with the paper's Adam and warm-up schedule and label smoothing. The PyTorch side is
the tutorial port (`flax_encoder.pytorch.reference`) with the same weights, the same masked
batches, output layer, loss, optimizer and schedule.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from configs import default
from flax_encoder import Encoder, EncoderConfig
from train.loop import init_state, step_keys, train_step
from train.optim import make_optimizer
from train.prepare import FIRST_TOKEN_ID
from train.task import MaskedLM, mask_tokens, predictions_per_row

VOCAB_SIZE = 8192  # the output layer's width; byte-level training uses 260
MASK_RATE = 0.15  # configs/default.py's


def paper_base(**overrides) -> EncoderConfig:
  """The paper's base encoder (d_model 512, 8 heads, d_ff 2048, 6 layers, dropout 0.1)."""
  return EncoderConfig.base(VOCAB_SIZE, max_len=512, **overrides)


def optim_config():
  """The training program's optimizer settings with the paper's 4000 warm-up steps."""
  optim = default.get_config().optim
  optim.warmup_steps = 4000
  optim.lr_scale = 1.0
  return optim


def flops_per_token(cfg: EncoderConfig, seq: int, train: bool,
                    predicted: float = 1.0) -> float:
  """2 N_matmul + 4 L d seq for a forward without output layer; 6 (N_matmul + predicted
  N_head) + 12 L d seq for a training step whose output layer runs on a `predicted` fraction of
  the positions (the standard count, as in the PaLM paper's appendix)."""
  n_matmul = cfg.n_layers * (4 * cfg.d_model**2 + 2 * cfg.d_model * cfg.d_ff)
  attention = cfg.n_layers * cfg.d_model * seq
  if train:
    return 6 * (n_matmul + predicted * cfg.d_model * cfg.vocab_size) + 12 * attention
  return 2 * n_matmul + 4 * attention


def predictions(seq: int) -> int:
  """Positions the output layer runs on per row, as training has it at mask_rate 0.15."""
  return predictions_per_row(MASK_RATE, seq)


def jax_side(cfg: EncoderConfig, batch: int, seq: int, seed: int = 0, steps_masked: int = 8,
             head_at_every_position: bool = False):
  """(forward runner, train runner, params, host batches) on the JAX side.

  The train runner returns the step's loss; it calls `train.loop.train_step` jitted with the
  state donated, as the training loop does, on one batch of random token ids (masked in the
  step); the forward runner the encoder alone, as inference does. The host batches are the
  first `steps_masked` steps' masked batches, for the PyTorch side.
  """
  rng = np.random.default_rng(seed)
  tokens = rng.integers(FIRST_TOKEN_ID, cfg.vocab_size, (batch, seq))
  tokens = jnp.asarray(tokens.astype(np.min_scalar_type(cfg.vocab_size - 1)))
  model = MaskedLM(cfg, head_at_every_position=head_at_every_position)
  optim = optim_config()
  tx, schedule = make_optimizer(optim, cfg.d_model)
  masking = functools.partial(mask_tokens, mask_rate=MASK_RATE, vocab_size=cfg.vocab_size,
                              predictions=predictions(seq))
  state = [init_state(model, tx, seed, 1, seq)]
  params = jax.tree.map(np.asarray, state[0].params)  # a host copy: the state is donated
  mask_at = jax.jit(lambda rng, step: masking(tokens, step_keys(rng, step)[1]))
  host_batches = [jax.device_get(mask_at(state[0].rng, i)) for i in range(steps_masked)]
  step = jax.jit(functools.partial(train_step, model=model, tx=tx, schedule=schedule,
                                   masking=masking, label_smoothing=optim.label_smoothing),
                 donate_argnums=0)
  forward = jax.jit(lambda p, t: Encoder(cfg).apply({"params": p}, t))
  encoder_params = jax.device_put(params["encoder"])

  def run_forward():
    forward(encoder_params, tokens).block_until_ready()

  def run_train():
    state[0], metrics = step(state[0], tokens)
    return metrics["loss"].block_until_ready()

  return run_forward, run_train, params, host_batches


def torch_side(cfg: EncoderConfig, params, host_batches: list[dict], compile_: bool):
  """(forward runner, train runner) for the PyTorch tutorial port with the same weights.

  Step k of the train runner trains on `host_batches[k % len(host_batches)]` (the JAX side's
  masked batch of step k) and returns its loss, which matches the JAX side's
  (tests/test_benchmarks).
  """
  import torch

  from flax_encoder.pytorch import reference, to_torch_state_dict

  class TorchMaskedLM(torch.nn.Module):
    """The encoder, then the output layer at the chosen positions only."""

    def __init__(self, encoder, head):
      super().__init__()
      self.encoder, self.head = encoder, head

    def forward(self, inputs, positions):
      hidden = self.encoder(inputs)
      at = positions[..., None].expand(-1, -1, hidden.shape[-1])
      return self.head(torch.gather(hidden, 1, at))

  dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype.name]
  encoder = reference.Encoder(cfg)
  encoder.load_state_dict(to_torch_state_dict({"params": params["encoder"]}, cfg))
  head = torch.nn.Linear(cfg.d_model, cfg.vocab_size)
  head.weight.data = torch.from_numpy(np.asarray(params["head"]["kernel"]).T.copy())
  head.bias.data = torch.from_numpy(np.asarray(params["head"]["bias"]).copy())
  device = "cuda" if torch.cuda.is_available() and jax.default_backend() == "gpu" else "cpu"
  model = TorchMaskedLM(encoder, head).to(device)
  batches = [{k: torch.from_numpy(np.array(v)).to(device) for k, v in b.items()}
             for b in host_batches]
  for b in batches:
    b["inputs"], b["positions"] = b["inputs"].long(), b["positions"].long()
    b["targets"], b["weights"] = b["targets"].long().flatten(), b["weights"].flatten()
  tokens = batches[0]["inputs"]
  eval_encoder, train_model = model.encoder, model
  if compile_:
    train_model = torch.compile(model)
    eval_encoder = torch.compile(model.encoder)
  optim = optim_config()
  _, schedule = make_optimizer(optim, cfg.d_model)
  optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(optim.b1, optim.b2),
                               eps=optim.eps)
  lr = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda count: float(schedule(count)))
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  autocast = functools.partial(torch.autocast, device_type=device, dtype=dtype,
                               enabled=dtype != torch.float32)
  next_batch = itertools.cycle(batches).__next__

  def run_forward():
    model.eval()
    with torch.inference_mode(), autocast():
      eval_encoder(tokens)
    sync()

  def run_train():
    b = next_batch()
    model.train()
    optimizer.zero_grad(set_to_none=True)
    with autocast():
      logits = train_model(b["inputs"], b["positions"])
    losses = torch.nn.functional.cross_entropy(
        logits.float().flatten(0, 1), b["targets"], reduction="none",
        label_smoothing=optim.label_smoothing)
    loss = (losses * b["weights"]).sum() / b["weights"].sum().clamp(min=1.0)
    loss.backward()
    optimizer.step()
    lr.step()
    sync()
    return loss.detach()

  return run_forward, run_train
