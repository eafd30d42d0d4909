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


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_the_parity_report_passes_on_the_published_minilm_as_saved(minilm, precision, capsys):
  pytest.importorskip("torch", reason="the parity report runs transformers")
  pytest.importorskip("transformers")
  from flax_encoder.pytorch import parity
  args = ["--hf", minilm, "--seq-len", "32", "--batch", "2"]
  assert parity.main(args + (["--float64"] if precision == "float64" else [])) == 0
  assert "PASS: every stage within" in capsys.readouterr().out


@pytest.mark.slow  # a run of the published model
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
  # Back to transformers: its defaults (the exported tokenizer's own truncation and padding)
  # give predict's probabilities.
  torch = pytest.importorskip("torch", reason="the exported model is run by transformers")
  transformers = pytest.importorskip("transformers")
  from train.outputs.export import main as export
  from train.outputs.predict import predict
  out, predictions = str(tmp_path / "exported"), tmp_path / "predictions.jsonl"
  assert predict(workdir, str(data), str(predictions)).count == len(rows)
  assert export(["--workdir", workdir, "--layout", "hf", "--out", out]) == 0
  model = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  with torch.no_grad():
    logits = model(**tokenizer(TEXTS, padding=True, truncation=True, return_tensors="pt")).logits
  theirs = torch.softmax(logits, -1).numpy()
  ours = [json.loads(line)["probabilities"] for line in predictions.read_text().splitlines()]
  labels = [model.config.id2label[i] for i in range(len(model.config.id2label))]
  np.testing.assert_allclose([[p[c] for c in labels] for p in ours[:len(TEXTS)]], theirs,
                             atol=1e-5)
