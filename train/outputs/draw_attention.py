"""Draws every head's attention weights of every layer for one text, as a PNG grid.

  python -m train.draw_attention --workdir runs/demo --text "The quick brown fox"

The text is encoded with the run's own tokenizer (bytes, or the subword vocabulary its
prepared data records); the axes are labelled with its bytes or pieces.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import jax.numpy as jnp
import numpy as np

from flax_encoder import Encoder
from train.cli import HelpFormatter
from train.data import dataset
from train.data.tokens import Tokenizer
from train.files import unwritable_kind, written_whole


def attention_weights(cfg, variables, tokenizer: Tokenizer,
                      text: str) -> tuple[np.ndarray, list[str]]:
  """Sown attention weights [layers, heads, seq, seq] of `text`, and its tokens' labels. They
  are computed by the reference attention, the one that keeps its weights, whichever the run
  trained with."""
  tokens = tokenizer.encode_batch([text])[0][None, :cfg.max_len]
  cfg = dataclasses.replace(cfg, attention_impl="reference")
  _, state = Encoder(cfg).apply(variables, jnp.asarray(tokens), mutable=["intermediates"])
  inter = state["intermediates"]
  if cfg.scan_layers:
    weights = np.asarray(inter["layers"]["self_attn"]["attention_weights"][0])[:, 0]
  elif cfg.shared_layers:  # one layer's parameters, its weights sown at each depth in turn
    weights = np.stack([np.asarray(w[0]) for w in
                        inter["shared_layer"]["self_attn"]["attention_weights"]])
  else:
    weights = np.stack([np.asarray(inter[f"layers_{i}"]["self_attn"]["attention_weights"][0][0])
                        for i in range(cfg.n_layers)])
  return weights, tokenizer.pieces(tokens[0])


def draw(weights: np.ndarray, labels: list[str], path: str, title: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  n_layers, n_heads, seq, _ = weights.shape
  size = max(2.0, 0.12 * seq + 1)
  # A constrained layout keeps the figure's title clear of the first row's titles.
  fig, axes = plt.subplots(n_layers, n_heads, figsize=(size * n_heads, size * n_layers),
                           squeeze=False, layout="constrained")
  shown = ["␣" if c == " " else c for c in labels] if seq <= 64 else None  # ticks if legible
  for layer in range(n_layers):
    for head in range(n_heads):
      ax = axes[layer, head]
      ax.imshow(weights[layer, head], cmap="viridis", vmin=0, vmax=1)
      ax.set_title(f"layer {layer} head {head}", fontsize=9)
      if shown:
        ax.set_xticks(range(seq), shown, fontsize=6, family="monospace")
        ax.set_yticks(range(seq), shown, fontsize=6, family="monospace")
      else:
        ax.set_xticks([]), ax.set_yticks([])
  fig.suptitle(title + "  (rows: queries, columns: keys)")
  fig.savefig(path, dpi=110, format="png")
  plt.close(fig)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m train.draw_attention", description=__doc__,
                                   formatter_class=HelpFormatter)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--text", required=True)
  parser.add_argument("--out", help="PNG path (default: WORKDIR/plots/attention.png)")
  args = parser.parse_args(argv)
  if not args.text:
    parser.error("--text must not be empty")
  from train import tasks
  from train.run.load import load_config, load_encoder
  config = load_config(args.workdir)
  definition = tasks.definition(config.task.get("name", "masked_lm"))
  tokenizer = (definition.tokenizer(config, args.workdir) if definition.tokenizer
               else dataset.run_tokenizer(config, args.workdir).load())
  cfg, variables = load_encoder(args.workdir)
  weights, labels = attention_weights(cfg, variables, tokenizer, args.text)
  out = args.out or os.path.join(args.workdir, "plots", "attention.png")
  if unwritable_kind(out):
    parser.error(f"--out {out}: {unwritable_kind(out)}, expected the name of a PNG file (or a "
                 f"stream)")
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with written_whole(out) as tmp:  # a picture whole or none; a stream is written, not replaced
    draw(weights, labels, tmp, f"attention weights for {args.text[:60]!r}")
  print(out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
