"""What the benchmarks run: the training step of `python -m train`, and the same on PyTorch.

The JAX side is `train`'s own, built from configs/base.py: the masked-token task
(`train.tasks.masked_lm`: encoder + output layer at the masked positions, label smoothing),
`init_state` and the step of `train.run.step.make_train_step` (which masks the batch's token ids)
with the paper's Adam and warm-up schedule. The PyTorch side is the tutorial port
(`flax_encoder.pytorch.reference`) with the same weights, the same masked batches, output
layer, loss, optimizer and schedule.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from configs import base
from flax_encoder import Encoder, EncoderConfig
from train.data.tokens import FIRST_TOKEN_ID
from train.run import settings
from train.run.optim import make_optimizer
from train.run.step import init_state, make_train_step, step_keys
from train.tasks import masked_lm

VOCAB_SIZE = 8192  # the output layer's width; byte-level training uses 260


def paper_config() -> ml_collections.ConfigDict:
  """configs/base.py: the paper's base model, optimizer (4000 warm-up steps) and task."""
  return base.get_config()


def paper_optimizer(cfg: EncoderConfig):
  """(tx, schedule): configs/base.py's optimizer for the encoder `cfg`."""
  config = paper_config()
  return make_optimizer(config.optim, cfg.d_model, config.train.num_steps)


def paper_base(**overrides) -> EncoderConfig:
  """configs/base.py's encoder (d_model 512, 8 heads, d_ff 2048, 6 layers, dropout 0.1) with
  the benchmark's vocabulary; float32 with the reference attention unless `overrides` say
  otherwise (the config's bfloat16 and "xla" are its choices for accelerators)."""
  config = paper_config()
  cfg = settings.encoder_config(config.model, VOCAB_SIZE, "the benchmark", config.train.seq_len)
  return dataclasses.replace(cfg, **{"dtype": "float32", "attention_impl": "reference",
                                     **overrides})


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


def paper_task(cfg: EncoderConfig, seq: int, cross_document_attention: bool | None = None,
               **model_options) -> masked_lm.MaskedLMTask:
  """configs/base.py's masked-token task at windows of `seq`, for the encoder `cfg`
  (`cross_document_attention`: the config's unless given)."""
  config = paper_config()
  config.train.seq_len = seq
  if cross_document_attention is not None:
    config.task.cross_document_attention = cross_document_attention
  task = masked_lm.task(config, cfg, baseline_token=FIRST_TOKEN_ID)
  return dataclasses.replace(task, model=dataclasses.replace(task.model, **model_options))


def compiled_train_step(cfg: EncoderConfig, batch: int, seq: int, grad_accum_steps: int = 1,
                        cross_document_attention: bool | None = None):
  """The training step of `jax_side`, compiled for one device without allocating its state
  (for `compiled.memory_analysis()`)."""
  task = paper_task(cfg, seq, cross_document_attention)
  tx, schedule = paper_optimizer(cfg)
  state = jax.eval_shape(lambda: init_state(task, tx, 0, seq))
  tokens = jax.ShapeDtypeStruct((batch, seq), np.min_scalar_type(cfg.vocab_size - 1))
  step = jax.jit(make_train_step(task, tx, schedule, grad_accum_steps), donate_argnums=0)
  return step.lower(state, tokens).compile()


def predictions(seq: int) -> int:
  """Positions the output layer runs on per row, as training has it (configs/base.py)."""
  config = paper_config()
  return masked_lm.predictions_per_row(config.task.mask_rate, seq,
                                       config.task.max_predictions_per_seq)


def jax_side(cfg: EncoderConfig, batch: int, seq: int, seed: int = 0, steps_masked: int = 8,
             head_at_every_position: bool = False, cross_document_attention: bool | None = None,
             grad_accum_steps: int = 1):
  """(forward runner, train runner, params, host batches) on the JAX side.

  The train runner returns the step's loss; it calls the training step `python -m train`
  runs (`train.run.step.make_train_step` of the masked-token task, configs/base.py's optimizer),
  jitted with the state donated, on one batch of random token ids (masked in the step); the
  forward runner the encoder alone, as inference does. The host batches are the first
  `steps_masked` steps' masked batches, for the PyTorch side.
  """
  rng = np.random.default_rng(seed)
  tokens = rng.integers(FIRST_TOKEN_ID, cfg.vocab_size, (batch, seq))
  tokens = jnp.asarray(tokens.astype(np.min_scalar_type(cfg.vocab_size - 1)))
  task = paper_task(cfg, seq, cross_document_attention,
                    head_at_every_position=head_at_every_position)
  tx, schedule = paper_optimizer(cfg)
  state = [init_state(task, tx, seed, seq)]
  params = jax.tree.map(np.asarray, state[0].params)  # a host copy: the state is donated
  mask_at = jax.jit(lambda rng, step: task.batch(tokens, step_keys(rng, step)[1]))
  host_batches = [jax.device_get(mask_at(state[0].rng, i)) for i in range(steps_masked)]
  step = jax.jit(make_train_step(task, tx, schedule, grad_accum_steps), donate_argnums=0)
  forward = jax.jit(lambda p, t: Encoder(cfg).apply({"params": p}, t))
  encoder_params = jax.device_put(params["encoder"])

  def run_forward():
    forward(encoder_params, tokens).block_until_ready()

  def run_train():
    state[0], metrics = step(state[0], tokens)
    return metrics["loss"].block_until_ready()

  # The executable run_train calls (after its first call, from jit's cache: no second compile).
  run_train.compiled = lambda: step.lower(state[0], tokens).compile()

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

    def forward(self, inputs, predict_at):
      hidden = self.encoder(inputs)
      at = predict_at[..., None].expand(-1, -1, hidden.shape[-1])
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
    b["inputs"], b["predict_at"] = b["inputs"].long(), b["predict_at"].long()
    b["targets"], b["weights"] = b["targets"].long().flatten(), b["weights"].flatten()
  tokens = batches[0]["inputs"]
  eval_encoder, train_model = model.encoder, model
  if compile_:
    train_model = torch.compile(model)
    eval_encoder = torch.compile(model.encoder)
  optim = paper_config().optim
  _, schedule = paper_optimizer(cfg)
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
      logits = train_model(b["inputs"], b["predict_at"])
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
