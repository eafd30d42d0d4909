"""Packed fine-tuning (config.task.packed): several short examples a row, each encoded and pooled
as if alone. An example's packed logits are its logits alone, the evaluation of packed rows is
the unpacked one's, and a packed run trains, resumes, predicts and exports."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from configs import classify as classify_config  # noqa: E402
from configs import regress as regress_config  # noqa: E402
from flax_encoder.classifier import POOLINGS, SequenceClassifier, pair_token_types  # noqa: E402
from flax_encoder.families.config_json import config_from_hf  # noqa: E402
from tests import hf_models, runs  # noqa: E402
from train.data import examples, pipeline  # noqa: E402
from train.errors import RunError  # noqa: E402
from train.task import Resume  # noqa: E402
from train.tasks import classify, finetune  # noqa: E402

CLS, SEP, PAD = 2, 3, 0


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
  """(train.jsonl, eval.jsonl) of short text pairs: the label says what the pair's text is made
  of."""
  return hf_models.labelled_pairs(tmp_path_factory.mktemp("pairs"), 64, 21, (1, 4))


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
  return hf_models.write(tmp_path_factory.mktemp("bert"), "bert")


# ---------------------------------------------------------------------------------------------
# The model: packed logits are each example's alone.


_SIZES = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=24, max_position_embeddings=64)
ENCODERS = {  # token types; RoBERTa's positions after the padding id; rotary, local windows
    "bert": lambda: config_from_hf(transformers.BertConfig(**_SIZES).to_dict(),
                                   attention_impl="reference"),
    "roberta": lambda: config_from_hf(
        transformers.RobertaConfig(pad_token_id=1, **_SIZES).to_dict(), attention_impl="xla"),
    "modernbert": lambda: config_from_hf(transformers.ModernBertConfig(
        vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=3,
        num_attention_heads=2, max_position_embeddings=64, local_attention=4,
        global_attn_every_n_layers=3, pad_token_id=0, bos_token_id=CLS, eos_token_id=SEP,
        cls_token_id=CLS, sep_token_id=SEP).to_dict(), attention_impl="xla"),
}


def _pair(rng, a: int, b: int) -> np.ndarray:
  """[CLS] a [SEP] b [SEP] of random ids (from 5 on: none of them special)."""
  return np.concatenate([[CLS], rng.integers(5, 50, a), [SEP], rng.integers(5, 50, b), [SEP]])


def _packed_row(laid: list, seq: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
  packed = examples.pack(laid, np.arange(len(laid)), seq, 6, pad, np.int32)
  assert len(packed["tokens"]) == 1
  return packed["tokens"], packed["segments"]


@pytest.mark.parametrize("family, poolings", [
    ("bert", POOLINGS),  # every pooling, on pairs with their token types
    ("roberta", ("pooler", "mean")), ("modernbert", ("first_head", "mean_head"))])
def test_packed_logits_are_each_example_alone(family, poolings):
  cfg = ENCODERS[family]()
  rng = np.random.default_rng(0)
  laid = [_pair(rng, 3, 4), _pair(rng, 5, 2), np.asarray([CLS, 9, SEP]), _pair(rng, 4, 3)]
  tokens, segments = _packed_row(laid, 40, cfg.pad_id)
  real = sum(([k + 1] * len(e) for k, e in enumerate(laid)), [])
  assert segments[0].tolist() == real + [0] * (40 - len(real))
  alone = np.full((len(laid), 16), cfg.pad_id)  # each example alone in its padded row
  for k, ids in enumerate(laid):
    alone[k, :len(ids)] = ids
  with jax.default_matmul_precision("highest"):
    for pooling in poolings:
      model = SequenceClassifier(cfg, 3, pooling, type_separator=SEP, max_segments=6)
      params = model.init(jax.random.key(1), jnp.asarray(tokens))
      packed = np.asarray(model.apply(params, tokens, segments))
      assert packed.shape == (1, 6, 3)
      np.testing.assert_allclose(packed[0, :4], model.apply(params, alone), atol=1e-5,
                                 err_msg=f"{family}, {pooling}")
      np.testing.assert_array_equal(packed[0, 4], packed[0, 5])  # no example: the same logits


def test_a_pairs_token_types_restart_at_each_segment():
  rng = np.random.default_rng(0)
  laid = [_pair(rng, 2, 1), _pair(rng, 1, 2)]
  tokens, segments = _packed_row(laid, 16, PAD)
  types = np.asarray(pair_token_types(jnp.asarray(tokens), SEP, jnp.asarray(segments)))
  # [CLS] x x [SEP] | y [SEP] ; [CLS] x [SEP] | y y [SEP] ; padding
  assert types[0, :14].tolist() == [0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0]
  whole = np.asarray(pair_token_types(jnp.asarray(tokens), SEP))  # unpacked: one sequence
  assert whole[0, 6:9].tolist() == [1, 1, 1]


def test_first_fit_fills_earlier_rows_in_order_and_labels_every_example():
  laid = [np.full(n, 7) for n in (6, 5, 3, 2, 1, 1, 1)]
  packed = examples.pack(laid, np.arange(10, 17), 8, 3, PAD, np.uint16)
  # 6 | 5 3 (the 3 does not fit after the 6, so the first row with room) | the 2 goes back to
  # the first row; the 1s: the second row is full, the first has 3 examples: a new row.
  assert packed["segments"].tolist() == [[1] * 6 + [2] * 2, [1] * 5 + [2] * 3,
                                         [1, 2, 3] + [0] * 5]
  assert packed["labels"].tolist() == [[10, 13, -1], [11, 12, -1], [14, 15, 16]]
  assert packed["tokens"][2].tolist() == [7, 7, 7] + [PAD] * 5
  assert packed["segments"].dtype == np.uint8 and packed["tokens"].dtype == np.uint16


# ---------------------------------------------------------------------------------------------
# The task: the same evaluation, packed or not.


def _config(pairs, bert_dir, packed: bool):
  config = classify_config.get_config()
  config.data.train, config.data.eval = pairs
  config.init.hf = bert_dir
  config.task.packed = packed
  config.train.update(seq_len=32, batch_size=4)
  config.model.update(dropout=0.0, attention_dropout=0.0)  # training losses without draws
  config.optim.label_smoothing = 0.1
  return config


def _evaluate(setup, params, batch_size: int) -> dict:
  """The eval metrics of `params`, and the training loss per example over the training rows."""
  step = jax.jit(setup.task.eval_sums)
  sums = [step(params, b) for b in pipeline.eval_batches(setup.eval, batch_size,
                                                          setup.eval_fill)]
  metrics = setup.task.eval_metrics(jax.tree.map(lambda *x: sum(x), *sums))
  batch = jax.tree.map(np.asarray, setup.train)
  loss = setup.task.loss_sum(params, batch, jax.random.key(0)) / setup.task.loss_count(batch)
  return {**metrics, "train_loss": float(loss)}


def test_packed_and_unpacked_evaluations_of_the_same_parameters_agree(pairs, bert_dir, tmp_path):
  unpacked = classify.setup(_config(pairs, bert_dir, False), str(tmp_path / "a"), Resume())
  packed = classify.setup(_config(pairs, bert_dir, True), str(tmp_path / "b"), Resume())
  meta = examples.load_examples(str(tmp_path / "b" / "data"))["meta"]
  assert meta["packed"] == {"max_segments": 4} and meta["examples"] == {"train": 64, "eval": 21}
  assert meta["rows"]["eval"] < 21 and packed.eval["labels"].shape == (meta["rows"]["eval"], 4)
  assert sorted(np.asarray(packed.eval["labels"]).ravel())[-21:] == sorted(
      np.asarray(unpacked.eval["labels"]))  # every example once, the rest -1
  params = unpacked.task.init(jax.random.key(0), 32)
  params = jax.tree.map(lambda x: x + 0.02 * jax.random.normal(jax.random.key(1), x.shape),
                        jax.tree.map(jnp.asarray, {**params, **unpacked.start_params}))
  with jax.default_matmul_precision("highest"):
    want, got = _evaluate(unpacked, params, 4), _evaluate(packed, params, 3)
  assert want.keys() == got.keys()
  for name in want:
    assert got[name] == pytest.approx(want[name], abs=1e-5), name
  assert 0 < want["accuracy"] < 1 and want["macro_f1"] > 0
  # tokens/s counts a packed batch's real ids: those its examples have unpacked.
  real = np.count_nonzero(np.asarray(unpacked.eval["tokens"]) != unpacked.encoder.pad_id)
  assert packed.task.token_count({"tokens": packed.eval["tokens"],
                                  "segment_ids": jnp.asarray(packed.eval["segment_ids"])}) == real
  assert unpacked.task.token_count(unpacked.eval) == 21 * 32


def test_packing_is_classify_only_and_its_change_prepares_again(pairs, bert_dir, tmp_path):
  config = regress_config.get_config()
  config.task.packed = True
  with pytest.raises(RunError) as e:
    finetune.check(config)
  assert str(e.value) == ("config.task.packed: True, expected False for the regress task: only "
                          "classify packs its examples")
  workdir = str(tmp_path / "run")
  classify.setup(_config(pairs, bert_dir, True), workdir, Resume())
  setup = classify.setup(_config(pairs, bert_dir, False), workdir, Resume())
  assert "packed" not in examples.load_examples(os.path.join(workdir, "data"))["meta"]
  assert setup.train["labels"].shape == (64,) and "segment_ids" not in setup.train


# ---------------------------------------------------------------------------------------------
# The program: a packed run trains, resumes, predicts and exports.


def test_a_packed_run_trains_resumes_predicts_and_exports(pairs, bert_dir, tmp_path):
  train, eval_ = pairs
  workdir = str(tmp_path / "run")
  args = [f"--config={os.path.join(runs.ROOT, 'configs', 'classify.py')}",
          f"--config.data.train={train}", f"--config.data.eval={eval_}",
          f"--config.init.hf={bert_dir}", "--config.task.packed=True",
          "--config.train.batch_size=4", "--config.train.seq_len=32",
          "--config.train.log_every=2", "--config.train.eval_every=4",
          "--config.train.checkpoint_every=4", "--config.optim.warmup_steps=2"]
  result = runs.train(workdir, *args, "--config.train.num_steps=4", config=None)
  assert "64 training and 21 held-out examples; packed" in result.stderr
  result = runs.train(workdir, *args, "--config.train.num_steps=8", config=None)
  assert "resumed from the checkpoint at step 4" in result.stderr
  records = runs.read_metrics(os.path.join(workdir, "metrics.jsonl"))
  assert sorted(runs.losses(workdir)) == [2, 4, 6, 8]
  final = [r for r in records if r["split"] == "eval"][-1]
  assert final["step"] == 8

  refused = runs.train(workdir, *args, "--config.task.packed=False",
                       "--config.train.num_steps=12", config=None, check=False)
  assert refused.returncode != 0
  error = refused.stderr.strip().splitlines()[-1]
  assert error.startswith("error: config.task.packed: False (the checkpoint has True): resuming "
                          "would change the run")

  from train.outputs.predict import predict
  out = tmp_path / "predictions.jsonl"
  assert predict(workdir, eval_, str(out)).count == 21
  predicted = [json.loads(line)["label"] for line in out.read_text().splitlines()]
  truth = [json.loads(line)["label"] for line in open(eval_)]
  assert np.mean([p == t for p, t in zip(predicted, truth)]) == pytest.approx(final["accuracy"])

  from train.outputs.export import main as export
  exported = str(tmp_path / "exported")
  assert export(["--workdir", workdir, "--layout", "hf", "--out", exported]) == 0
  model = transformers.AutoModelForSequenceClassification.from_pretrained(
      exported, attn_implementation="eager").eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
  rows = [json.loads(line) for line in open(eval_)]
  batch = tokenizer([r["text"] for r in rows], [r["text_pair"] for r in rows], padding=True,
                    return_token_type_ids=True, return_tensors="pt")
  with torch.no_grad():
    theirs = model(**batch).logits.numpy()
  # The packed rows' logits, as the run evaluated them, are transformers' of each example
  # alone: packing the tokenizer's ids again, labelled by their line, says which is which.
  from train.outputs.predict import read_run
  run = read_run(workdir)
  data = examples.load_examples(os.path.join(workdir, "data"))["eval"]
  laid = [np.asarray(ids) for ids in batch["input_ids"].numpy()]
  laid = [ids[:int(mask.sum())] for ids, mask in zip(laid, batch["attention_mask"].numpy())]
  again = examples.pack(laid, np.arange(len(laid)), 32, 4, run.model.config.pad_id,
                        data["tokens"].dtype)
  np.testing.assert_array_equal(again["tokens"], data["tokens"])
  np.testing.assert_array_equal(again["segments"], data["segment_ids"])
  model = SequenceClassifier(run.model.config, 3, run.model.pooling, run.model.type_separator, 4)
  with jax.default_matmul_precision("highest"):
    logits = np.asarray(model.apply({"params": run.params}, np.asarray(data["tokens"]),
                                    np.asarray(data["segment_ids"])))
  line = again["labels"]
  np.testing.assert_allclose(logits[line >= 0], theirs[line[line >= 0]], atol=1e-5)
