r"""Sentence embeddings: flax_encoder.embeddings.SentenceEncoder (texts packed many to a row)
against sentence-transformers' SentenceTransformer.encode, in PyTorch and in ONNX Runtime,
sentences per second on real text.

  python -m benchmarks.embeddings --out benchmarks/results/embeddings.json  # minutes
  python -m benchmarks.embeddings --model DIR --texts 0   # a folder of one's own; all texts
  python -m benchmarks.embeddings --quick                 # a tiny BERT on 48 texts: seconds

The texts are the prose paragraphs of the pydoc topics this checkout ships
(benchmarks.finetune_packed.paragraphs: 1139, short and real); `--texts` of them (default 512),
evenly spaced through the file. The model is `--model`, else the published all-MiniLM-L6-v2
where the tests' cache holds it (tests/published.py; nothing is fetched here), else a random
BERT of MiniLM's sizes with a WordPiece tokenizer trained on the texts, mean pooling and
Normalize, saved by sentence-transformers into a temporary folder; the output says which.

Both sides get the texts as a list and return float32 numpy vectors; both tokenize inside the
timed call. Sides:

  ours                   SentenceEncoder.load(folder)(texts): each text its own segment of a
                         packed row, rows of 128 or 256 ids (at most max_seq_length).
  ours, a text a row     the same with one text a row (max_segments=1): what packing saves.
  ours bfloat16          SentenceEncoder.load(folder, dtype="bfloat16"): computed in bfloat16.
  ours int8              SentenceEncoder.load(folder, quantize="int8"): the dense layers in int8
                         (flax_encoder.quantized: weights a scale per output channel, activations
                         a scale per token, as they come). Skipped where qwix does not import.
  sentence-transformers  SentenceTransformer(folder, device="cpu").encode(texts, batch_size=B)
                         for B in `--batch-sizes` (its default is 32): sorted by length, each
                         batch padded to its longest.
  sentence-transformers ONNX
                         the same encode with the transformer run by ONNX Runtime on the CPU
                         (onnx_sentence_transformer), each B of `--batch-sizes`; the graph is
                         exported here into a temporary copy of the folder, nothing fetched.
                         Skipped, with the reason, where onnxruntime does not import.
  sentence-transformers ONNX int8
                         the same graph quantized by ONNX Runtime's dynamic quantization
                         (onnxruntime.quantization.quantize_dynamic: int8 weights a scale per
                         channel, activations quantized as they come), what
                         sentence-transformers' export_dynamic_quantized_onnx_model does through
                         optimum; each B of `--batch-sizes`.

Each side is called once untimed (ours compiles then: its first call and the shapes it
compiled are reported apart), then `--reps` times, interleaved across the sides, each after an
untimed pause (benchmarks.bench.PAUSE_S); a figure is the median. Before timing, our vectors
must agree with sentence-transformers' and with its ONNX side's (batch 32) to a cosine of
0.99999 for every text (the int8 and bfloat16 sides: `--min-cosine-quantized`, reported).
torch.set_num_threads(os.cpu_count()) and as many ONNX Runtime threads,
glibc malloc keeping freed memory for all (train.run.host.keep_freed_memory), float32
throughout.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time
import warnings

import numpy as np

from benchmarks import bench
from benchmarks.finetune_packed import MINILM, QUICK, paragraphs
from benchmarks.hf_walkthrough import wordpiece
from flax_encoder import embeddings
from flax_encoder.embeddings import SentenceEncoder
from train.run.host import keep_freed_memory

MIN_COSINE = 0.99999
SEQ_LEN = 256  # all-MiniLM-L6-v2's max_seq_length, the random model's too
ONNX_OPSET = 18  # optimum-onnx's default, which sentence-transformers' backend exports with
THEIRS = "sentence-transformers, batch "
THEIRS_ONNX = "sentence-transformers ONNX, batch "
THEIRS_INT8 = "sentence-transformers ONNX int8, batch "
MIN_COSINE_QUANTIZED = 0.95  # below it an int8 or bfloat16 side is no longer the model (reported)


def published_minilm() -> str | None:
  """The published all-MiniLM-L6-v2 where the tests' cache holds it (tests/published.py
  fetches it); None where it does not."""
  from tests import published
  folder = os.path.join(published.CACHE, f"all-MiniLM-L6-v2-{published.VERSION}")
  return folder if os.path.isfile(os.path.join(folder, "model.safetensors")) else None


def random_folder(folder: str, texts: list[str], sizes: dict) -> str:
  """A sentence-transformers folder at `folder`: a random BERT of `sizes` with a WordPiece
  tokenizer trained on `texts`, cut at SEQ_LEN ids, mean pooling, Normalize."""
  import torch
  import transformers
  from sentence_transformers import SentenceTransformer
  from sentence_transformers.base.modules import Normalize, Transformer
  from sentence_transformers.sentence_transformer.modules import Pooling
  torch.manual_seed(0)
  bert = os.path.join(folder, "bert")
  transformers.BertModel(transformers.BertConfig(**sizes)).save_pretrained(bert)
  tok, special = wordpiece(texts, 8000)
  transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **special).save_pretrained(bert)
  modules = [Transformer(bert, max_seq_length=min(SEQ_LEN, sizes["max_position_embeddings"])),
             Pooling(sizes["hidden_size"], pooling_mode="mean"), Normalize()]
  out = os.path.join(folder, "sentence-transformers")
  SentenceTransformer(modules=modules, device="cpu").save(out)
  return out


def onnx_sentence_transformer(folder: str, scratch: str):
  """(model, how it was made): sentence-transformers with its transformer run by ONNX Runtime
  on the CPU (as many threads as cores), made from a copy of `folder` in `scratch`; (None, why
  not) where onnxruntime does not import.

  Where optimum.onnxruntime imports it is sentence-transformers' own backend,
  SentenceTransformer(copy, backend="onnx"), which has optimum-onnx export the transformer on
  load. Elsewhere it is the same made here: the transformer exported by torch.onnx (the
  TorchScript exporter and opset optimum-onnx uses) to copy/onnx/model.onnx and an
  onnxruntime.InferenceSession standing in for it inside SentenceTransformer, taking the
  tokenizer's numpy ids and giving last_hidden_state back as a tensor, as the backend's
  ORTModelForFeatureExtraction does on the CPU. optimum-onnx 0.1, the newest, wants transformers
  < 4.58 where sentence-transformers 6 wants >= 5, so the two do not install together."""
  try:
    import onnxruntime as ort
  except ImportError as e:
    return None, f"onnxruntime does not import ({e})"
  from sentence_transformers import SentenceTransformer
  copy = shutil.copytree(folder, os.path.join(scratch, "onnx-copy"))
  options = ort.SessionOptions()
  options.intra_op_num_threads = os.cpu_count()
  try:
    importlib.import_module("optimum.onnxruntime")
  except ImportError as e:
    why = str(e).splitlines()[0]
  else:
    model = SentenceTransformer(copy, device="cpu", local_files_only=True, backend="onnx",
                                model_kwargs={"provider": "CPUExecutionProvider",
                                              "session_options": options})
    return model, "sentence-transformers' backend (optimum-onnx's export)"
  model = SentenceTransformer(copy, device="cpu", local_files_only=True)
  model[0].model = onnx_transformer(model[0].model, model[0].tokenizer.model_input_names,
                                    os.path.join(copy, "onnx", "model.onnx"), options)
  return model, f"torch.onnx here (optimum.onnxruntime does not import: {why})"


def onnx_int8(onnx_model, scratch: str):
  """(model, how): `onnx_model` (onnx_sentence_transformer's) with its graph quantized by ONNX
  Runtime's dynamic quantization (int8 weights, a scale per channel; activations quantized as
  they come: MatMulInteger), as optimum's avx512_vnni dynamic config, which
  sentence-transformers' export_dynamic_quantized_onnx_model takes, quantizes it; (None, why
  not) where onnx_model is None or the quantizer does not import."""
  if onnx_model is None:
    return None, "no ONNX side"
  try:
    from onnxruntime.quantization import QuantType, quantize_dynamic
  except ImportError as e:
    return None, f"onnxruntime.quantization does not import ({e})"
  import copy
  import onnxruntime as ort
  from sentence_transformers import SentenceTransformer
  if getattr(onnx_model[0].model, "session", None) is None:
    return None, "sentence-transformers' own ONNX backend: quantized by its export, not here"
  folder = os.path.join(scratch, "onnx-copy")
  target = os.path.join(folder, "onnx", "model_qint8.onnx")
  quantize_dynamic(os.path.join(folder, "onnx", "model.onnx"), target, per_channel=True,
                   weight_type=QuantType.QInt8)
  options = ort.SessionOptions()
  options.intra_op_num_threads = os.cpu_count()
  stand_in = copy.copy(onnx_model[0].model)  # the float graph's stand-in, on the int8 graph
  stand_in.session = ort.InferenceSession(target, options, providers=["CPUExecutionProvider"])
  model = SentenceTransformer(folder, device="cpu", local_files_only=True)
  model[0].model = stand_in
  return model, "onnxruntime.quantization.quantize_dynamic (per channel, QInt8)"


def onnx_transformer(transformer, names: list[str], path: str, options):
  """A torch module standing in for the Hugging Face `transformer`: `transformer` exported to
  `path` (inputs `names`, batch and length dynamic, output last_hidden_state) and run by an
  onnxruntime.InferenceSession on the CPU with `options`."""
  import onnxruntime as ort
  import torch
  from transformers.modeling_outputs import BaseModelOutput

  class Exported(torch.nn.Module):
    """`transformer` taking `names` in order and giving last_hidden_state."""

    def __init__(self):
      super().__init__()
      self.transformer = transformer

    def forward(self, *ids):
      return self.transformer(**dict(zip(names, ids))).last_hidden_state

  class Session(torch.nn.Module):
    """The session called as `transformer` is, with the tokenizer's features."""

    def __init__(self):
      super().__init__()
      self.config = transformer.config
      self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def forward(self, **features):
      feed = {name: features[name].numpy() for name in names}
      return BaseModelOutput(last_hidden_state=torch.from_numpy(self.session.run(None, feed)[0]))

  os.makedirs(os.path.dirname(path), exist_ok=True)
  ids = torch.ones((2, 8), dtype=torch.long)
  axes = {0: "batch", 1: "length"}
  with torch.no_grad(), warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the tracer's, on branches it fixes: measure checks vectors
    torch.onnx.export(Exported().eval(), tuple(ids for _ in names), path, input_names=names,
                      output_names=["last_hidden_state"], opset_version=ONNX_OPSET,
                      dynamic_axes={n: axes for n in [*names, "last_hidden_state"]},
                      do_constant_folding=True, dynamo=False)
  return Session()


