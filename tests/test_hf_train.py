"""python -m train from a Hugging Face directory (config.init.hf): the checkpoint's encoder,
tokenizer, ids, special tokens and pooler; predict; and the one-line refusals."""

import json
import os

import chex
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from configs import classify as classify_config  # noqa: E402
from flax_encoder import families  # noqa: E402
from tests import hf_models, runs  # noqa: E402
from train.data import examples  # noqa: E402
from train.errors import RunError  # noqa: E402
from train.task import Resume  # noqa: E402
from train.tasks import classify  # noqa: E402


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
  """(train.jsonl, eval.jsonl) of text pairs: the label says what the pair's text is made of."""
  return hf_models.labelled_pairs(tmp_path_factory.mktemp("pairs"), 96, 24, (2, 6))


@pytest.fixture(scope="module", params=["bert", "roberta", "distilbert", "modernbert"])
def hf_dir(request, tmp_path_factory):
  return request.param, hf_models.write(tmp_path_factory.mktemp(request.param), request.param)


def _config(pairs, hf_dir, **train):
  config = classify_config.get_config()
  config.data.train, config.data.eval = pairs
  config.init.hf = hf_dir
  config.train.update({"seq_len": 32, "batch_size": 8, **train})
  return config


def test_fine_tuning_starts_from_the_checkpoint_with_its_tokenizer_ids_and_pooler(
    pairs, hf_dir, tmp_path):
  from flax_encoder.families import load_hf
  family, directory = hf_dir
  setup = classify.setup(_config(pairs, directory), str(tmp_path), Resume())
  cfg, variables = load_hf(directory)
  chex.assert_trees_all_equal(setup.start_params["encoder"], variables["params"])
  pooling = {"bert": "pooler", "roberta": "pooler", "distilbert": "pre_classifier",
             "modernbert": "first_head"}[family]
  assert setup.task.model.pooling == pooling
  # BERT's pooler comes with it; RoBERTa's head and DistilBERT's pre-classifier start afresh.
  assert ("pooler" in setup.start_params) == (family == "bert")
  assert setup.encoder.pad_id == cfg.pad_id and setup.encoder.vocab_size == cfg.vocab_size
  # Each example is laid out as the checkpoint's own tokenizer lays out a pair.
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  first = json.loads(open(pairs[0]).readline())
  want = tokenizer(first["text"], first["text_pair"])["input_ids"]
  row = np.asarray(examples.load_examples(os.path.join(tmp_path, "data"))["train"]["tokens"][0])
  assert row[:len(want)].tolist() == want and set(row[len(want):]) == {cfg.pad_id}
  # As the WordPiece tokenizers have it, the second text and its [SEP] are of type 1
  # (DistilBERT's and ModernBERT's models have no token-type table to read them); RoBERTa's
  # has no types.
  assert setup.task.model.type_separator == (None if family == "roberta" else
                                             tokenizer.sep_token_id)


def _vocab_txt_only(directory, to):
  """`directory` as older checkpoints ship it: vocab.txt (the WordPiece vocabulary by id), no
  tokenizer.json."""
  import shutil
  shutil.copytree(directory, to)
  fast = json.loads(open(os.path.join(to, "tokenizer.json")).read())
  os.remove(os.path.join(to, "tokenizer.json"))
  with open(os.path.join(to, "vocab.txt"), "w") as f:
    f.writelines(token + "\n" for token, _ in sorted(fast["model"]["vocab"].items(),
                                                     key=lambda kv: kv[1]))
  settings = json.loads(open(os.path.join(to, "tokenizer_config.json")).read())
  with open(os.path.join(to, "tokenizer_config.json"), "w") as f:
    json.dump({**settings, "tokenizer_class": "BertTokenizer",
               "do_lower_case": bool(fast["normalizer"].get("lowercase"))}, f)
  return str(to)


def _sentence_transformers(directory, to):
  """`directory` as older sentence-transformers saved it: the model in 0_Transformer/."""
  import shutil
  shutil.copytree(directory, os.path.join(to, "0_Transformer"))
  with open(os.path.join(to, "modules.json"), "w") as f:
    json.dump([{"idx": 0, "name": "0", "path": "0_Transformer",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}], f)
  return str(to)


