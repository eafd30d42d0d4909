r"""Parity report: the Flax encoder against a PyTorch model on the same weights, stage by stage.

Against your own PyTorch module (the question to answer: does the Flax encoder compute what my
model computes?):

  python -m flax_encoder.pytorch.parity --module mypkg.model:build [--call mypkg.model:run] \
      [--checkpoint model.pt] --n-heads 8

`build()` returns your torch.nn.Module; `--checkpoint` loads weights into it (otherwise it runs
on the weights `build` gave it). `run(module, tokens)`, if given, calls it and returns the
encoder's output [batch, seq, d_model]; `tokens` is an int64 tensor [batch, seq] with pad id 0,
and the adapter builds whatever mask the module wants. Without `--call` it is `module(tokens)`.

Against the reference PyTorch tutorial port (flax_encoder.pytorch.reference), when your code is
not at hand; the weights cannot show norm_position, activation or layer_norm_eps, so the report
assumes the tutorial port's unless told (--norm-position, --activation, --layer-norm-eps):

  python -m flax_encoder.pytorch.parity --checkpoint model.pt --n-heads 8

Sizes are read off the checkpoint's shapes; the encoder is found inside a larger state dict
(--prefix, default auto). Each stage (the embedding, the embedded input, every sub-layer of
every layer, the final norm, the output) is captured with forward hooks on the module names of
the layout; a stage fails when its max abs error exceeds atol + rtol * max|PyTorch value|, and
the report exits 1 naming the first stage that fails. Without --checkpoint or --module, both
ports run on random weights (a check of the installation).

Against transformers, for a Hugging Face bert / roberta / distilbert / modernbert directory
(the families flax_encoder.pytorch.hf.load_hf reads; transformers must be installed):

  python -m flax_encoder.pytorch.parity --hf bert-dir [--float64] [--batch 4 --seq-len 32]

transformers' `AutoModel.from_pretrained(dir, attn_implementation="eager")` and the Flax encoder
of `load_hf(dir)` run on the same random ids, rows after the first padded at the end with the
model's pad_token_id (attention_mask = ids != pad_token_id). The stages are transformers' module
outputs: `embeddings` (after the embedding LayerNorm), each layer's attention sub-layer after
its LayerNorm (`encoder.layer.{i}.attention`; DistilBERT `transformer.layer.{i}.sa_layer_norm`),
each layer (`encoder.layer.{i}`, `transformer.layer.{i}`) and last_hidden_state. Every stage
follows a LayerNorm, so the float32 default is rtol 1e-5 (atol 1e-5); float64's 1e-10 + 1e-12
as above. A directory load_hf refuses is one line and exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import torch

from flax_encoder.config import EncoderConfig
from flax_encoder.embedding import sinusoidal_positions
from flax_encoder.encoder import Encoder
from flax_encoder.pytorch import reference
from flax_encoder.pytorch.convert import (
    config_from_torch_state_dict,
    from_torch_state_dict,
    load_torch_checkpoint,
)
from flax_encoder.pytorch.hf import FAMILIES, load_hf
from flax_encoder.pytorch.layouts import (
    FEED_FORWARD_OUTPUT,
    LAYOUTS,
    PE_KEY,
    EncoderKeys,
    find_encoder,
    strip_wrappers,
)


@dataclasses.dataclass
class Row:
  name: str
  shape: tuple
  max_abs: float
  max_rel: float  # max_abs / max|PyTorch value|
  scale: float  # max|PyTorch value|

  def passes(self, atol: float, rtol: float) -> bool:
    return self.max_abs <= atol + rtol * self.scale


def stages(found: EncoderKeys, config: EncoderConfig) -> list[tuple[str, str, str]]:
  """(stage, flax module path, PyTorch module name with wrappers stripped), in forward order."""
  points = [("embedding", "embedding", "embedding"), ("embedded", "pos_encoder", "pos_encoder")]
  for i in range(config.n_layers):
    for flax_name, torch_name in (("self_attn", "self_attn"), ("norm1", "norm1"),
                                  ("feed_forward", FEED_FORWARD_OUTPUT[found.layout]),
                                  ("norm2", "norm2")):
      points.append((f"layers.{i}.{flax_name}", f"layers_{i}/{flax_name}",
                     f"layers.{i}.{torch_name}"))
    points.append((f"layers.{i}", f"layers_{i}", f"layers.{i}"))
  if config.final_norm:
    points.append(("norm", "norm", "norm"))
  return [(name, flax_path, found.module_name(torch_name)) for name, flax_path, torch_name
          in points]


def compare_module(module, config: EncoderConfig, tokens: np.ndarray, layout: str | None = None,
                   prefix: str | None = "auto",
                   call: Callable[[Any, Any], Any] | None = None) -> tuple[list[Row], list[str]]:
  """Runs a PyTorch module and the Flax encoder on the module's own weights, stage by stage.

  Args:
    module: a torch.nn.Module holding the encoder (alone, or inside a bigger model).
    config: the Flax encoder's config (`config_from_torch_state_dict` reads the sizes);
      config.dtype float32 or float64 sets both sides' precision.
    tokens: int ids [batch, seq], padding = config.pad_id.
    layout, prefix: where the encoder's weights are in `module.state_dict()`, as in
      `from_torch_state_dict`.
    call: `call(module, tokens)` -> the encoder's output [batch, seq, d_model]; default
      `module(tokens)`.

  Returns:
    (rows in forward order, the stages whose module the PyTorch model does not have).
  """
  return _compare(module, find_encoder(module.state_dict(), prefix, layout), config, tokens,
                  call)


def _compare(module, found: EncoderKeys, config: EncoderConfig, tokens: np.ndarray,
             call) -> tuple[list[Row], list[str]]:
  """compare_module, with the encoder already found in the module's state dict."""
  float64 = config.dtype == np.float64
  module = module.to(torch.float64 if float64 else torch.float32).eval()
  flax_config = dataclasses.replace(config, scan_layers=False, remat="none")
  variables = from_torch_state_dict(found.state, flax_config, found.layout)

  modules = {}
  for name, m in module.named_modules():
    modules.setdefault(strip_wrappers(name), m)
  points = stages(found, config)
  if float64:
    _positions_in_float64(modules.get(found.module_name("pos_encoder")), config.d_model)
  device = next(module.parameters()).device  # the report runs where the module is
  source = torch.as_tensor(np.asarray(tokens), dtype=torch.int64, device=device)
  # Grad mode stays on: under no_grad nn.TransformerEncoderLayer takes a fused fast path that
  # skips its submodules' hooks.
  with torch.enable_grad():
    captured, output = _hooked(modules, [t for _, _, t in points if t in modules],
                               lambda: call(module, source) if call is not None
                               else module(source))
  output = output[0] if isinstance(output, (tuple, list)) else output
  output = output.detach().cpu().numpy()
  expected_shape = (*np.shape(tokens), config.d_model)
  if output.shape != expected_shape:
    raise ValueError(f"the module's output has shape {list(output.shape)}, expected the "
                     f"encoder's {list(expected_shape)}; pass call= (--call) returning the "
                     f"encoder's output")

  output_flax, flax_value = _run_flax(flax_config, variables, tokens)
  rows = [_row(name, flax_value(f), captured[t]) for name, f, t in points if t in captured]
  rows.append(_row("output", output_flax, output))
  return rows, [name for name, _, t in points if t not in captured]