def computed_ids(encoder: SentenceEncoder, ids: list[np.ndarray], batch_tokens: int) -> int:
  """The ids (real and padding) our calls encode for texts of `ids`, as __call__ packs them."""
  total = 0
  for start in range(0, len(ids), embeddings.CHUNK_TEXTS):
    lengths = [len(i) for i in ids[start:start + embeddings.CHUNK_TEXTS]]
    _, kinds = embeddings.assign_rows(lengths, encoder.row_lengths, encoder.max_segments)
    for k, length in enumerate(encoder.row_lengths):
      calls = embeddings.call_rows(int(np.sum(kinds == k)), max(1, batch_tokens // length))
      total += sum(calls) * length
  return total


def padded_ids(lengths: np.ndarray, batch: int) -> int:
  """The ids sentence-transformers encodes: the texts sorted by length, batches of `batch`,
  each padded to its longest."""
  ordered = np.sort(lengths)[::-1]
  return int(sum(ordered[i] * len(ordered[i:i + batch]) for i in range(0, len(ordered), batch)))


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
  """The least cosine between rows of `a` and `b`, the same texts' vectors."""
  return float(np.min(np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


def measure(folder: str, texts: list[str], batch_sizes: list[int], reps: int,
            scratch: str) -> dict:
  """The records of each side on `texts`, and what our first call and packing came to; the
  ONNX side's copy of `folder` goes in `scratch`."""
  from sentence_transformers import SentenceTransformer

  start = time.perf_counter()
  ours = SentenceEncoder.load(folder)
  loaded = time.perf_counter() - start
  vectors = ours(texts)
  first_call = time.perf_counter() - start - loaded
  compiled = sorted(ours.shapes)
  one_a_row = SentenceEncoder.load(folder, max_segments=1)
  theirs = SentenceTransformer(folder, device="cpu")
  reference = theirs.encode(texts, batch_size=32)
  cosine = min_cosine(vectors, reference)
  if cosine < MIN_COSINE:
    raise AssertionError(f"our vectors differ from sentence-transformers': min cosine "
                         f"{cosine:.7f} < {MIN_COSINE}: not the same model")
  start = time.perf_counter()
  theirs_onnx, how = onnx_sentence_transformer(folder, scratch)
  onnx = {"made": how}
  if theirs_onnx is None:
    print(f"sentence-transformers ONNX: skipped: {how}", file=sys.stderr)
  else:
    onnx["load_s"] = time.perf_counter() - start
    onnx_vectors = theirs_onnx.encode(texts, batch_size=32)
    onnx.update(min_cosine=min_cosine(vectors, onnx_vectors),
                max_abs_diff=float(np.abs(vectors - onnx_vectors).max()))
    if onnx["min_cosine"] < MIN_COSINE:
      raise AssertionError(f"our vectors differ from sentence-transformers ONNX's: min cosine "
                           f"{onnx['min_cosine']:.7f} < {MIN_COSINE}")

  quantized, theirs_int8 = {}, None
  if theirs_onnx is not None:
    theirs_int8, how = onnx_int8(theirs_onnx, scratch)
    onnx["int8"] = how
    if theirs_int8 is not None:
      quantized[f"{THEIRS_INT8}32"] = min_cosine(theirs_int8.encode(texts, batch_size=32),
                                                 reference)
  ours_bf16 = SentenceEncoder.load(folder, dtype="bfloat16")
  quantized["ours bfloat16"] = min_cosine(ours_bf16(texts), reference)
  try:
    ours_int8 = SentenceEncoder.load(folder, quantize="int8")
  except ValueError as e:  # qwix missing
    ours_int8 = None
    print(f"ours int8: skipped: {e}", file=sys.stderr)
  else:
    quantized["ours int8"] = min_cosine(ours_int8(texts), reference)
  for name, cos in quantized.items():
    if cos < MIN_COSINE_QUANTIZED:
      raise AssertionError(f"{name}: min cosine to sentence-transformers' float32 {cos:.5f} < "
                           f"{MIN_COSINE_QUANTIZED}")

  runners = {"ours": lambda: ours(texts),
             "ours, a text a row": lambda: one_a_row(texts),
             "ours bfloat16": lambda: ours_bf16(texts)}
  if ours_int8 is not None:
    runners["ours int8"] = lambda: ours_int8(texts)
  for b in batch_sizes:
    runners[f"{THEIRS}{b}"] = lambda b=b: theirs.encode(texts, batch_size=b)
  for b in batch_sizes if theirs_onnx is not None else []:
    runners[f"{THEIRS_ONNX}{b}"] = lambda b=b: theirs_onnx.encode(texts, batch_size=b)
  for b in batch_sizes if theirs_int8 is not None else []:
    runners[f"{THEIRS_INT8}{b}"] = lambda b=b: theirs_int8.encode(texts, batch_size=b)
  seconds = bench.interleaved(runners, reps, warmup=1)

  ids = ours.tokenize(texts)
  lengths = np.asarray([len(i) for i in ids])
  computed = {"ours": computed_ids(ours, ids, embeddings.BATCH_TOKENS),
              "ours, a text a row": computed_ids(one_a_row, ids, embeddings.BATCH_TOKENS)}
  computed["ours bfloat16"] = computed["ours int8"] = computed["ours"]
  for b in batch_sizes:
    computed[f"{THEIRS}{b}"] = computed[f"{THEIRS_ONNX}{b}"] = padded_ids(lengths, b)
    computed[f"{THEIRS_INT8}{b}"] = computed[f"{THEIRS}{b}"]
  theirs_best = min(s for name, s in seconds.items() if name.startswith(THEIRS))
  theirs_default = seconds.get(f"{THEIRS}32", theirs_best)
  onnx_best = min((s for name, s in seconds.items() if name.startswith(THEIRS_ONNX)),
                  default=None)
  int8_best = min((s for name, s in seconds.items() if name.startswith(THEIRS_INT8)),
                  default=None)
  records = [{"impl": name, "seconds": s, "sentences_per_s": len(texts) / s,
              "computed_ids": computed[name], "real_ids": int(lengths.sum()),
              "real_fraction": float(lengths.sum() / computed[name]),
              "over_best_sentence_transformers": theirs_best / s,
              "over_sentence_transformers_batch_32": theirs_default / s,
              "over_best_sentence_transformers_onnx": onnx_best and onnx_best / s,
              "over_best_sentence_transformers_onnx_int8": int8_best and int8_best / s,
              "over_ours_float32": seconds["ours"] / s,
              "min_cosine_to_float32": quantized.get(
                  f"{THEIRS_INT8}32" if name.startswith(THEIRS_INT8) else name)}
             for name, s in seconds.items()]
  return {"records": records, "min_cosine": cosine,
          "max_abs_diff": float(np.abs(vectors - reference).max()), "onnx": onnx,
          "ours": {"load_s": loaded, "first_call_s": first_call,
                   "compiled_shapes": [list(s) for s in compiled],
                   "row_lengths": list(ours.row_lengths),
                   "max_segments": list(ours.max_segments),
                   "batch_tokens": embeddings.BATCH_TOKENS},
          "data": {"texts": len(texts), "max_seq_length": ours.max_seq_length,
                   "median_ids": float(np.median(lengths)), "mean_ids": float(lengths.mean()),
                   "cut_fraction": float(np.mean(lengths >= ours.max_seq_length))}}


def table(records: list[dict]) -> str:
  lines = ["| implementation | sentences / s | real / computed ids | over sentence-transformers' "
           "best | over its default (batch 32) | over its ONNX best | over its ONNX int8 best "
           "| over ours float32 | least cosine to float32 |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  shown = lambda x, fmt=".2f": "-" if x is None else format(x, fmt)
  for r in records:
    lines.append(f"| {r['impl']} | {r['sentences_per_s']:,.1f} | {r['real_fraction']:.0%} | "
                 f"{r['over_best_sentence_transformers']:.2f} | "
                 f"{r['over_sentence_transformers_batch_32']:.2f} | "
                 f"{shown(r['over_best_sentence_transformers_onnx'])} | "
                 f"{shown(r['over_best_sentence_transformers_onnx_int8'])} | "
                 f"{r['over_ours_float32']:.2f} | {shown(r['min_cosine_to_float32'], '.5f')} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.embeddings", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", default=None,
                      help="a sentence-transformers folder (default: the published "
                           "all-MiniLM-L6-v2 if cached, else a random one of its sizes)")
  parser.add_argument("--texts", type=int, default=None,
                      help="texts encoded, evenly spaced (default 512; 48 quick; 0: all)")
  parser.add_argument("--batch-sizes", default=None,
                      help="sentence-transformers' batch sizes, comma-separated "
                           "(default 16,32,64,128; 32 quick)")
  parser.add_argument("--reps", type=int, default=None,
                      help="timed calls per side, interleaved (default 3; 1 quick)")
  parser.add_argument("--quick", action="store_true",
                      help="a tiny random BERT (unless --model), 48 texts, 1 rep: seconds")
  parser.add_argument("--out", default=None, help="results JSON (default: print only)")
  args = parser.parse_args(argv)
  count = args.texts if args.texts is not None else (48 if args.quick else 512)
  batch_sizes = [int(b) for b in (args.batch_sizes or ("32" if args.quick else
                                                       "16,32,64,128")).split(",")]
  reps = args.reps or (1 if args.quick else 3)

  malloc = "keep" if keep_freed_memory() else "default (not glibc)"
  import torch
  import transformers
  transformers.utils.logging.disable_progress_bar()
  transformers.utils.logging.set_verbosity_error()
  torch.set_num_threads(os.cpu_count())
  texts = paragraphs()[0]
  if count:
    texts = [texts[i] for i in np.unique(np.linspace(0, len(texts) - 1, min(count, len(texts)))
                                         .round().astype(int))]
  load_before = os.getloadavg()
  with tempfile.TemporaryDirectory() as scratch:
    folder = args.model or (None if args.quick else published_minilm())
    if folder:
      model = folder
    else:
      sizes = QUICK if args.quick else MINILM
      folder = random_folder(scratch, paragraphs()[0], sizes)
      model = (f"random BERT (hidden {sizes['hidden_size']}, {sizes['num_hidden_layers']} "
               f"layers), WordPiece trained on the texts, mean pooling, Normalize")
    measured = measure(folder, texts, batch_sizes, reps, scratch)
  results = {"environment": {**bench.environment(), "transformers": transformers.__version__,
                             "sentence_transformers": _version("sentence_transformers"),
                             "onnxruntime": _version("onnxruntime"),
                             "optimum_onnx": _version("optimum-onnx"),
                             "malloc": malloc, "load_average_before": load_before,
                             "load_average_after": os.getloadavg()},
             "model": model, "dtype": "float32", "reps": reps, **measured}
  print(f"model: {model}")
  print(table(measured["records"]))
  first = measured["ours"]
  print(f"ours: first call {first['first_call_s']:.1f} s (load {first['load_s']:.1f} s), "
        f"{len(first['compiled_shapes'])} shapes compiled {first['compiled_shapes']}; "
        f"min cosine to sentence-transformers {measured['min_cosine']:.7f}", file=sys.stderr)
  onnx = measured["onnx"]
  if "min_cosine" in onnx:
    print(f"sentence-transformers ONNX: {onnx['made']}; made and loaded in "
          f"{onnx['load_s']:.1f} s; min cosine to ours {onnx['min_cosine']:.7f}",
          file=sys.stderr)
  if args.out:
    bench.write_results(args.out, results)
  return 0


def _version(package: str) -> str | None:
  """`package`'s installed version; None where it is not installed."""
  from importlib.metadata import PackageNotFoundError, version
  try:
    return version(package)
  except PackageNotFoundError:
    return None


if __name__ == "__main__":
  sys.exit(main())