@pytest.mark.parametrize("layout", [_vocab_txt_only, _sentence_transformers])
def test_fine_tuning_starts_from_a_checkpoint_as_older_tools_saved_it(layout, pairs, tmp_path):
  directory = layout(hf_models.write(tmp_path / "bert", "bert"), tmp_path / "published")
  setup = classify.setup(_config(pairs, directory), str(tmp_path / "run"), Resume())
  model = os.path.join(directory, "0_Transformer")
  model = model if os.path.isdir(model) else directory
  tokenizer = transformers.AutoTokenizer.from_pretrained(model)
  first = json.loads(open(pairs[0]).readline())
  want = tokenizer(first["text"], first["text_pair"])["input_ids"]
  meta = examples.load_examples(str(tmp_path / "run" / "data"))
  row = np.asarray(meta["train"]["tokens"][0])
  assert row[:len(want)].tolist() == want
  assert setup.encoder.vocab_size == tokenizer.vocab_size


@pytest.mark.parametrize("family", ["bert", *(pytest.param(f, marks=pytest.mark.slow)
                                              for f in ("roberta", "distilbert", "nomic_bert",
                                                        "gte", "jina_embeddings_v3",
                                                        "deberta-v2"))])
def test_a_run_trains_predicts_its_eval_and_exports_what_transformers_loads_as_itself(
    family, pairs, tmp_path):
  directory = hf_models.write(tmp_path / family, family)
  train, eval_ = pairs
  workdir = str(tmp_path / "run")
  args = [f"--config={os.path.join(runs.ROOT, 'configs', 'classify.py')}",
          f"--config.data.train={train}", f"--config.data.eval={eval_}",
          f"--config.init.hf={directory}", "--config.train.num_steps=12",
          "--config.train.batch_size=8", "--config.train.seq_len=32",
          "--config.train.log_every=4", "--config.train.eval_every=12",
          "--config.train.checkpoint_every=6", "--config.optim.warmup_steps=4"]
  result = runs.train(workdir, *args, config=None)
  assert f"fine-tuning from {directory}: 3 classes, 96 training and 24 held-out" in (
      result.stderr)
  # what the start does not hold is said, as transformers names the weights it makes anew:
  # only BERT's *ForPreTraining holds a pooler; the others' *ForMaskedLM none for the
  # classifier's pooling
  fresh = [line for line in result.stderr.splitlines()
           if line.startswith("parameters made afresh, not in the start: ")]
  assert len(fresh) == 1 and "classifier" in fresh[0]
  assert ("pooler" in fresh[0]) == (family != "bert")
  records = runs.read_metrics(os.path.join(workdir, "metrics.jsonl"))
  final = [r for r in records if r["split"] == "eval"][-1]
  from train.outputs.predict import predict
  out = tmp_path / "predictions.jsonl"
  assert predict(workdir, eval_, str(out)).count == 24
  predictions = [json.loads(line)["label"] for line in out.read_text().splitlines()]
  truth = [json.loads(line)["label"] for line in open(eval_)]
  assert np.mean([p == t for p, t in zip(predictions, truth)]) == pytest.approx(
      final["accuracy"])
  from train.outputs.predict import read_run
  assert read_run(workdir).family == family  # recorded: the export reads it, guesses nothing

  from train.outputs.export import main as export
  out = str(tmp_path / "exported")
  assert export(["--workdir", workdir, "--layout", "hf", "--out", out]) == 0
  model = transformers.AutoModelForSequenceClassification.from_pretrained(
      out, attn_implementation="eager").eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  assert tokenizer.model_max_length == 32  # the run's seq_len: what it truncates to
  assert model.config.id2label == {0: "digits", 1: "letters", 2: "symbols"}
  # The checkpoint's dropout rates, though the run's kernel trained without attention dropout.
  start, back = (families.config_from_hf(families.read_hf_config(d), attention_impl="reference")
                 for d in (directory, out))
  assert (back.dropout, back.attention_dropout) == (start.dropout, start.attention_dropout) == (
      0.1, 0.1)
  rows = [json.loads(line) for line in open(eval_)][:6]
  batch = tokenizer([r["text"] for r in rows], [r["text_pair"] for r in rows], padding=True,
                    return_token_type_ids=family in ("bert", "nomic_bert", "gte"),
                    return_tensors="pt")
  with torch.no_grad():
    theirs = torch.softmax(model(**batch).logits, -1).numpy()
  from train.tasks.classify import Predictor
  ours = Predictor(workdir).probabilities([r["text"] for r in rows],
                                          [r["text_pair"] for r in rows])
  np.testing.assert_allclose(ours, theirs, atol=1e-5)
  # A second export to the same place would replace it: refused, and it is left as it was.
  assert export(["--workdir", workdir, "--layout", "hf", "--out", out]) == 2
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json",
                                     "tokenizer_config.json"]


