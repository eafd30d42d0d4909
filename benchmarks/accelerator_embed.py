"""The sentence-embedding parts of `python -m benchmarks.accelerator`: `embed` (encoding
throughput of flax_encoder.embeddings.SentenceEncoder against sentence-transformers) and
`contrastive` (the training step of configs/embed.py's contrastive task). Each function returns
the part's {"rows": [...], "notes": [...]}; benchmarks/accelerator.py runs them, each in a
process of its own, and its docstring says what they measure.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time

import numpy as np

# name -> (transformers.BertConfig's sizes, at full size; at tiny sizes)
EMBED_MODELS = {
    "minilm": ("MiniLM-L6 size", dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                                      num_attention_heads=12, intermediate_size=1536,
                                      max_position_embeddings=512),
               dict(vocab_size=8000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=37, max_position_embeddings=128)),
    "base": ("BERT-base size", dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                                    num_attention_heads=12, intermediate_size=3072,
                                    max_position_embeddings=512),
             dict(vocab_size=8000, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=128)),
}
EMBED_TEXTS = 8192  # the pydoc paragraphs (1,139) repeated; tiny runs take 96 of them
EMBED_BATCH_SIZES = (32, 128, 512)  # sentence-transformers' encode(batch_size=B); 32 its default
MIN_COSINE = 0.99  # ours (bfloat16) against sentence-transformers (float16) for every text
THEIRS = "sentence-transformers, batch "


def quick_cpu_compiles() -> None:
  """XLA's quicker CPU compilation for this process (tests.runs.QUICK_CPU: a tiny model's
  training step compiles in a fifth of the time on a small CPU), for tiny runs: to be called
  before JAX starts its backend."""
  from tests.runs import QUICK_CPU
  os.environ["XLA_FLAGS"] = f"{QUICK_CPU} {os.environ.get('XLA_FLAGS', '')}".strip()


def sentence_folder(directory: str, texts: list[str], sizes: dict) -> str:
  """A sentence-transformers folder in `directory` without sentence-transformers (which a GPU
  image may lack): a random transformers BertModel of `sizes` (seed 0) and a WordPiece
  tokenizer trained on `texts` (benchmarks.embeddings' random model), with the modules.json,
  mean Pooling and Normalize that flax_encoder.embeddings.save_modules writes, texts cut to
  benchmarks.embeddings.SEQ_LEN ids (at most the positions)."""
  import torch
  import transformers

  from benchmarks.embeddings import SEQ_LEN
  from benchmarks.hf_walkthrough import wordpiece
  from flax_encoder.embeddings import Normalize, Pooling, SentenceModel, save_modules
  from flax_encoder.families import config_from_hf
  torch.manual_seed(0)
  config = transformers.BertConfig(**sizes)
  transformers.BertModel(config).save_pretrained(directory)
  tok, special = wordpiece(texts, 8000)
  transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **special).save_pretrained(directory)
  model = SentenceModel(config_from_hf(config.to_dict()), Pooling(("mean",)), (Normalize(),))
  save_modules(directory, model, {}, min(SEQ_LEN, sizes["max_position_embeddings"]))
  return directory


def sentence_transformers_device() -> tuple[str | None, str]:
  """(where sentence-transformers' side runs, or None, and a note saying why not)."""
  import jax
  missing = [m for m in ("torch", "transformers", "sentence_transformers")
             if importlib.util.find_spec(m) is None]
  if missing:
    return None, f"sentence-transformers' side skipped: {' and '.join(missing)} not installed"
  import torch
  if jax.default_backend() == "cpu":
    return "cpu", ("tiny sizes on the CPU: sentence-transformers in float32 on the CPU (its "
                   "bfloat16 is slow there)")
  if jax.default_backend() != "gpu":
    return None, (f"sentence-transformers' side skipped: JAX runs on {jax.default_backend()}, "
                  f"not a GPU")
  if not torch.cuda.is_available():
    return None, f"sentence-transformers' side skipped: torch {torch.__version__} has no CUDA"
  return "cuda", ""


def _texts(tiny: bool) -> list[str]:
  """The pydoc paragraphs: 96 evenly spaced (tiny), else repeated to EMBED_TEXTS."""
  from benchmarks.finetune_packed import paragraphs
  texts = paragraphs()[0]
  if tiny:
    return [texts[i] for i in np.linspace(0, len(texts) - 1, 96).round().astype(int)]
  return [texts[i % len(texts)] for i in range(EMBED_TEXTS)]


def _ours(folder: str, texts: list[str], attention: str, notes: list[str]):
  """(SentenceEncoder of `folder` in bfloat16, its first call's vectors, seconds, attention),
  by `attention`, else by "xla" where that fails (said in `notes`)."""
  from flax_encoder.embeddings import SentenceEncoder
  for impl in dict.fromkeys([attention, "xla"]):
    try:
      start = time.perf_counter()
      ours = SentenceEncoder.load(folder, dtype="bfloat16", attention_impl=impl)
      vectors = ours(texts)  # compiles each shape of call
      return ours, vectors, time.perf_counter() - start, impl
    except Exception as e:  # noqa: BLE001 - a kernel's failures are many and varied
      if impl == "xla":
        raise
      notes.append(f"ours with attention {impl} failed, xla instead: {type(e).__name__}: "
                   f"{str(e)[:200]}")
  raise AssertionError("unreachable")


def embed(tiny: bool, variant: str | None, attention: str, reps: int | None = None) -> dict:
  """Sentences/s and real tokens/s of SentenceEncoder (bfloat16, texts packed) and of
  SentenceTransformer.encode at each of EMBED_BATCH_SIZES (float16 on a GPU), on the same
  texts; `variant`: one of EMBED_MODELS, None for all."""
  os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: nothing is fetched
  os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
  import transformers

  from benchmarks.bench import interleaved
  from benchmarks.embeddings import computed_ids, min_cosine, padded_ids
  from benchmarks.finetune_packed import paragraphs
  transformers.utils.logging.disable_progress_bar()
  transformers.utils.logging.set_verbosity_error()
  device, why = sentence_transformers_device()
  texts = _texts(tiny)
  batch_sizes = (8, 32) if tiny else EMBED_BATCH_SIZES
  reps = reps or (2 if tiny else 5)
  rows, notes = [], [why] if why else []
  for key in [variant] if variant else list(EMBED_MODELS):
    name, full, small = EMBED_MODELS[key]
    sizes = small if tiny else full
    with tempfile.TemporaryDirectory() as directory:
      folder = sentence_folder(directory, paragraphs()[0], sizes)
      ours, vectors, first_s, impl = _ours(folder, texts, attention, notes)
      ids = ours.tokenize(texts)
      lengths = np.asarray([len(i) for i in ids])
      real = int(lengths.sum())
      batch_tokens = ours.default_batch_tokens()
      computed = {"ours": computed_ids(ours, ids, batch_tokens)}
      runners = {"ours": lambda ours=ours: ours(texts)}
      int8_cosine = None
      try:  # the dense layers in int8 (flax_encoder.quantized), beside bfloat16
        int8 = ours.quantized("int8")
        int8_cosine = min_cosine(int8(texts), vectors)
        runners["ours int8"] = lambda int8=int8: int8(texts)
        computed["ours int8"] = computed["ours"]
      except Exception as e:  # noqa: BLE001 - qwix missing, or the device's int8 products
        notes.append(f"{name}: ours int8 skipped: {type(e).__name__}: {str(e)[:200]}")
      cosine = diff = None
      theirs_dtype = None
      if device:
        import torch
        from sentence_transformers import SentenceTransformer
        theirs_dtype = torch.float16 if device == "cuda" else torch.float32
        if device == "cpu":  # tiny runs: OpenMP's teams stall beside XLA's threads on a small CPU
          torch.set_num_threads(1)
        theirs = SentenceTransformer(folder, device=device, model_kwargs={
            "dtype": theirs_dtype, "attn_implementation": "sdpa"})
        reference = np.asarray(theirs.encode(texts, batch_size=32, show_progress_bar=False),
                               np.float32)
        cosine = min_cosine(vectors, reference)
        diff = float(np.abs(vectors - reference).max())
        if cosine < MIN_COSINE:
          raise AssertionError(f"{name}: our vectors differ from sentence-transformers': min "
                               f"cosine {cosine:.5f} < {MIN_COSINE}: not the same model")
        for b in batch_sizes:
          runners[f"{THEIRS}{b}"] = lambda b=b, theirs=theirs: theirs.encode(
              texts, batch_size=b, show_progress_bar=False)
          computed[f"{THEIRS}{b}"] = padded_ids(lengths, b)
      seconds = interleaved(runners, reps=reps, warmup=1)
      best = min((s for n, s in seconds.items() if n.startswith(THEIRS)), default=None)
      for impl_name, s in seconds.items():
        row = {"model": name, "impl": impl_name, "texts": len(texts),
               "sentences/s": round(len(texts) / s, 1), "real tokens/s": round(real / s),
               "real / computed ids": f"{real / computed[impl_name]:.0%}"}
        if best:
          row["speed vs best sentence-transformers"] = f"{best / s:.2f}x"
        if impl_name == "ours" and cosine is not None:
          row["min cosine vs sentence-transformers"] = round(cosine, 5)
        if impl_name == "ours int8":
          row["min cosine vs ours bfloat16"] = round(int8_cosine, 5)
        rows.append(row)
      notes.append(
          f"{name} ({sizes['num_hidden_layers']} layers, {sizes['hidden_size']} wide, "
          f"{sizes['num_attention_heads']} heads, ff {sizes['intermediate_size']}): "
          f"{len(texts)} texts, {real} real ids (median {np.median(lengths):.0f} a text), "
          f"max_seq_length {ours.max_seq_length}; ours: bfloat16, attention {impl}, rows of "
          f"{list(ours.row_lengths)} ids, batch_tokens {batch_tokens} a call, first call "
          f"{first_s:.1f} s (load and {len(ours.shapes)} shapes compiled)"
          + (f"; theirs: {theirs_dtype}, sdpa, on {device}; min cosine {cosine:.5f}, max abs "
             f"diff {diff:.2e}" if cosine is not None else ""))
      del ours, runners
      int8 = None
      if device:
        del theirs
        if device == "cuda":
          torch.cuda.empty_cache()
  notes.append("each side called once untimed, then interleaved, medians of "
               f"{reps}; both tokenize inside the timed call and return numpy vectors; real "
               "ids count [CLS] and [SEP]; computed ids: ours packed rows, theirs each batch "
               "padded to its longest (texts sorted by length); random weights, WordPiece "
               "trained on the texts, mean pooling, Normalize")
  return {"rows": rows, "notes": notes}


# ---------------------------------------------------------------------------------------------
# The contrastive training step


def made_up_pairs(n: int, seq_len: int, vocab_size: int, tiny: bool, seed: int = 0) -> dict:
  """{'anchor', 'positive': int32 [n, seq_len]}, prepared rows as train.tasks.contrastive
  writes them: random ids (none of them padding, 0), then padding; anchors of 8 to 32 ids,
  positives of 32 to seq_len (tiny: 3 to 8, and 6 to seq_len): a query and a passage."""
  rng = np.random.default_rng(seed)
  spans = {"anchor": (3, 8) if tiny else (8, 32), "positive": (6 if tiny else 32, seq_len)}
  rows = {}
  for name, (low, high) in spans.items():
    lengths = rng.integers(low, high + 1, n)
    ids = rng.integers(1, vocab_size, (n, seq_len)).astype(np.int32)
    rows[name] = np.where(np.arange(seq_len)[None, :] < lengths[:, None], ids, 0)
  return rows


def contrastive(tiny: bool, attention: str, reps: int | None = None) -> dict:
  """The training step of `python -m train --config=configs/embed.py` (the contrastive task,
  packed pairs, the pretrained recipe's AdamW) at BERT-base size, bfloat16 compute, GradCache
  off and on: pairs/s and MFU."""
  import jax
  import jax.numpy as jnp

  from benchmarks import hf
  from benchmarks.bench import interleaved, matmul_peak
  from benchmarks.workload import flops_per_token
  from configs import embed as embed_config
  from flax_encoder.families import config_from_hf
  from train.run import optim
  from train.run.step import init_state, make_train_step
  from train.run.throughput import device_peak
  from train.tasks import packed_pairs
  from train.tasks.contrastive import ContrastiveTask, RankingLoss, sentence_model
  config = embed_config.get_config()
  config.train.batch_size, config.train.seq_len = (8, 32) if tiny else (256, 128)
  config.task.mini_batch = 4 if tiny else config.task.mini_batch
  config.init.hf = "BERT-base"  # a pretrained start: its fine-tuning recipe (AdamW at 5e-5)
  sizes = dict(hf.TINY, num_hidden_layers=1) if tiny else hf.BERT_BASE  # tiny: compiles quicker
  cfg = config_from_hf({"model_type": "bert", **sizes},
                       dtype="bfloat16", attention_impl=attention)
  num_steps = 1000  # the schedule's length: warm-up over its first 60 steps
  tx, schedule = optim.make_optimizer(optim.resolve(config, num_steps), cfg.d_model, num_steps)
  batch_size, seq_len = config.train.batch_size, config.train.seq_len
  pairs = made_up_pairs(batch_size, seq_len, cfg.vocab_size, tiny)
  lengths = packed_pairs.text_lengths(pairs, cfg.pad_id)
  real = int(sum(x.sum() for x in lengths.values()))
  loss = RankingLoss(float(config.task.scale), bool(config.task.symmetric))
  model = sentence_model(cfg, config.task.pooling, check_traced_ids=False)
  texts = len(lengths) * batch_size
  # one start for both, made as the program makes it on its mesh: by one jitted function
  start = jax.jit(lambda: init_state(ContrastiveTask(model, loss, batch_size), tx, 0, seq_len))()
  runners, first, shapes = {}, {}, {}
  for name, chunks in (("plain", None),
                       (f"GradCache, {config.task.mini_batch} texts a chunk",
                        texts // config.task.mini_batch)):
    packer = packed_pairs.PairPacker(lengths, seq_len, cfg.pad_id, batch_size, 1,
                                     multiple=chunks or 1)
    batch = jax.device_put(packer(np.arange(batch_size), pairs, 0))
    task = ContrastiveTask(model, loss, eval_pairs=batch_size, chunks=chunks)
    step = jax.jit(make_train_step(task, tx, schedule), donate_argnums=0)
    state = [jax.tree.map(jnp.copy, start)]  # each step donates its own

    def run(step=step, state=state, batch=batch):
      state[0], metrics = step(state[0], batch)
      return float(metrics["loss"])  # waits for the step

    first[name] = run()  # compiles
    runners[name] = run
    shapes[name] = batch["tokens"].shape
  seconds = interleaved(runners, reps=reps or (3 if tiny else 10), warmup=2)
  # after the timing: torch (which matmul_peak imports) is not in the process while it runs
  peak = matmul_peak("bfloat16", sizes=(64,) if tiny else (8192,), reps=3)
  measured = max(r["flops_per_s"] for r in peak if r["impl"] == "jax")
  device = jax.devices()[0].device_kind
  nominal = device_peak(device)
  rows = []
  for name, s in seconds.items():
    computed = shapes[name][0] * shapes[name][1]
    flops = flops_per_token(cfg, seq_len, train=True, predicted=0.0) * computed
    row = {"step": name, "pairs": batch_size, "packed rows x seq": "x".join(map(str, shapes[name])),
           "real / computed ids": f"{real / computed:.0%}", "ms": round(s * 1e3, 2),
           "pairs/s": round(batch_size / s, 1), "real tokens/s": round(real / s),
           "MFU (measured matmul)": f"{flops / s / measured:.1%}"}
    if nominal:
      row["MFU (datasheet peak)"] = f"{flops / s / nominal:.1%}"
    row["first-step loss"] = round(first[name], 4)
    rows.append(row)
  notes = [f"{device}; n_layers {cfg.n_layers}, d_model {cfg.d_model}, n_heads {cfg.n_heads}, d_ff "
           f"{cfg.d_ff}, bfloat16 compute, float32 parameters, attention {attention}, dropout "
           f"{cfg.dropout}; the program's step (train.run.step.make_train_step over "
           f"train.tasks.contrastive's task: mean pooling, in-batch negatives, scale "
           f"{config.task.scale}; AdamW at 5e-5) on one packed batch (train.tasks.packed_pairs) "
           f"of {batch_size} made-up pairs at seq_len {seq_len}, {real} real ids, jitted once, "
           f"state donated; median of {reps or (3 if tiny else 10)} after 2",
           "MFU counts the ids the step computes (packed rows x seq_len, padding too): 6 "
           "N_matmul + 12 L d seq flops an id; GradCache encodes each text twice forward, so "
           "its hardware does 4/3 of that; bfloat16 matmul measured "
           + ", ".join(f"{r['impl']} {r['flops_per_s'] / 1e12:.1f} TFLOP/s" for r in peak)
           + (f"; datasheet dense bf16 peak {nominal / 1e12:.0f} TFLOP/s" if nominal else "")]
  return {"rows": rows, "notes": notes}


# ---------------------------------------------------------------------------------------------
# Rerankers, SPLADE and ColBERT

RETRIEVAL_TEXTS = 2048  # the pydoc paragraphs (1,139) repeated; tiny runs take 96 of them


def retrieval_folders(directory: str, texts: list[str], sizes: dict) -> dict:
  """{type: a folder of it} in `directory`, without sentence-transformers: a random
  transformers BERT of `sizes` (seed 0) with a WordPiece tokenizer trained on `texts`, as a
  reranker (a *ForSequenceClassification of one label), a SPLADE model (its *ForMaskedLM and
  save_splade's files) and a ColBERT model (its bare model, a 128-wide projection drawn here
  and save_multi_vector's files)."""
  import torch
  import transformers

  from benchmarks.embeddings import SEQ_LEN
  from benchmarks.hf_walkthrough import wordpiece
  from flax_encoder.embeddings import Dense, Normalize
  from flax_encoder.families import config_from_hf
  from flax_encoder.multi_vector import MultiVectorModel, save_multi_vector
  from flax_encoder.sparse import save_splade
  config = transformers.BertConfig(**sizes)
  tok, special = wordpiece(texts, 8000)
  length = min(SEQ_LEN, sizes["max_position_embeddings"])
  folders = {}
  for kind, model_class in (("rerank", transformers.BertForSequenceClassification),
                            ("sparse", transformers.BertForMaskedLM),
                            ("multi_vector", transformers.BertModel)):
    torch.manual_seed(0)
    folder = folders[kind] = os.path.join(directory, kind)
    model_class(transformers.BertConfig(**sizes, num_labels=1)).save_pretrained(folder)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **special,
                                         model_max_length=length).save_pretrained(folder)
  save_splade(folders["sparse"], max_seq_length=length)
  steps = (Dense(config.hidden_size, 128, bias=False, activation="Identity"), Normalize())
  kernel = np.random.default_rng(0).normal(0, config.hidden_size ** -0.5,
                                           (config.hidden_size, 128)).astype(np.float32)
  save_multi_vector(folders["multi_vector"],
                    MultiVectorModel(config_from_hf(config.to_dict()), steps),
                    {"dense_0": {"kernel": kernel}}, max_seq_length=length)
  return folders


def retrieval(tiny: bool, attention: str, reps: int | None = None) -> dict:
  """Texts/s (pairs/s for the reranker) of Reranker, SparseEncoder and MultiVectorEncoder
  (bfloat16, packed) at BERT-base size, and of sentence-transformers' CrossEncoder,
  SparseEncoder and MultiVectorEncoder (float16 on a GPU, batch 32) where it is installed."""
  os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: nothing is fetched
  os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
  import transformers

  from benchmarks.bench import interleaved
  from benchmarks.finetune_packed import paragraphs
  from flax_encoder.cross_encoder import Reranker
  from flax_encoder.multi_vector import MultiVectorEncoder
  from flax_encoder.sparse import SparseEncoder
  transformers.utils.logging.disable_progress_bar()
  transformers.utils.logging.set_verbosity_error()
  device, why = sentence_transformers_device()
  corpus = paragraphs()[0]
  texts = _texts(True) if tiny else [corpus[i % len(corpus)] for i in range(RETRIEVAL_TEXTS)]
  pairs = list(zip(texts[1:] + texts[:1], texts))  # (a paragraph as the query, another)
  sizes = EMBED_MODELS["base"][2 if tiny else 1]
  rows, notes = [], [why] if why else []
  settings = dict(dtype="bfloat16", attention_impl=attention)
  with tempfile.TemporaryDirectory() as directory:
    folders = retrieval_folders(directory, corpus, sizes)
    ours = {"rerank": Reranker.load(folders["rerank"], **settings),
            "sparse": SparseEncoder.load(folders["sparse"], **settings),
            "multi_vector": MultiVectorEncoder.load(folders["multi_vector"], **settings)}
    runners = {"rerank": lambda: ours["rerank"].predict(pairs),
               "sparse": lambda: ours["sparse"].encode_document(texts),
               "multi_vector": lambda: ours["multi_vector"].encode_document(texts)}
    if device:
      import sentence_transformers as st
      import torch
      kwargs = dict(device=device, model_kwargs={
          "dtype": torch.float16 if device == "cuda" else torch.float32})
      if device == "cpu":  # tiny runs: OpenMP's teams stall beside XLA's threads on a small CPU
        torch.set_num_threads(1)
      theirs = {"rerank": st.CrossEncoder(folders["rerank"], **kwargs),
                "sparse": st.SparseEncoder(folders["sparse"], **kwargs),
                "multi_vector": st.MultiVectorEncoder(folders["multi_vector"], **kwargs)}
      runners.update({
          "rerank, sentence-transformers": lambda: theirs["rerank"].predict(
              pairs, batch_size=32, show_progress_bar=False),
          "sparse, sentence-transformers": lambda: theirs["sparse"].encode_document(
              texts, batch_size=32, show_progress_bar=False),
          "multi_vector, sentence-transformers": lambda: theirs["multi_vector"].encode_document(
              texts, batch_size=32, show_progress_bar=False)})
    seconds = interleaved(runners, reps=reps or (2 if tiny else 3), warmup=1)
  for name, s in seconds.items():
    kind = name.split(",")[0]
    row = {"model": kind, "impl": "sentence-transformers" if "," in name else "ours",
           "texts": len(texts), "texts/s": round(len(texts) / s, 1)}
    if "," in name:
      row["ours vs sentence-transformers"] = f"{s / seconds[kind]:.2f}x"
    rows.append(row)
  notes.append(f"random BERT of {sizes['num_hidden_layers']} layers, {sizes['hidden_size']} "
               f"wide; ours bfloat16, attention {attention}, packed; the reranker scores "
               f"(paragraph, next paragraph) pairs, the others encode the paragraphs as "
               f"documents; each called once untimed, then interleaved, medians")
  return {"rows": rows, "notes": notes}
