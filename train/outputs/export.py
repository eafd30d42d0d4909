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
import dataclasses
import os
import sys
import textwrap
from collections.abc import Callable

from flax_encoder.inference import export_encoder
from flax_encoder.pytorch.layouts import LAYOUTS as TORCH_LAYOUTS
from flax_encoder.weights import save_weights
from train import tasks
from train.cli import HelpFormatter
from train.errors import RunError
from train.files import os_errors_of_safetensors, readable_as_umask_allows, stream, written_whole
from train.outputs import hf_export
from train.run.load import load_config, load_encoder
from train.run.workdir import out_problem, run_file

TORCH_DEFAULT = "tutorial"  # the layout of PyTorch weights where --layout is left out


class ExportError(Exception):
  """A request this command cannot carry out: reported as one line."""


@dataclasses.dataclass(frozen=True)
class FileFormat:
  """What `--out FILE` writes, by the file's suffix: its description (--help's), and
  `write(workdir, path, suffix, layout, seq_len)`, which writes the run's export to `path`.
  PyTorch weights (`torch`) are named by a --layout and need the torch extra."""
  description: str
  write: Callable[[str, str, str, str | None, int | None], None]
  torch: bool = False


@dataclasses.dataclass(frozen=True)
class DirectoryLayout:
  """What `--layout NAME --out DIR` writes: its description (--help's), and `write(workdir,
  out)`, which makes the directory `out` and returns its path."""
  description: str
  write: Callable[[str, str], str]


def _msgpack(workdir: str, path: str, suffix: str, layout: str | None,
             seq_len: int | None) -> None:
  definition = tasks.definition(load_config(workdir).task.get("name", "masked_lm"))
  if definition.export is None:
    save_weights(path, *load_encoder(workdir))
    return
  try:
    definition.export(workdir, path)
  except RunError as e:
    raise ExportError(str(e)) from None


def _jaxexport(workdir: str, path: str, suffix: str, layout: str | None,
               seq_len: int | None) -> None:
  cfg, variables = load_encoder(workdir)
  export_encoder(cfg, variables, path, seq_len or load_config(workdir).train.seq_len)


def _torch_weights(workdir: str, path: str, suffix: str, layout: str | None,
                   seq_len: int | None) -> None:
  from flax_encoder.pytorch.convert import save_torch_checkpoint, to_torch_state_dict
  cfg, variables = load_encoder(workdir)
  save_torch_checkpoint(to_torch_state_dict(variables, cfg, layout), path, suffix)


# --out's suffix -> its format: a new one is an entry here (PyTorch weights one in
# flax_encoder.pytorch.convert.CHECKPOINT_FILES too).
FORMATS = {
    ".msgpack": FileFormat("the encoder's config and parameters (flax_encoder.weights), or what "
                           "the run's task exports", _msgpack),
    ".jaxexport": FileFormat("the compiled encoder with its weights (jax.export), taking int32 "
                             "ids [batch, --seq-len]", _jaxexport),
    ".safetensors": FileFormat("PyTorch weights (--layout) as safetensors", _torch_weights,
                               torch=True),
    ".pt": FileFormat("PyTorch weights (--layout) as torch.save writes them", _torch_weights,
                      torch=True),
    ".pth": FileFormat("the same as .pt", _torch_weights, torch=True),
    ".bin": FileFormat("the same as .pt", _torch_weights, torch=True),
}
# --layout NAME that makes --out a directory -> what it writes (train.outputs.hf_export).
DIRECTORY_LAYOUTS = {
    "hf": DirectoryLayout("a Hugging Face directory transformers loads", hf_export.export_hf),
    "sentence-transformers": DirectoryLayout("a sentence-transformers folder of a contrastive "
                                             "run", hf_export.export_sentence_transformers),
}


