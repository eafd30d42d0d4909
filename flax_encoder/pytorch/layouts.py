"""Where the encoder's weights sit in a PyTorch state dict.

Two layouts name the weights of one layer:
  "tutorial": the PyTorch tutorial port's modules (flax_encoder.pytorch.reference):
              self_attn.w_q … w_o, feed_forward.w_1 / w_2, norm1, norm2.
  "torch_nn": torch.nn.TransformerEncoderLayer: self_attn.in_proj_weight / in_proj_bias (q, k,
              v stacked), self_attn.out_proj, linear1, linear2, norm1, norm2.
Around the layers, both have embedding.weight, an optional pos_encoder.pe buffer (the sinusoid
table, checked on conversion) and, with a final LayerNorm, norm.weight / norm.bias.

Real checkpoints nest these names: under a parent module (`model.encoder.layers.0…`), under
DistributedDataParallel's `module.` and torch.compile's `_orig_mod.`, or with the layers in a
torch.nn.TransformerEncoder container (`encoder.layers.{i}…`, the container's own `norm`, the
embedding beside the container). `find_encoder` resolves all of these to the plain names.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping
from typing import Any

from flax_encoder.config import EncoderConfig

logger = logging.getLogger(__name__)

LAYOUTS = ("tutorial", "torch_nn")

# (flax block, flax name) -> torch name within a layer, per layout, for the Dense layers that
# map one to one.
DENSE = {
    "tutorial": {("self_attn", "w_q"): "self_attn.w_q", ("self_attn", "w_k"): "self_attn.w_k",
                 ("self_attn", "w_v"): "self_attn.w_v", ("self_attn", "w_o"): "self_attn.w_o",
                 ("feed_forward", "w_1"): "feed_forward.w_1",
                 ("feed_forward", "w_2"): "feed_forward.w_2"},
    "torch_nn": {("self_attn", "w_o"): "self_attn.out_proj", ("feed_forward", "w_1"): "linear1",
                 ("feed_forward", "w_2"): "linear2"},
}
NORMS = ("norm1", "norm2")
IN_PROJ = ("self_attn.in_proj_weight", "self_attn.in_proj_bias")  # torch_nn: q, k, v stacked
PE_KEY = "pos_encoder.pe"
EMBEDDING_KEY = "embedding.weight"
# The module whose output is the feed-forward block's, per layout (for the parity report).
FEED_FORWARD_OUTPUT = {"tutorial": "feed_forward", "torch_nn": "linear2"}


def check_layout(layout: str) -> None:
  if layout not in LAYOUTS:
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def layer_keys(layout: str) -> set[str]:
  """The keys of one layer in `layout`, relative to `layers.{i}.`."""
  check_layout(layout)
  keys = {f"{name}.{p}" for name in DENSE[layout].values() for p in ("weight", "bias")}
  keys |= {f"{name}.{p}" for name in NORMS for p in ("weight", "bias")}
  return keys | (set(IN_PROJ) if layout == "torch_nn" else set())


def expected_shapes(config: EncoderConfig, layout: str = "tutorial") -> dict[str, tuple[int, ...]]:
  """Every key of the encoder's state dict in `layout` for `config`, with its shape
  (pos_encoder.pe, optional, aside)."""
  check_layout(layout)
  d, f = config.d_model, config.d_ff
  shapes = {EMBEDDING_KEY: (config.vocab_size, d)}
  dense_shapes = {"w_1": (f, d), "w_2": (d, f)}
  for i in range(config.n_layers):
    prefix = f"layers.{i}."
    for (_, flax_name), torch_name in DENSE[layout].items():
      out_in = dense_shapes.get(flax_name, (d, d))
      shapes[prefix + torch_name + ".weight"] = out_in
      shapes[prefix + torch_name + ".bias"] = out_in[:1]
    if layout == "torch_nn":
      shapes[prefix + IN_PROJ[0]] = (3 * d, d)
      shapes[prefix + IN_PROJ[1]] = (3 * d,)
    for norm in NORMS:
      shapes[prefix + norm + ".weight"] = (d,)
      shapes[prefix + norm + ".bias"] = (d,)
  if config.final_norm:
    shapes["norm.weight"] = (d,)
    shapes["norm.bias"] = (d,)
  return shapes


def strip_wrappers(name: str) -> str:
  """`name` without DistributedDataParallel's leading `module.` and torch.compile's `_orig_mod.`."""
  parts = name.split(".")
  while len(parts) > 1 and parts[0] == "module":
    parts = parts[1:]
  return ".".join(p for p in parts if p != "_orig_mod")


_LAYER = re.compile(r"^((?:[^.]+\.)*?)layers\.(\d+)\.(.+)$")


@dataclasses.dataclass(frozen=True)
class EncoderKeys:
  """The encoder found in a state dict.

  Attributes:
    state: the encoder's entries under their plain names (`embedding.weight`,
      `layers.{i}.…`, `norm.…`, `pos_encoder.pe`), as `expected_shapes` names them.
    layout: "tutorial" or "torch_nn".
    root: the prefix of the embedding (and the positional table), "" at the top.
    stack: the prefix of `layers.{i}`: `root`, or a container module below it.
    norm: the prefix of the final `norm`, or None without one.
    ignored: the state dict's keys outside the encoder, as they were named.
    keys: plain name -> the key it has in the state dict.
  """

  state: dict[str, Any]
  layout: str
  root: str
  stack: str
  norm: str | None
  ignored: tuple[str, ...]
  keys: dict[str, str]

  def module_name(self, plain: str) -> str:
    """A plain module name (`embedding`, `layers.0.norm1`, `norm`) -> its name in the state
    dict's model, wrappers stripped."""
    if plain.startswith("layers."):
      return self.stack + plain
    if plain == "norm":
      return f"{self.norm}norm"
    return self.root + plain