def _hooked(modules: dict, names: Sequence[str], run: Callable[[], Any]):
  """run() with a forward hook on each module of `names` -> ({name: its output as numpy},
  run()'s result)."""
  captured: dict[str, np.ndarray] = {}

  def hook(name):
    def save(_, args, output):
      output = output[0] if isinstance(output, tuple) else output
      captured[name] = output.detach().cpu().numpy()
    return save

  handles = [modules[name].register_forward_hook(hook(name)) for name in names]
  try:
    return captured, run()
  finally:
    for h in handles:
      h.remove()


def _run_flax(config: EncoderConfig, variables: dict, tokens: np.ndarray):
  """The Flax encoder (unscanned) on `tokens` -> (its output, value(module path) of any
  module's output, e.g. 'layers_0/norm1')."""
  with jax.default_matmul_precision("highest"):
    output, state = Encoder(config).apply(
        variables, np.asarray(tokens), capture_intermediates=True, mutable=["intermediates"])

  def value(path: str) -> np.ndarray:
    node = state["intermediates"]
    for part in path.split("/"):
      node = node[part]
    return np.asarray(node["__call__"][0])

  return np.asarray(output), value


def hf_stages(family: str, n_layers: int) -> list[tuple[str, str, str]]:
  """(stage, Flax module path, transformers module name) of a `load_hf` family, in forward
  order: the embeddings after their LayerNorm, then per layer the attention sub-layer after
  its LayerNorm (ModernBERT's: its output before the residual) and the layer's output
  (ModernBERT's final LayerNorm last). A stage is named for the transformers module."""
  points = [("embeddings", "embedding_norm", "embeddings")]
  if family == "modernbert":  # Pre-LN: each attention sub-layer's output before its residual
    for i in range(n_layers):
      points += [(f"layers.{i}.attn", f"layers_{i}/self_attn", f"layers.{i}.attn"),
                 (f"layers.{i}", f"layers_{i}", f"layers.{i}")]
    return points + [("final_norm", "norm", "final_norm")]
  for i in range(n_layers):
    if family == "distilbert":
      layer, attention = f"transformer.layer.{i}", f"transformer.layer.{i}.sa_layer_norm"
    else:
      layer, attention = f"encoder.layer.{i}", f"encoder.layer.{i}.attention"
    points += [(attention, f"layers_{i}/norm1", attention), (layer, f"layers_{i}", layer)]
  return points


