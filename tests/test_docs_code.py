"""Every Python block of README.md and docs/ runs as written: a page's blocks in the order it
gives them, in one namespace (a block may use what an earlier one made), in a folder that holds
what they name (bert-dir, all-MiniLM-L6-v2, encoder.msgpack …: tiny models, saved as the real
ones are). What the prose hands a block (`texts`, `documents`, `tokens`) is given to it."""

import os
import re
import textwrap

import numpy as np
import pytest

from tests.runs import ROOT

pytest.importorskip("torch", reason="the blocks' folders are saved by transformers and "
                    "sentence-transformers")
pytest.importorskip("sentence_transformers")

PAGES = ["README.md", *(os.path.join("docs", name)
                        for name in sorted(os.listdir(os.path.join(ROOT, "docs")))
                        if name.endswith(".md"))]
BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)


def blocks(page: str) -> list[tuple[int, str]]:
  """(line, code) of each Python block of `page`, in order."""
  with open(os.path.join(ROOT, page), encoding="utf-8") as f:
    text = f.read()
  return [(text.count("\n", 0, m.start()) + 1, textwrap.dedent(m.group(2)))
          for m in BLOCK.finditer(text)]


def test_the_pages_have_python_blocks():
  assert sum(len(blocks(page)) for page in PAGES) >= 18


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  """A folder holding every file and directory the blocks name, each as the real one is."""
  import flax.linen as nn
  import jax
  import torch
  from sentence_transformers import MultiVectorEncoder, SentenceTransformer
  from sentence_transformers.base.modules import Normalize, Transformer
  from sentence_transformers.sentence_transformer.modules import Pooling

  from flax_encoder import Encoder, EncoderConfig
  from flax_encoder.classifier import SequenceClassifier
  from flax_encoder.pytorch import reference, save_torch_checkpoint
  from flax_encoder.text_classifier import TextClassifier
  from flax_encoder.tokenizer import Tokenizer
  from flax_encoder.weights import save_weights
  from tests import hf_models
  from train.outputs import embed

  root = tmp_path_factory.mktemp("docs")
  hf_models.write(root / "bert-dir", "bert")  # BERT's pretraining heads, as published
  hf_models.write(root / "ms-marco-MiniLM-L6-v2", "bert", head="sequence_classification",
                  num_labels=1)
  hf_models.write(root / "splade-folder", "bert", head="masked_lm")
  base = hf_models.write(root / "base", "bert", head="base")
  MultiVectorEncoder(base, device="cpu").save(str(root / "colbert-folder"))
  torch.manual_seed(0)
  SentenceTransformer(modules=[Transformer(base, max_seq_length=32), Pooling(32, "mean"),
                               Normalize()], prompts={"query": "query: "},
                      device="cpu").save(str(root / "all-MiniLM-L6-v2"))
  (root / "texts.txt").write_text("".join(f"{t}\n" for t in TEXTS))
  embed.embed(str(root / "all-MiniLM-L6-v2"), str(root / "texts.txt"), f"{root}/embeddings/")

  config = EncoderConfig(vocab_size=64, d_model=16, n_heads=8, d_ff=32, n_layers=1, max_len=32)
  params = Encoder(config).init(jax.random.key(0), np.ones((1, 4), np.int32))["params"]
  save_weights(root / "encoder.msgpack", config, {"params": jax.device_get(nn.unbox(params))})
  bytes_ = Tokenizer("bytes", None, offset=4)
  classifier = EncoderConfig(vocab_size=bytes_.vocab_size, d_model=16, n_heads=2, d_ff=32,
                             n_layers=1, max_len=32)
  params = SequenceClassifier(classifier, 2).init(jax.random.key(0), np.ones((1, 8), np.int32))
  TextClassifier(classifier, jax.device_get(nn.unbox(params["params"])), ["bug", "game"],
                 bytes_, seq_len=32, separator_id=2).save(root / "classifier.msgpack")

  class Model(torch.nn.Module):  # an encoder inside a model of one's own, as trained
    def __init__(self):
      super().__init__()
      self.encoder = reference.Encoder(config)
      self.head = torch.nn.Linear(config.d_model, 2)

  save_torch_checkpoint({"model": Model().state_dict(), "epoch": 3}, str(root / "checkpoint.pt"))
  return root


TEXTS = ["apt-get fails to resolve the mirror", "a game of tetris", "the quick brown fox"]
GIVEN = """
import jax.numpy as _jnp
texts = {texts!r}
documents = texts
tokens = _jnp.array([[5, 17, 42, 9, 0, 0]])
tokens_padded_to_128 = _jnp.pad(tokens, ((0, 0), (0, 122)))

def my_step(variables, tokens):
  return model.apply(variables, tokens)
""".format(texts=TEXTS)


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)])
def test_every_python_block_of_the_page_runs(page, folder, monkeypatch):
  monkeypatch.chdir(folder)
  namespace = {"__name__": "__docs__"}
  exec(GIVEN, namespace)  # noqa: S102 - the prose's own names
  for line, code in blocks(page):
    try:
      exec(compile(code, f"{page}:{line}", "exec"), namespace)  # noqa: S102
    except Exception as e:  # noqa: BLE001
      raise AssertionError(f"{page}:{line}: the block raised {type(e).__name__}: {e}") from e
