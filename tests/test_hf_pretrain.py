"""Further masked-LM pretraining of a Hugging Face checkpoint (config.init.hf): a corpus
prepared with its own ids and template, the loss at step 0 equal to transformers' *ForMaskedLM
on the same masked batch, and the run back out as a directory transformers loads."""

import json
import os
import shutil

import flax.linen as nn
import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from configs import default  # noqa: E402
from flax_encoder.masked_lm import MaskedLM  # noqa: E402
from tests import hf_models, runs  # noqa: E402
from train.data import prepare
from train.errors import RunError  # noqa: E402
from train.task import Resume  # noqa: E402
from train.tasks import masked_lm  # noqa: E402

DOCUMENTS = [" ".join(hf_models.TEXTS[i % 4].split()[::1 + i % 3]) for i in range(60)]


@pytest.fixture(scope="module", params=["bert", "roberta", "modernbert",
                                        *(pytest.param(f, marks=pytest.mark.slow)
                                          for f in ("nomic_bert", "gte",
                                                    "jina_embeddings_v3", "deberta-v2",
                                                    "eurobert"))])
def checkpoint(request, tmp_path_factory):
  """(family, its directory, a corpus prepared with its tokenizer and ids)."""
  base = tmp_path_factory.mktemp(request.param)
  directory = hf_models.write(base / "model", request.param)
  corpus = base / "corpus.jsonl"
  corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCUMENTS))
  prepared = str(base / "prepared")
  prepare.prepare([str(corpus)], prepared, directory, seq_len=32, eval_fraction=0.25,
                  workers=1, progress=False)
  return request.param, directory, prepared


def _config(directory, prepared, **train):
  config = default.get_config()
  config.init.hf, config.data.prepared = directory, prepared
  config.train.update({"seq_len": 32, "batch_size": 4, **train})
  config.optim.label_smoothing = 0.0  # transformers' loss has none
  return config


def test_the_corpus_holds_the_checkpoint_s_own_ids_each_document_framed_as_its_tokenizer_does(
    checkpoint):
  _, directory, prepared = checkpoint
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  want = np.concatenate([tokenizer(d)["input_ids"] for d in DOCUMENTS])
  meta = json.load(open(os.path.join(prepared, "dataset.json")))
  assert meta["first_token_id"] == 0 and meta["special_ids"]["mask"] == tokenizer.mask_token_id
  assert meta["special_ids"]["pad"] == tokenizer.pad_token_id
  dtype = np.dtype(meta["dtype"])
  windows = {s: np.fromfile(os.path.join(prepared, f"{s}.bin"), dtype).reshape(-1, 32)
             for s in ("train", "eval")}
  # Window j is held out when j % 4 == 3: put them back in order.
  rows = [None] * (len(windows["train"]) + len(windows["eval"]))
  held = [j for j in range(len(rows)) if j % 4 == 3]
  for j, row in zip(held, windows["eval"]):
    rows[j] = row
  for j, row in zip([j for j in range(len(rows)) if j % 4 != 3], windows["train"]):
    rows[j] = row
  flat = np.concatenate(rows)
  np.testing.assert_array_equal(flat[:len(want)], want)
  assert set(flat[len(want):]) == {tokenizer.pad_token_id}


def test_the_loss_at_step_0_is_what_transformers_computes_on_the_same_masked_batch(
    checkpoint, tmp_path):
  family, directory, prepared = checkpoint
  config = _config(directory, prepared)
  # A window as one sequence, as transformers' run_mlm.py groups texts (by default this
  # program encodes each document of a window alone).
  config.task.cross_document_attention = True
  setup = masked_lm.setup(config, str(tmp_path), Resume())
  task = setup.task
  assert task.ids.mask == transformers.AutoTokenizer.from_pretrained(directory).mask_token_id
  rows = np.asarray(setup.train[:4])
  batch = jax.jit(task.batch)(rows, jax.random.PRNGKey(3))
  ours = float(task.loss_sum(setup.start_params, batch, jax.random.PRNGKey(0)) /
               task.loss_count(batch))
  # The same masked inputs and targets, as transformers' collator would label them.
  inputs = np.asarray(batch["inputs"])
  labels = np.full(inputs.shape, -100)
  for i, (at, target, weight) in enumerate(zip(*(np.asarray(batch[k]) for k in (
      "predict_at", "targets", "weights")))):
    labels[i, at[weight > 0]] = target[weight > 0]
  assert (labels != -100).sum() == int(np.asarray(batch["weights"]).sum()) > 0
  model = transformers.AutoModelForMaskedLM.from_pretrained(
      directory, attn_implementation="eager").eval()
  pad = model.config.pad_token_id
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(inputs), labels=torch.tensor(labels),
                   attention_mask=torch.tensor(inputs != pad).long()).loss.item()
  assert ours == pytest.approx(theirs, rel=1e-5)
  # The special ids are never chosen: [CLS], [SEP], padding (and <s>, </s>).
  chosen = np.take_along_axis(rows, np.asarray(batch["predict_at"]), 1)[
      np.asarray(batch["weights"]) > 0]
  assert not np.isin(chosen, [pad, model.config.pad_token_id, *task.ids.others,
                              task.ids.separator]).any()