def compare_hf(model, config: EncoderConfig, variables: dict, tokens: np.ndarray) -> list[Row]:
  """A transformers model against the Flax encoder `load_hf` reads from the same directory,
  stage by stage (`hf_stages`, then last_hidden_state), in config.dtype.

  Args:
    model: transformers' base model of the directory (`AutoModel.from_pretrained(dir,
      attn_implementation="eager")`: BertModel, RobertaModel, DistilBertModel …).
    config, variables: `load_hf(dir, scan_layers=False, …)`; config.dtype float32 or float64
      sets both sides' precision (float64 needs jax_enable_x64).
    tokens: int ids [batch, seq]; config.pad_id (the model's pad_token_id) is padding, and
      transformers gets attention_mask = tokens != pad_id.

  Returns:
    The rows in forward order, last_hidden_state last.
  """
  model_type = getattr(model.config, "model_type", None)
  if model_type not in FAMILIES:
    raise ValueError(f"model: a transformers {model_type!r} model, expected one of "
                     f"{sorted(FAMILIES)}")
  if config.scan_layers:
    raise ValueError("config: scan_layers=True, expected False (load_hf(dir, "
                     "scan_layers=False)): the report reads each layer's output")
  model = model.to(torch.float64 if config.dtype == np.float64 else torch.float32).eval()
  points = hf_stages(FAMILIES[model_type], config.n_layers)
  modules = dict(model.named_modules())
  absent = [t for _, _, t in points if t not in modules]
  if absent:
    raise ValueError(f"model: a {type(model).__name__} without the modules {absent[:4]}, "
                     f"expected transformers' {model_type} names")
  # The Flax side first: it checks the tokens (ids, length) with errors that name them.
  output_flax, flax_value = _run_flax(config, {"params": variables["params"]}, tokens)
  device = next(model.parameters()).device
  ids = torch.as_tensor(np.asarray(tokens), dtype=torch.int64, device=device)
  mask = (ids != config.pad_id).to(torch.int64)
  in_float64 = (modernbert_in_float64() if model_type == "modernbert" and
                config.dtype == np.float64 else contextlib.nullcontext())
  with torch.no_grad(), in_float64:
    captured, output = _hooked(modules, [t for _, _, t in points],
                               lambda: model(input_ids=ids, attention_mask=mask))
  rows = [_row(name, flax_value(f), captured[t]) for name, f, t in points]
  rows.append(_row("last_hidden_state", output_flax,
                   output.last_hidden_state.detach().cpu().numpy()))
  return rows


