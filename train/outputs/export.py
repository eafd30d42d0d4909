"""Exports a run: a weights file for JAX, PyTorch weights, or a jax.export program.

  python -m train.export --workdir runs/demo --out encoder.msgpack
  python -m train.export --workdir runs/cls --out classifier.msgpack
  python -m train.export --workdir runs/demo --out encoder.safetensors [--layout torch_nn]
  python -m train.export --workdir runs/demo --out encoder.jaxexport [--seq-len 64]
  python -m train.export --workdir runs/bert-cls --layout hf --out bert-cls/
  python -m train.export --workdir runs/embed --layout sentence-transformers --out embedder/

A .msgpack file of a pretraining run holds the encoder's config and parameters; any JAX
program with the library installed loads it with `flax_encoder.weights.load_weights` (no
checkout, no orbax). Of a fine-tuning run, it holds what its task exports: for a classifier
the encoder, the head, the tokenizer and the classes, which
`flax_encoder.text_classifier.TextClassifier.load` turns into a function from texts to labels;
for regression and tagging the encoder alone (`--layout hf` writes their heads too). PyTorch
weights (.safetensors, .pt, .pth, .bin) need the `torch` extra. A .jaxexport file is the
compiled encoder with its weights (StableHLO for CPU and CUDA), taking int32 ids
[batch, seq_len]; it runs with `jax.export.deserialize(data).call(tokens)` and no code of this
package. `--layout hf` writes a directory transformers loads (train.outputs.hf_export);
`--layout sentence-transformers`, of a contrastive run, a folder `SentenceTransformer(DIR)`
and `flax_encoder.embeddings.SentenceEncoder.load(DIR)` load.
"""

from __future__ import annotations

import argparse
import os
import sys

from flax_encoder.inference import export_encoder
from flax_encoder.pytorch.layouts import LAYOUTS as TORCH_LAYOUTS
from flax_encoder.weights import save_weights
from train import tasks
from train.errors import RunError
from train.files import os_errors_of_safetensors, readable_as_umask_allows, stream, written_whole
from train.run.load import load_config, load_encoder
from train.run.workdir import out_problem, run_file

_TORCH = (".safetensors", ".pt", ".pth", ".bin")
SUFFIXES = (".msgpack", ".jaxexport", *_TORCH)
DIRECTORY_LAYOUTS = ("hf", "sentence-transformers")  # --out is a directory


class ExportError(Exception):
  """A request this command cannot carry out: reported as one line."""


def export(workdir: str, out: str, layout: str | None = None,
           seq_len: int | None = None) -> str:
  """Writes the newest verified checkpoint's encoder to `out`; returns the path.

  For a .jaxexport file, `seq_len` defaults to the run's config.train.seq_len. `layout` names
  the PyTorch weights' names (TORCH_LAYOUTS, "tutorial" where None) or, "hf" or
  "sentence-transformers", a new directory `out` (train.outputs.hf_export); a .msgpack or
  .jaxexport file takes none.
  """
  _check_layout(out, layout)
  if layout in DIRECTORY_LAYOUTS:
    return _export_directory(workdir, out, layout)
  if out.endswith(_TORCH):
    try:
      import torch  # noqa: F401 - the converters need it; the bridge's names load lazily
    except ImportError as e:
      raise ExportError(f"--out {out}: PyTorch weights need the torch extra "
                        f"(pip install -e '.[torch]'): {e}") from None
    layout = layout or "tutorial"
  if not os.path.isdir(workdir):
    raise ExportError(f"--workdir {workdir}: no such directory")
  problem = out_problem(out, workdir)
  if problem:
    raise ExportError(problem)
  with written_whole(out) as tmp, os_errors_of_safetensors():  # whatever stops the export
    _export(workdir, tmp, os.path.splitext(out)[1], layout, seq_len)
  return out if stream(out) else readable_as_umask_allows(out)


def _check_layout(out: str, layout: str | None) -> None:
  """Refuses a --layout there is none of, and one the file --out names does not take."""
  torch_files = ", ".join(_TORCH)
  if layout is not None and layout not in (*TORCH_LAYOUTS, *DIRECTORY_LAYOUTS):
    raise ExportError(f"--layout {layout}: unknown, expected {' or '.join(TORCH_LAYOUTS)} "
                      f"(PyTorch weights: --out {torch_files}) or "
                      f"{' or '.join(DIRECTORY_LAYOUTS)} (--out DIR)")
  if layout in DIRECTORY_LAYOUTS:
    return
  if not out.endswith(SUFFIXES):
    raise ExportError(f"--out must end in {', '.join(SUFFIXES)}, got {out!r}")
  if layout is not None and not out.endswith(_TORCH):
    raise ExportError(f"--layout {layout}: a {os.path.splitext(out)[1]} file takes no layout "
                      f"(it names the parameters of PyTorch weights: {torch_files}), expected "
                      f"it left out")


def _export_directory(workdir: str, out: str, layout: str) -> str:
  from train.outputs import hf_export
  if not os.path.isdir(workdir):
    raise ExportError(f"--workdir {workdir}: no such directory")
  problem = hf_export.check_out(out, layout) or (
      run_file(workdir, out) and f"--out {out}: inside the run's own {run_file(workdir, out)}")
  if problem:
    raise ExportError(problem)
  try:
    if layout == "hf":
      return hf_export.export_hf(workdir, out)
    return hf_export.export_sentence_transformers(workdir, out)
  except RunError as e:
    raise ExportError(str(e)) from None


def _export(workdir: str, path: str, suffix: str, layout: str, seq_len: int | None) -> None:
  """Writes the export `suffix` (one of SUFFIXES) names to `path`."""
  if suffix == ".msgpack":
    definition = tasks.definition(load_config(workdir).task.get("name", "masked_lm"))
    if definition.export is not None:
      try:
        definition.export(workdir, path)
        return
      except RunError as e:
        raise ExportError(str(e)) from None
  cfg, variables = load_encoder(workdir)
  if suffix == ".msgpack":
    save_weights(path, cfg, variables)
  elif suffix == ".jaxexport":
    export_encoder(cfg, variables, path, seq_len or load_config(workdir).train.seq_len)
  else:
    from flax_encoder.pytorch import to_torch_state_dict
    state = to_torch_state_dict(variables, cfg, layout)
    if suffix == ".safetensors":
      import safetensors.torch
      safetensors.torch.save_file({k: v.contiguous() for k, v in state.items()}, path)
    else:
      import torch
      torch.save(state, path)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m train.export", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--layout", default=None,
                      help="PyTorch weights: tutorial (the tutorial port's names, the default) "
                           "or torch_nn; hf: a Hugging Face directory (--out DIR); "
                           "sentence-transformers: a sentence-transformers folder of a "
                           "contrastive run (--out DIR); none for .msgpack and .jaxexport")
  parser.add_argument("--seq-len", type=int, default=None,
                      help=".jaxexport: input length (default: the run's train.seq_len)")
  args = parser.parse_args(argv)
  try:
    print(export(args.workdir, args.out, args.layout, args.seq_len))
  except (ExportError, RunError) as e:
    print(f"export: error: {e}", file=sys.stderr)
    return 2
  except FileNotFoundError as e:  # train.run.load: a workdir without a checkpoint to read
    print(f"export: error: {e}", file=sys.stderr)
    return 2
  except OSError as e:
    print(f"export: error: --out {args.out}: cannot write it ({e.strerror or e})",
          file=sys.stderr)
    return 1
  except ValueError as e:  # what the converters refuse of a model: one line naming it
    print(f"export: error: --layout {args.layout or 'tutorial'}: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
