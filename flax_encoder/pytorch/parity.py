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

Against transformers, for a Hugging Face directory of any family flax_encoder.families.load_hf
reads (transformers must be installed), by config.json's model_type: bert, electra
(discriminator), roberta, xlm-roberta, camembert, distilbert, modernbert, albert, mpnet,
nomic_bert, gte, jina_embeddings_v3, eurobert, deberta-v2 (flax_encoder.families.MODEL_TYPES):

  python -m flax_encoder.pytorch.parity --hf bert-dir [--float64] [--batch 4 --seq-len 32]

transformers' `AutoModel.from_pretrained(dir, attn_implementation="eager")` and the Flax encoder
of `load_hf(dir)` run on the same random ids, rows after the first padded at the end with the
model's pad_token_id (attention_mask 0 on the pad ids that end a row). The stages are
transformers' module outputs, as the family names them (its parity stages): for BERT
`embeddings` (after the embedding LayerNorm), each layer's attention sub-layer after its LayerNorm
(`encoder.layer.{i}.attention`; DistilBERT `transformer.layer.{i}.sa_layer_norm`), each layer
(`encoder.layer.{i}`, `transformer.layer.{i}`) and last_hidden_state; a family with a final
norm (ModernBERT, EuroBERT) adds it. With --hf the float32 default is rtol 1e-5 (atol 1e-5:
BERT's stages each follow a LayerNorm, which keeps float32's error near 1e-6 of the stage's
scale); float64's is 1e-10 + 1e-12, as above. A directory load_hf refuses is one line and
exit 2.
"""

from __future__ import annotations

import argparse
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
from flax_encoder.families import load_hf
from flax_encoder.modules_json import read_json
from flax_encoder.pytorch import reference
from flax_encoder.pytorch.convert import (
    config_from_torch_state_dict,
    from_torch_state_dict,
    load_torch_checkpoint,
)
from flax_encoder.pytorch.hf_parity import base_model, compare_hf
from flax_encoder.pytorch.layouts import (
    FEED_FORWARD_OUTPUT,
    LAYOUTS,
    PE_KEY,
    EncoderKeys,
    find_encoder,
    strip_wrappers,
)
from flax_encoder.pytorch.report import (
    Row,
    check_finite,
    format_table,
    hooked,
    random_tokens,
    row,
    run_flax,
    sizes,
    verdict,
)

# What the report's callers import from here (tests, benchmarks).
__all__ = ["Row", "compare", "compare_hf", "compare_module", "format_table", "load_hf", "main",
           "random_tokens", "stages"]


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
    captured, output = hooked(modules, [t for _, _, t in points if t in modules],
                              lambda: call(module, source) if call is not None
                              else module(source))
  output = output[0] if isinstance(output, (tuple, list)) else output
  output = output.detach().cpu().numpy()
  expected_shape = (*np.shape(tokens), config.d_model)
  if output.shape != expected_shape:
    raise ValueError(f"the module's output has shape {list(output.shape)}, expected the "
                     f"encoder's {list(expected_shape)}; pass call= (--call) returning the "
                     f"encoder's output")

  output_flax, flax_value = run_flax(flax_config, variables, tokens)
  rows = [row(name, flax_value(f), captured[t]) for name, f, t in points if t in captured]
  rows.append(row("output", output_flax, output))
  return rows, [name for name, _, t in points if t not in captured]


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


_SIZE_FLAGS = (("vocab-size", int), ("d-model", int), ("n-heads", int), ("d-ff", int),
               ("n-layers", int), ("max-len", int), ("pad-id", int), ("layer-norm-eps", float),
               ("norm-position", str), ("activation", str))


def _parse_args(argv):
  p = argparse.ArgumentParser(prog="python -m flax_encoder.pytorch.parity", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--hf", metavar="DIR", help="a Hugging Face model directory of any family "
                 "load_hf reads (the model_types above): transformers' model against the Flax "
                 "encoder load_hf reads from it")
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
    fields.update(read_json(args.config, ValueError, dict, required=True))
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
    check_finite(module, args.checkpoint or args.module or "the random weights")
    tokens = _tokens(args, config)
    call = _load(args.call, "--call") if args.call else None
    rows, absent = _compare(module, found, config, tokens, call)
  print(heading)
  if args.module:
    print(_where(found))
  print(sizes(config, tokens))
  return verdict(rows, absent, *_tolerances(args))


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
    model = base_model(transformers, args.hf)
    check_finite(model, args.hf)
    tokens = _tokens(args, config)
    rows = compare_hf(model, config, variables, tokens)
  atol, rtol = _tolerances(args)
  print(f"parity: {args.hf} in transformers' {type(model).__name__} (model_type "
        f"{model.config.model_type}, eager attention, attention_mask 0 on the pad ids "
        f"{config.pad_id} that end a row) against the Flax encoder of "
        f"flax_encoder.families.load_hf; each stage is a transformers module's output, "
        f"within {atol:.0e} + {rtol:.0e} * max|transformers value|")
  print(sizes(config, tokens))
  return verdict(rows, [], *_tolerances(args))


def _model_flags(args) -> list[tuple[str, Any]]:
  """The flags that describe a model --hf reads from its directory, with their values."""
  flags = [("--module", args.module), ("--call", args.call), ("--checkpoint", args.checkpoint),
           ("--layout", args.layout), ("--prefix", args.prefix != "auto"),
           ("--config", args.config), ("--no-final-norm", args.no_final_norm)]
  return flags + [(f"--{flag}", getattr(args, flag.replace("-", "_")) is not None)
                  for flag, _ in _SIZE_FLAGS]


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