@contextlib.contextmanager
def modernbert_in_float64():
  """Within it, transformers' ModernBERT turns queries and keys, and takes its eager softmax,
  in the model's dtype: it does both in float32 whatever the model's, so that a float64
  ModernBERT is ~1e-9 off float64 maths. The maths are unchanged."""
  from transformers.models.modernbert import modeling_modernbert as module

  def attention(_, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
      weights = weights + attention_mask
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

  def rotary(q, k, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    turn = lambda x: x * cos + module.rotate_half(x) * sin
    return turn(q), turn(k)

  def angles(self, x, position_ids, layer_type):
    theta = self.config.rope_parameters[layer_type]["rope_theta"]
    dim = self.config.hidden_size // self.config.num_attention_heads
    inv_freq = theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    turned = position_ids[..., None].to(torch.float64) * inv_freq
    turned = torch.cat((turned, turned), dim=-1)
    return turned.cos().to(x.dtype), turned.sin().to(x.dtype)

  patched = ((module, "eager_attention_forward", attention),
             (module, "apply_rotary_pos_emb", rotary),
             (module.ModernBertRotaryEmbedding, "forward", angles))
  saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
  try:
    for owner, name, value in patched:
      setattr(owner, name, value)
    yield
  finally:
    for owner, name, value in saved:
      setattr(owner, name, value)


def compare(state_dict, config: EncoderConfig, layout: str, tokens: np.ndarray) -> list[Row]:
  """The reference tutorial port (`layout`'s module names) on `state_dict`, the encoder alone,
  against the Flax encoder, in config.dtype (float32 or float64)."""
  model = _reference_port(state_dict, config, layout)
  return _compare(model, find_encoder(model.state_dict(), None, layout), config, tokens, None)[0]


def _reference_port(encoder_state: dict, config: EncoderConfig, layout: str):
  """flax_encoder.pytorch.reference's Encoder holding the encoder's weights (plain names)."""
  model = reference.Encoder(config, layout)
  state = {k: torch.as_tensor(np.asarray(v)) for k, v in encoder_state.items()}
  if layout == "tutorial" and PE_KEY not in state:
    state[PE_KEY] = model.pos_encoder.pe
  model.load_state_dict(state, strict=True)
  return model


def _positions_in_float64(pos_encoder, d_model: int) -> None:
  """In float64 the Flax side's table is exact to float64: so is the PyTorch side's then."""
  pe = getattr(pos_encoder, "pe", None)
  if pe is not None and hasattr(pe, "copy_") and pe.shape[-1] == d_model:
    table = sinusoidal_positions(pe.shape[-2], d_model, np.float64)
    with torch.no_grad():
      pe.copy_(torch.from_numpy(table).reshape(pe.shape))


def _row(name: str, ours: np.ndarray, theirs: np.ndarray) -> Row:
  diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
  scale = float(np.max(np.abs(theirs)))
  return Row(name, tuple(theirs.shape), float(diff.max()), float(diff.max()) / (scale or 1.0),
             scale)


def format_table(rows: Sequence[Row], atol: float, rtol: float) -> str:
  width = max(len(r.name) for r in rows)
  lines = [f"{'stage':<{width}}  {'shape':<16}  {'max abs err':>11}  {'max rel err':>11}",
           "-" * (width + 46)]
  for r in rows:
    flag = "" if r.passes(atol, rtol) else "  > tolerance"
    lines.append(f"{r.name:<{width}}  {str(list(r.shape)):<16}  {r.max_abs:>11.3e}  "
                 f"{r.max_rel:>11.3e}{flag}")
  return "\n".join(lines)


def random_tokens(config: EncoderConfig, batch: int, seq_len: int, seed: int) -> np.ndarray:
  """Random ids != pad_id, each row but the first padded from a random length on (with local
  attention, less padding than half the window: in transformers' float64 a padding token that
  sees only padding is NaN, and its mask carries the NaN on)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, config.vocab_size - 1, size=(batch, seq_len))
  tokens = tokens + (tokens >= config.pad_id)  # skip pad_id
  shortest = max(1, seq_len - config.local_attention // 2 + 1) if config.local_attention else 1
  for row in range(1, batch):
    tokens[row, rng.integers(min(shortest, seq_len), seq_len + 1):] = config.pad_id
  return tokens


_SIZE_FLAGS = (("vocab-size", int), ("d-model", int), ("n-heads", int), ("d-ff", int),
               ("n-layers", int), ("max-len", int), ("pad-id", int), ("layer-norm-eps", float),
               ("norm-position", str), ("activation", str))


def _parse_args(argv):
  p = argparse.ArgumentParser(prog="python -m flax_encoder.pytorch.parity", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--hf", metavar="DIR", help="a Hugging Face bert/roberta/distilbert/modernbert "
                 "directory: transformers' model against the Flax encoder load_hf reads from it")
  p.add_argument("--module", help="PKG.MOD:FN, FN() returns your torch.nn.Module")
  p.add_argument("--call", help="PKG.MOD:FN, FN(module, tokens) returns the encoder's output")
  p.add_argument("--checkpoint", help=".pt/.pth/.bin or .safetensors: a state dict or a training "
                 "checkpoint holding one")
  p.add_argument("--layout", choices=LAYOUTS, help="default: detected from the layer names")
  p.add_argument("--prefix", default="auto", help="the encoder's prefix in the state dict "
                 "(e.g. model.encoder.); default: found")
  p.add_argument("--config", help="JSON file of EncoderConfig fields (flags below override it)")
  for flag, kind in _SIZE_FLAGS:
    p.add_argument(f"--{flag}", type=kind)
  p.add_argument("--no-final-norm", action="store_true")
  p.add_argument("--tokens", help="JSON list of rows of ids, e.g. '[[5, 6, 7, 0]]'")
  p.add_argument("--batch", type=_positive, default=4)
  p.add_argument("--seq-len", type=_positive, default=32)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--float64", action="store_true", help="both sides in float64")
  p.add_argument("--atol", type=float,
                 help="absolute tolerance (default 1e-5; 1e-10 with --float64)")
  p.add_argument("--rtol", type=float, help="tolerance relative to the largest PyTorch value "
                 "of the stage (default 1e-4, 1e-5 with --hf; 1e-12 with --float64)")
  return p.parse_args(argv)


def _positive(text: str) -> int:
  """argparse's type of a count: an integer >= 1."""
  try:
    value = int(text)
  except ValueError:
    value = None
  if value is None or value < 1:
    raise argparse.ArgumentTypeError(f"{text!r}, expected an integer >= 1")
  return value


def _fields_from_args(args) -> dict:
  fields = {}
  if args.config:
    with open(args.config) as f:
      fields.update(json.load(f))
  for flag, _ in _SIZE_FLAGS:
    name = flag.replace("-", "_")
    if getattr(args, name) is not None:
      fields[name] = getattr(args, name)
  if args.no_final_norm:
    fields["final_norm"] = False
  known = {f.name for f in dataclasses.fields(EncoderConfig)}
  unknown = sorted(set(fields) - known)
  if unknown:
    raise SystemExit(f"error: unknown EncoderConfig fields in --config: {unknown}")
  dtype = "float64" if args.float64 else "float32"
  return {**fields, "dropout": 0.0, "attention_dropout": 0.0, "dtype": dtype,
          "param_dtype": dtype}


def _config(state_dict, fields: dict, layout, prefix) -> EncoderConfig:
  """Sizes from the state dict's shapes where there is one, overridden by `fields`."""
  if state_dict is None:
    if "vocab_size" not in fields:
      raise SystemExit("error: --vocab-size (or vocab_size in --config) is required without "
                       "--checkpoint or --module")
    return EncoderConfig(**fields)
  if "n_heads" not in fields:
    raise SystemExit("error: --n-heads is required: the number of heads is not in the weights")
  fields = dict(fields)
  return config_from_torch_state_dict(state_dict, fields.pop("n_heads"), layout, prefix, **fields)


def _load(spec: str, flag: str):
  """'pkg.mod:name' -> the object."""
  module_name, _, attr = spec.partition(":")
  if not module_name or not attr:
    raise SystemExit(f"error: {flag} must be PKG.MODULE:NAME, got {spec!r}")
  try:
    return getattr(importlib.import_module(module_name), attr)
  except (ImportError, AttributeError) as e:
    raise SystemExit(f"error: {flag} {spec!r}: {e}") from e


def _load_into(module, checkpoint: dict, path: str, prefix, layout) -> str:
  """Loads what of `checkpoint` belongs to `module`; returns how it matched.

  Key for key (wrapper prefixes stripped) when the checkpoint holds exactly the module's
  weights; otherwise the encoder found in the checkpoint goes into the encoder found in the
  module (a training checkpoint of a bigger model, with a module that is the encoder alone,
  or the reverse), and the module keeps its own weights outside its encoder.
  """
  target = {strip_wrappers(k): k for k in module.state_dict()}
  source = {strip_wrappers(k): v for k, v in checkpoint.items()}
  if set(target) == set(source):
    module.load_state_dict({target[k]: torch.as_tensor(np.asarray(v))
                            for k, v in source.items()}, strict=True)
    return "key for key"
  try:
    ours = find_encoder(module.state_dict(), "auto", layout)
    theirs = find_encoder(checkpoint, prefix, layout)
  except ValueError as e:
    raise SystemExit(f"error: checkpoint {path} does not fit the module key for key, and its "
                     f"encoder cannot be matched to the module's: {e}") from e
  if theirs.layout != ours.layout:
    raise SystemExit(f"error: checkpoint {path} holds a {theirs.layout!r} encoder, the module a "
                     f"{ours.layout!r} one")
  missing = sorted(set(ours.state) - set(theirs.state) - {PE_KEY})
  unexpected = sorted(set(theirs.state) - set(ours.state) - {PE_KEY})
  if missing or unexpected:
    raise SystemExit(f"error: the encoder in checkpoint {path} does not fit the module's: "
                     f"missing keys {missing[:8]}, unexpected keys {unexpected[:8]}")
  state = {ours.keys[name]: torch.as_tensor(np.asarray(value))
           for name, value in theirs.state.items() if name in ours.keys}
  module.load_state_dict(state, strict=False)
  kept = f"; the module keeps its own {len(ours.ignored)} other keys" if ours.ignored else ""
  return (f"its encoder at prefix {theirs.root!r} into the module's encoder at prefix "
          f"{ours.root!r}{kept}")


def _users_module(args, checkpoint, fields):
  """(module, config, its encoder, heading) for --module."""
  module = _load(args.module, "--module")()
  heading = f"parity: your module {args.module} (its own weights) against the Flax encoder"
  if checkpoint is not None:
    how = _load_into(module, checkpoint, args.checkpoint, args.prefix, args.layout)
    heading = (f"parity: your module {args.module} with {args.checkpoint} ({how}) against the "
               f"Flax encoder")
  found = find_encoder(module.state_dict(), args.prefix, args.layout)
  config = _config(found.state, fields, found.layout, None)
  return module, config, found, heading


def _reference_module(args, checkpoint, fields):
  """(module, config, its encoder, heading) for the reference tutorial port."""
  if checkpoint is None:
    config = _config(None, fields, args.layout, None)
    torch.manual_seed(args.seed)
    layout = args.layout or "tutorial"
    weights = reference.Encoder(config, layout).state_dict()
    source, where = f"random weights (seed {args.seed})", ""
  else:
    found = find_encoder(checkpoint, args.prefix, args.layout)
    config = _config(found.state, fields, found.layout, None)
    layout, weights, source = found.layout, found.state, args.checkpoint
    where = "\n" + _where(found)
  module = _reference_port(weights, config, layout)
  heading = (f"parity: {source} in the reference PyTorch tutorial port "
             f"(flax_encoder.pytorch.reference, layout={layout}) against the Flax encoder; "
             f"assumed norm_position={config.norm_position}, activation={config.activation}, "
             f"layer_norm_eps={config.layer_norm_eps:g}, which the weights cannot show: "
             f"--module runs your own code instead{where}")
  return module, config, find_encoder(module.state_dict(), None, layout), heading


def main(argv: Sequence[str] | None = None) -> int:
  args = _parse_args(argv)
  try:
    return _hf_report(args) if args.hf else _report(args)
  except (ValueError, OSError) as e:  # the library's refusals: a file, a layout, a field
    message = str(e).strip().splitlines()[0]
    flag, path = ("--hf", args.hf) if args.hf else ("--checkpoint", args.checkpoint)
    if path and path not in message:
      message = f"{flag} {path}: {message}"
    print(f"parity: error: {message}", file=sys.stderr)
    return 2


def _tolerances(args) -> tuple[float, float]:
  atol = args.atol if args.atol is not None else (1e-10 if args.float64 else 1e-5)
  # transformers' stages all follow a LayerNorm, so float32 keeps ~1e-6 of their scale; the
  # tutorial port's sub-layer outputs, before one, lose more to cancellation.
  rtol = args.rtol if args.rtol is not None else (
      1e-12 if args.float64 else 1e-5 if args.hf else 1e-4)
  return atol, rtol


def _report(args) -> int:
  """Prints the table of every stage; 0 if each is within tolerance, else 1."""
  fields = _fields_from_args(args)
  checkpoint = load_torch_checkpoint(args.checkpoint) if args.checkpoint else None
  with jax.enable_x64(args.float64):
    build = _users_module if args.module else _reference_module
    module, config, found, heading = build(args, checkpoint, fields)
    tokens = _tokens(args, config)
    call = _load(args.call, "--call") if args.call else None
    rows, absent = _compare(module, found, config, tokens, call)
  print(heading)
  if args.module:
    print(_where(found))
  print(_sizes(config, tokens))
  return _verdict(rows, absent, *_tolerances(args))


def _hf_report(args) -> int:
  """_report for --hf DIR: transformers' model of DIR against load_hf's."""
  given = [flag for flag, value in _model_flags(args) if value]
  if given:
    raise ValueError(f"--hf reads the model, its sizes and names from {args.hf}: it takes no "
                     f"{', '.join(given)}")
  dtype = "float64" if args.float64 else "float32"
  with jax.enable_x64(args.float64):
    config, variables = load_hf(args.hf, dtype=dtype, param_dtype=dtype, scan_layers=False,
                                remat="none", attention_impl="reference", dropout=0.0,
                                attention_dropout=0.0)
    try:
      import transformers
    except ImportError:
      raise ValueError("transformers is not installed: pip install 'transformers>=4.46' "
                       "(or flax-encoder[test])") from None
    model = _base_model(transformers, args.hf)
    tokens = _tokens(args, config)
    rows = compare_hf(model, config, variables, tokens)
  print(f"parity: {args.hf} in transformers' {type(model).__name__} (model_type "
        f"{model.config.model_type}, eager attention, attention_mask = ids != pad id "
        f"{config.pad_id}) against the Flax encoder of flax_encoder.pytorch.hf.load_hf; each "
        f"stage is a transformers module's output")
  print(_sizes(config, tokens))
  return _verdict(rows, [], *_tolerances(args))


def _base_model(transformers, path):
  """transformers' base model of the directory, eager attention, loaded without its load report
  and progress bar: a directory saved with a head (`*ForMaskedLM`) lists the head's weights as
  unexpected for the base model, which is all the report compares."""
  from transformers.utils import logging
  verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
  logging.set_verbosity_error()
  logging.disable_progress_bar()
  try:
    return transformers.AutoModel.from_pretrained(path, attn_implementation="eager")
  finally:
    logging.set_verbosity(verbosity)
    if bars:
      logging.enable_progress_bar()


def _model_flags(args) -> list[tuple[str, Any]]:
  """The flags that describe a model --hf reads from its directory, with their values."""
  flags = [("--module", args.module), ("--call", args.call), ("--checkpoint", args.checkpoint),
           ("--layout", args.layout), ("--prefix", args.prefix != "auto"),
           ("--config", args.config), ("--no-final-norm", args.no_final_norm)]
  return flags + [(f"--{flag}", getattr(args, flag.replace("-", "_")) is not None)
                  for flag, _ in _SIZE_FLAGS]


def _sizes(config: EncoderConfig, tokens: np.ndarray) -> str:
  return (f"{config.n_layers} layers, d_model={config.d_model}, n_heads={config.n_heads}, "
          f"d_ff={config.d_ff}, vocab_size={config.vocab_size}, tokens {list(tokens.shape)}, "
          f"{config.dtype.name}, matmul precision highest")


def _verdict(rows: Sequence[Row], absent: Sequence[str], atol: float, rtol: float) -> int:
  """Prints the table and the verdict; 0 if every stage is within tolerance, else 1."""
  print(format_table(rows, atol, rtol))
  if absent:
    print(f"not compared (no such module in the PyTorch model): {', '.join(absent)}")
  failed = [r.name for r in rows if not r.passes(atol, rtol)]
  rule = f"max abs err <= {atol:.0e} + {rtol:.0e} * max|PyTorch value|"
  if failed:
    print(f"FAIL: {len(failed)} stages above tolerance ({rule}); the first is {failed[0]}")
    return 1
  worst = max(rows, key=lambda r: r.max_rel)
  print(f"PASS: every stage within {rule}; worst relative error {worst.max_rel:.3e} at "
        f"{worst.name}")
  return 0


def _where(found: EncoderKeys) -> str:
  where = (f"encoder found at prefix {found.root!r}, layers under {found.stack!r}, layout "
           f"{found.layout}")
  if found.ignored:
    where += (f"; ignored {len(found.ignored)} keys outside it, e.g. "
              f"{', '.join(found.ignored[:5])}")
  return where


def _tokens(args, config: EncoderConfig) -> np.ndarray:
  if not args.tokens:
    return random_tokens(config, args.batch, args.seq_len, args.seed)
  try:
    tokens = np.asarray(json.loads(args.tokens))
  except ValueError:  # not JSON, or rows of different lengths
    tokens = None
  if tokens is None or tokens.ndim != 2 or not tokens.size or tokens.dtype.kind not in "iu":
    raise ValueError(f"--tokens {args.tokens!r}: expected a JSON list of rows of integer ids, "
                     f"all of one length, e.g. '[[5, 6, 7, 0]]'")
  return tokens.astype(np.int64)


if __name__ == "__main__":
  sys.exit(main())