def export(workdir: str, out: str, layout: str | None = None,
           seq_len: int | None = None) -> str:
  """Writes the newest verified checkpoint's encoder to `out`; returns the path.

  For a .jaxexport file, `seq_len` defaults to the run's config.train.seq_len. `layout` names
  the PyTorch weights' names (TORCH_LAYOUTS, TORCH_DEFAULT where None) or, one of
  DIRECTORY_LAYOUTS, a new directory `out` (train.outputs.hf_export); a file of another of
  FORMATS takes none.
  """
  _check_layout(out, layout)
  if layout in DIRECTORY_LAYOUTS:
    return _export_directory(workdir, out, layout)
  suffix = _suffix(out)
  if FORMATS[suffix].torch:
    try:
      import torch  # noqa: F401 - the converters need it; the bridge's names load lazily
    except ImportError as e:
      raise ExportError(f"--out {out}: PyTorch weights need the torch extra "
                        f"(pip install -e '.[torch]'): {e}") from None
    layout = layout or TORCH_DEFAULT
  if not os.path.isdir(workdir):
    raise ExportError(f"--workdir {workdir}: no such directory")
  problem = out_problem(out, workdir)
  if problem:
    raise ExportError(problem)
  with written_whole(out) as tmp, os_errors_of_safetensors():  # whatever stops the export
    FORMATS[suffix].write(workdir, tmp, suffix, layout, seq_len)
  return out if stream(out) else readable_as_umask_allows(out)


def _suffix(out: str) -> str | None:
  """The key of FORMATS `out` ends in, or None."""
  return next((suffix for suffix in FORMATS if out.endswith(suffix)), None)


def _check_layout(out: str, layout: str | None) -> None:
  """Refuses a --layout there is none of, and one the file --out names does not take."""
  torch_files = ", ".join(s for s, f in FORMATS.items() if f.torch)
  if layout is not None and layout not in (*TORCH_LAYOUTS, *DIRECTORY_LAYOUTS):
    raise ExportError(f"--layout {layout}: unknown, expected {' or '.join(TORCH_LAYOUTS)} "
                      f"(PyTorch weights: --out {torch_files}) or "
                      f"{' or '.join(DIRECTORY_LAYOUTS)} (--out DIR)")
  if layout in DIRECTORY_LAYOUTS:
    return
  suffix = _suffix(out)
  if suffix is None:
    raise ExportError(f"--out must end in {', '.join(FORMATS)}, got {out!r}")
  if layout is not None and not FORMATS[suffix].torch:
    raise ExportError(f"--layout {layout}: a {os.path.splitext(out)[1]} file takes no layout "
                      f"(it names the parameters of PyTorch weights: {torch_files}), expected "
                      f"it left out")


def _export_directory(workdir: str, out: str, layout: str) -> str:
  if not os.path.isdir(workdir):
    raise ExportError(f"--workdir {workdir}: no such directory")
  problem = hf_export.check_out(out, layout) or (
      run_file(workdir, out) and f"--out {out}: inside the run's own {run_file(workdir, out)}")
  if problem:
    raise ExportError(problem)
  try:
    return DIRECTORY_LAYOUTS[layout].write(workdir, out)
  except RunError as e:
    raise ExportError(str(e)) from None


def formats_help() -> str:
  """--help's list of FORMATS and DIRECTORY_LAYOUTS."""
  def listed(table: dict) -> list[str]:
    width = max(map(len, table)) + 2
    return [line for key, value in table.items()
            for line in textwrap.wrap(value.description, 94, initial_indent=f"  {key:<{width}}",
                                      subsequent_indent=" " * (width + 2),
                                      break_on_hyphens=False)]

  return "\n".join(["--out FILE, by its suffix:", "", *listed(FORMATS), "",
                    "--layout NAME --out DIR:", "", *listed(DIRECTORY_LAYOUTS)])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m train.export", description=__doc__,
                                   epilog=formats_help(),
                                   formatter_class=HelpFormatter)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--out", required=True,
                      help=f"a file ({', '.join(FORMATS)}) or, with a --layout of "
                           f"{' or '.join(DIRECTORY_LAYOUTS)}, a directory DIR (below)")
  parser.add_argument("--layout", default=None,
                      help=f"PyTorch weights: {' or '.join(TORCH_LAYOUTS)} (default "
                           f"{TORCH_DEFAULT}: the tutorial port's names); "
                           f"{' or '.join(DIRECTORY_LAYOUTS)}: --out DIR (below); none for "
                           f"{' and '.join(s for s, f in FORMATS.items() if not f.torch)}")
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
    print(f"export: error: --layout {args.layout or TORCH_DEFAULT}: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