def detect_layout(keys) -> str:
  """The layout whose layer names appear in `keys`."""
  found = {layout for layout in LAYOUTS for key in keys
           if (m := _LAYER.match(key)) and m.group(3) in _distinctive(layout)}
  if len(found) != 1:
    what = "both" if found else "neither"
    raise ValueError(f"cannot tell the layout of the state dict: it holds {what} of the layer "
                     f"names of {LAYOUTS} (e.g. self_attn.w_q.weight, self_attn.in_proj_weight); "
                     f"pass layout=")
  return found.pop()


def _distinctive(layout: str) -> set[str]:
  return layer_keys(layout) - layer_keys(LAYOUTS[1 - LAYOUTS.index(layout)])


def find_encoder(state_dict: Mapping[str, Any], prefix: str | None = None,
                 layout: str | None = None) -> EncoderKeys:
  """Selects the encoder's entries of `state_dict` and names them plainly.

  Args:
    state_dict: names -> tensors or arrays.
    prefix: None: `state_dict` is the encoder alone, key for key. A string: the prefix of the
      encoder's embedding (e.g. "model.encoder.", or "" for the top), with the layers there or
      in one container module below it; wrapper prefixes (`module.`, `_orig_mod.`) are left
      out of it. "auto": the one prefix under which a layout matches; an ambiguous or missing
      match raises, listing the candidates.
    layout: "tutorial", "torch_nn" or None (detected from the layer names).

  Returns:
    EncoderKeys. Keys outside the encoder (an output layer, an optimizer) are left out and
    logged (count and a few names); inside it, `expected_shapes` still checks every key.
  """
  if not isinstance(state_dict, Mapping):
    raise TypeError(f"state_dict must be a mapping of names to tensors, got "
                    f"{type(state_dict).__name__}")
  if layout is not None:
    check_layout(layout)
  if prefix is None:
    layout = layout or detect_layout(state_dict)
    norm = "" if "norm.weight" in state_dict or "norm.bias" in state_dict else None
    return EncoderKeys(dict(state_dict), layout, "", "", norm, (), {k: k for k in state_dict})

  plain: dict[str, str] = {}  # wrappers stripped -> as named in state_dict
  for key in state_dict:
    stripped = strip_wrappers(key)
    if stripped in plain:
      raise ValueError(f"state_dict keys {plain[stripped]!r} and {key!r} name the same weight "
                       f"once `module.` / `_orig_mod.` are stripped")
    plain[stripped] = key
  layouts = [layout] if layout else list(LAYOUTS)
  if prefix == "auto":
    candidates = []
    for stack in sorted({m.group(1) for key in plain if (m := _LAYER.match(key))}):
      for root in _roots(stack):
        for lay in layouts:
          if _matches(plain, root, stack, lay):
            candidates.append((root, stack, lay))
    candidates = _innermost(candidates)
    if len(candidates) != 1:
      shown = [f"prefix {r!r} (layers under {s!r}, layout {lay!r})" for r, s, lay in candidates]
      raise ValueError(
          (f"state_dict holds {len(candidates)} encoders: {'; '.join(shown)}; pass prefix= "
           f"to choose one") if candidates else
          (f"found no encoder in state_dict: no prefix P has {EMBEDDING_KEY!r} and "
           f"'layers.0.…' of a layout {tuple(layouts)} under it (the layers may also sit in one "
           f"container module below P). Its first keys: {list(plain)[:8]}"))
    root, stack, layout = candidates[0]
    logger.info("flax_encoder.pytorch: found the encoder at prefix %r (layers under %r), "
                "layout %r", root, stack, layout)
  else:
    root = prefix if not prefix or prefix.endswith(".") else prefix + "."
    root = strip_wrappers(root.rstrip(".")) + "." if root else ""
    stacks = [s for s in (root, *_children(plain, root))
              if any(k.startswith(s + "layers.") for k in plain)]
    if len(stacks) != 1:
      raise ValueError(f"prefix {prefix!r}: expected the layers at {root}layers.{{i}} or in one "
                       f"container below it, found them under {stacks or 'none of them'}")
    stack = stacks[0]
    if layout is None:
      layout = detect_layout(k[len(stack):] for k in plain if k.startswith(stack + "layers."))
  return _select(state_dict, plain, root, stack, layout)