@pytest.mark.parametrize("checkpoint", ["bert", "roberta",
                                        *(pytest.param(f, marks=pytest.mark.slow)
                                          for f in ("nomic_bert", "gte",
                                                    "jina_embeddings_v3", "deberta-v2",
                                                    "eurobert"))],
                         indirect=True)
def test_a_further_pretraining_run_exports_what_transformers_loads_as_itself(checkpoint,
                                                                             tmp_path):
  family, directory, prepared = checkpoint
  workdir = str(tmp_path / "run")
  runs.train(workdir, f"--config.init.hf={directory}", f"--config.data.prepared={prepared}",
             "--config.train.num_steps=6", "--config.train.batch_size=4",
             "--config.train.seq_len=32", "--config.train.eval_every=6",
             "--config.train.checkpoint_every=6", "--config.optim.warmup_steps=2",
             config=os.path.join(runs.ROOT, "configs", "default.py"))
  from train.outputs.export import main as export
  out = str(tmp_path / "exported")
  assert export(["--workdir", workdir, "--layout", "hf", "--out", out]) == 0
  again = transformers.AutoModelForMaskedLM.from_pretrained(
      out, attn_implementation="eager").eval()
  assert transformers.AutoTokenizer.from_pretrained(out).mask_token_id == (
      transformers.AutoTokenizer.from_pretrained(directory).mask_token_id)
  cfg, variables, _ = masked_lm.trained_with_head(workdir)
  ids = np.asarray([[0, 10, 11, 12, 2]] if family in ("roberta", "jina_embeddings_v3")
                   else [[2, 10, 11, 12, 3]])
  from flax_encoder import families
  model = MaskedLM(cfg, checkpoint_head=True,
                             decoder_head=families.get(family).untied_decoder)
  ours = model.apply({"params": {"encoder": variables["params"],
                                 "masked_lm": variables["heads"]["masked_lm"]}}, ids)
  with torch.no_grad():
    theirs = again(input_ids=torch.tensor(ids)).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-5)
  before = transformers.AutoModelForMaskedLM.from_pretrained(directory).state_dict()
  after = again.state_dict()
  assert any(not torch.equal(before[k], after[k]) for k in before if k in after)
  _the_export_reads_what_the_run_took(directory, workdir, out, tmp_path)


def _the_export_reads_what_the_run_took(directory, workdir, out, tmp_path):
  """The start directory's files changed after training change nothing the export writes:
  it reads the copy the run took into WORKDIR/start when it started."""
  from train.outputs.export import main as export
  changed = os.path.join(directory, "tokenizer_config.json")
  with open(changed, "rb") as f:
    kept = f.read()
  try:
    with open(changed, "w") as f:
      f.write("[1, 2]")
    again = str(tmp_path / "again")
    assert export(["--workdir", workdir, "--layout", "hf", "--out", again]) == 0
  finally:
    with open(changed, "wb") as f:
      f.write(kept)
  for name in sorted(os.listdir(out)):
    with open(os.path.join(out, name), "rb") as a, open(os.path.join(again, name), "rb") as b:
      assert a.read() == b.read(), name


def test_a_corpus_of_other_ids_is_refused_in_one_line(checkpoint, tmp_path):
  _, directory, _ = checkpoint
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(DOCUMENTS))
  other = str(tmp_path / "bytes")
  prepare.prepare([str(corpus)], other, "bytes", seq_len=32, eval_fraction=0.25, workers=1,
                  progress=False)
  with pytest.raises(RunError, match="holds other ids than the checkpoint's; prepare the "
                                     "corpus with its tokenizer"):
    masked_lm.setup(_config(directory, other), str(tmp_path / "run"), Resume())


def test_a_checkpoint_without_a_masked_lm_head_needs_fresh_head_then_trains_a_new_tied_one(
    checkpoint, tmp_path, capsys):
  family, directory, prepared = checkpoint
  bare = hf_models.write(tmp_path / "bare", family, head="base")
  shutil.copyfile(os.path.join(directory, "tokenizer.json"), os.path.join(bare, "tokenizer.json"))
  with pytest.raises(RunError) as error:
    masked_lm.setup(_config(bare, prepared), str(tmp_path / "refused"), Resume())
  assert "set config.init.fresh_head=True" in str(error.value) and "\n" not in str(error.value)
  config = _config(bare, prepared)
  config.init.fresh_head = True
  setup = masked_lm.setup(config, str(tmp_path / "run"), Resume())
  assert set(setup.start_params) == {"encoder"}  # the head is the task's own, drawn afresh
  assert "has no masked-LM head: a new one starts" in capsys.readouterr().err
  head = setup.task.init(jax.random.PRNGKey(0), 32)["masked_lm"]
  if family == "eurobert":  # its untied decoder: a [d, vocab] matrix of its own, no bias
    assert jax.tree.map(np.shape, nn.unbox(head)) == {
        "decoder": {"kernel": (setup.encoder.d_model, setup.encoder.vocab_size)}}
    return
  # BERT's head: its decoder is the word embeddings, so it holds no [d, vocab] matrix of its own
  assert setup.task.model.checkpoint_head and all(
      np.shape(leaf) in {(setup.encoder.d_model,), (setup.encoder.d_model,) * 2,
                         (setup.encoder.vocab_size,)} for leaf in jax.tree.leaves(head))
