"""A real published checkpoint, as its authors saved it: all-MiniLM-L6-v2 (sentence-transformers'
folder, a transformers 4.8 BertModel with its position_ids buffer and a tokenizer.json padded
to 128), fetched once into a cache (tests/published.py). It loads as it is, computes what
transformers computes, and a fine-tuning starts from it; offline, these tests skip."""

import json
import os

import jax
import numpy as np
import pytest

from flax_encoder import Encoder, families
from flax_encoder.tokenizer import Tokenizer, encode_examples
from tests import published, runs

TEXTS = ["A man is eating food.", "The new movie is awesome!", "Héllo, wörld: naïve café.",
         "Two dogs play in the snow near a small wooden house."]


@pytest.fixture(scope="module")
def minilm():
  return published.all_minilm_l6_v2()


def _ids(directory) -> np.ndarray:
  """TEXTS as the checkpoint's tokenizer lays them out, padded with its [PAD] (0) to 32."""
  tokenizer = Tokenizer.from_file("huggingface", os.path.join(directory, "tokenizer.json"))
  rows = encode_examples(tokenizer, TEXTS, None, 32, 0, tokenizer.template())
  assert max(map(len, rows)) < 32  # not padded (to 128) nor cut by the file's own settings
  return np.stack([np.pad(r, (0, 32 - len(r))) for r in rows])


def test_the_published_minilm_loads_as_saved_and_computes_what_transformers_does(minilm):
  torch = pytest.importorskip("torch", reason="transformers' side of the comparison")
  transformers = pytest.importorskip("transformers")
  model = families.read_hf(minilm)
  assert model.family == "bert" and model.config.n_layers == 6 and model.config.d_model == 384
  ids = _ids(minilm)
  with jax.default_matmul_precision("highest"):
    ours = np.asarray(Encoder(model.config).apply(model.variables, ids))
  reference = transformers.BertModel.from_pretrained(minilm).eval()
  mask = ids != 0
  with torch.no_grad():
    theirs = reference(input_ids=torch.from_numpy(ids).long(),
                       attention_mask=torch.from_numpy(mask).long()).last_hidden_state.numpy()
  assert np.abs(ours - theirs)[mask].max() < 1e-5


def test_fine_tuning_starts_from_the_published_minilm(minilm, tmp_path):
  rows = [{"text": text, "label": "long" if len(text) > 25 else "short"} for text in TEXTS * 4]
  data = tmp_path / "texts.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in rows))
  workdir = str(tmp_path / "run")
  result = runs.train(workdir, f"--config={os.path.join(runs.ROOT, 'configs', 'classify.py')}",
                      f"--config.data.train={data}", f"--config.data.eval={data}",
                      f"--config.init.hf={minilm}", "--config.train.num_steps=2",
                      "--config.train.batch_size=4", "--config.train.seq_len=32",
                      "--config.train.eval_every=2", "--config.train.checkpoint_every=2",
                      config=None)
  assert f"fine-tuning from {minilm}: 2 classes, 16 training" in result.stderr
  records = runs.read_metrics(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in records if r["split"] == "eval"][-1] == 2