def _roots(stack: str) -> list[str]:
  """Where the embedding of layers under `stack` may sit: beside them, or one level up."""
  parent = stack[:-1].rpartition(".")[0]
  return [stack] + ([parent + "." if parent else ""] if stack else [])


def _children(plain, root: str) -> list[str]:
  return sorted({root + k[len(root):].split(".")[0] + "." for k in plain
                 if k.startswith(root) and "." in k[len(root):]})


def _matches(plain, root: str, stack: str, layout: str) -> bool:
  return (root + EMBEDDING_KEY in plain
          and all(stack + "layers.0." + k in plain for k in layer_keys(layout)))


def _innermost(candidates):
  """Where one candidate's embedding and layers are another's too, the one whose root is the
  shorter is the same encoder seen from its parent: keep the other."""
  return [c for c in candidates
          if not any(o != c and o[1] == c[1] and len(o[0]) > len(c[0]) for o in candidates)]


def _select(state_dict, plain, root: str, stack: str, layout: str) -> EncoderKeys:
  norm = next((p for p in dict.fromkeys((stack, root)) if p + "norm.weight" in plain), None)
  wanted = {root + EMBEDDING_KEY: EMBEDDING_KEY, root + PE_KEY: PE_KEY}
  if norm is not None:
    wanted.update({norm + "norm.weight": "norm.weight", norm + "norm.bias": "norm.bias"})
  state, keys, ignored = {}, {}, []
  for stripped, key in plain.items():
    if stripped in wanted:
      name = wanted[stripped]
    elif stripped.startswith(stack + "layers."):
      name = stripped[len(stack):]  # all of them: extra ones are errors
    else:
      ignored.append(key)
      continue
    state[name], keys[name] = state_dict[key], key
  if ignored:
    logger.info("flax_encoder.pytorch: ignored %d keys outside the encoder, e.g. %s",
                len(ignored), ", ".join(ignored[:5]))
  return EncoderKeys(state, layout, root, stack, norm, tuple(ignored), keys)