def test_what_config_init_hf_cannot_use_is_one_line(pairs, tmp_path):
  directory = hf_models.write(tmp_path / "bert", "bert")
  config = _config(pairs, directory)
  config.init.run = str(tmp_path)
  with pytest.raises(RunError, match="config.init.hf: .*expected unset with config.init.run"):
    classify.DEFINITION.check(config)
  config = _config(pairs, directory)
  os.remove(os.path.join(directory, "tokenizer.json"))
  with pytest.raises(RunError, match="config.init.hf: .*no tokenizer files"):
    classify.setup(config, str(tmp_path / "a"), Resume())
  config = _config(pairs, str(tmp_path / "missing"))
  with pytest.raises(RunError, match="config.init.hf: .*missing: not a directory") as e:
    classify.setup(config, str(tmp_path / "b"), Resume())
  assert "\n" not in str(e.value)
  config = _config(pairs, hf_models.write(tmp_path / "long", "bert"), seq_len=128)
  with pytest.raises(RunError, match="config.train.seq_len: 128, expected <= "
                                     "config.model.max_len \\(66\\)"):
    classify.setup(config, str(tmp_path / "c"), Resume())


def test_a_run_of_another_architecture_is_not_exported_as_a_bert(reference_run, tmp_path,
                                                                  capsys):
  from train.outputs.export import main as export
  out = tmp_path / "out"
  assert export(["--workdir", reference_run, "--layout", "hf", "--out", str(out)]) == 2
  error = capsys.readouterr().err
  assert error.startswith("export: error: --layout hf: this model is not a distilbert model: it "
                          "has position_embedding='sinusoidal'") and error.count("\n") == 1
  assert not out.exists() and os.listdir(tmp_path) == []


def test_a_run_from_scratch_of_a_bert_family_architecture_exports_too(pairs, tmp_path):
  train, eval_ = pairs
  workdir = str(tmp_path / "run")
  distilbert = ["position_embedding=learned", "embedding_scale=False", "embedding_norm=True",
                "final_norm=False", "layer_norm_eps=1e-12", "activation=gelu", "d_model=16",
                "n_heads=2", "d_ff=32", "n_layers=1", "max_len=32"]
  runs.train(workdir, f"--config={os.path.join(runs.ROOT, 'configs', 'classify.py')}",
             f"--config.data.train={train}", f"--config.data.eval={eval_}",
             "--config.data.tokenizer=bytes", "--config.task.pooling=pre_classifier",
             *[f"--config.model.{f}" for f in distilbert], "--config.train.num_steps=4",
             "--config.train.batch_size=8", "--config.train.seq_len=32",
             "--config.train.eval_every=4", "--config.train.checkpoint_every=4", config=None)
  from train.outputs.export import main as export
  from train.tasks.classify import Predictor
  out = str(tmp_path / "exported")
  assert export(["--workdir", workdir, "--layout", "hf", "--out", out]) == 0
  model = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
  assert model.config.model_type == "distilbert" and not os.path.exists(
      os.path.join(out, "tokenizer.json"))  # its ids carry this project's offset
  classifier = Predictor(workdir).text_classifier()
  ids = np.asarray([[30, 40, 50, 60, 70, 2, 80, 90]])
  import jax
  from flax_encoder.classifier import SequenceClassifier
  ours = SequenceClassifier(classifier.config, 3, "pre_classifier").apply(
      {"params": classifier.params}, ids)
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(ids)).logits.numpy()
  np.testing.assert_allclose(np.asarray(jax.device_get(ours)), theirs, atol=1e-5)
