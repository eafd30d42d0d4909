"""`python -m train.evaluate` and the library under it (flax_encoder.ranking, .search), checked
against the field's references: the figures against pytrec_eval (trec_eval) on the run file the
command writes, the rankings against sentence-transformers' scores of the same folders."""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from flax_encoder import ranking, search
from tests import runs
from train.data import beir
from train.errors import RunError
from train.outputs import evaluate

WORDS = "the quick brown fox jumps over lazy dog a b c d e f g h i j".split()


def _trec_eval(run: dict, qrels: dict) -> dict:
  """{query: {name: value}} of pytrec_eval on `run`: nDCG@10, Recall@100, MAP@100, and MRR@10
  as ir-measures computes it (trec_eval's recip_rank of each query's first 10)."""
  pytrec_eval = pytest.importorskip("pytrec_eval")
  names = {"ndcg_cut_10": "ndcg_at_10", "recall_100": "recall_at_100",
           "map_cut_100": "map_at_100"}
  each = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100", "map_cut.100"}
                                        ).evaluate(run)
  reciprocal = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(
      ranking.top_k(run, 10))
  return {q: {**{names[k]: v for k, v in m.items() if k in names},
              "mrr_at_10": reciprocal[q]["recip_rank"]} for q, m in each.items()}


def test_the_figures_are_trec_evals_on_runs_with_ties_and_graded_judgements():
  rng = random.Random(0)
  documents = [f"d{i}" for i in range(150)]
  for _ in range(5):
    qrels = {f"q{q}": {d: rng.choice([0, 1, 1, 2, 3])
                       for d in rng.sample(documents, rng.randint(1, 12))} for q in range(20)}
    # integer scores: many ties, which trec_eval breaks by document id
    run = {q: {d: float(rng.randint(0, 30)) for d in rng.sample(documents, rng.randint(5, 140))}
           for q in qrels}
    run["unjudged"] = {"d1": 1.0}  # left out, as trec_eval leaves it out
    want = _trec_eval(run, qrels)
    got = ranking.metrics(run, qrels, per_query=True)
    assert set(got) == set(want) == set(qrels)
    for q in want:
      for name in ranking.DEFAULT:
        assert got[q][name] == pytest.approx(want[q][name], abs=1e-12), (q, name)


def test_the_training_tasks_figures_are_trec_evals_with_the_relevant_one_last_of_its_ties():
  # The held-out pairs a training task ranks: candidate i the one relevant to query i. Integer
  # scores tie often; the relevant candidate's id is the least of its query's, so trec_eval
  # ranks it below every candidate scored alike.
  pytrec_eval = pytest.importorskip("pytrec_eval")
  rng = np.random.default_rng(0)
  names = {"ndcg_cut_10": "ndcg_at_10", "recall_1": "recall_at_1", "recall_10": "recall_at_10",
           "map_cut_10": "map_at_10", "P_5": "precision_at_5"}
  for similarity in [rng.integers(0, 6, (12, 30)).astype(float), np.zeros((12, 12)),
                     rng.normal(size=(12, 30))]:
    doc = lambda i, j: f"d{0 if i == j else 1}{j:03d}"
    run = {f"q{i}": {doc(i, j): float(s) for j, s in enumerate(row)}
           for i, row in enumerate(similarity)}
    qrels = {f"q{i}": {doc(i, i): 1} for i in range(len(similarity))}
    each = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.1,10", "map_cut.10",
                                                  "P.5"}).evaluate(run)
    reciprocal = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(
        ranking.top_k(run, 10))
    want = {name: np.mean([m[key] for m in each.values()]) for key, name in names.items()}
    want["mrr_at_10"] = np.mean([m["recip_rank"] for m in reciprocal.values()])
    got = ranking.diagonal_metrics(similarity, tuple(want))
    for name in want:
      assert got[name] == pytest.approx(want[name], abs=1e-12), name
  assert ranking.diagonal_metrics(np.zeros((12, 12)))["mrr_at_10"] == 0  # all alike: last
  with pytest.raises(ranking.RankingError, match=r"^similarity of shape \(3,\), expected"):
    ranking.diagonal_metrics(np.zeros(3))


def test_a_run_file_reads_back_as_written_and_a_bad_line_is_named():
  run = {"q1": {"d2": 0.5, "d1": 0.5, "d3": 2.0}, "q2": {"d9": -1.25}}
  lines = ranking.run_lines(run, "tag")
  assert lines[:3] == ["q1 Q0 d3 1 2 tag\n", "q1 Q0 d2 2 0.5 tag\n", "q1 Q0 d1 3 0.5 tag\n"]
  assert ranking.read_run(lines) == run
  with pytest.raises(ranking.RankingError, match=r"^r.trec:2: 5 fields, expected 6"):
    ranking.read_run(["q1 Q0 d1 1 0.5 t\n", "q1 Q0 d2 2 0.4\n"], "r.trec")
  with pytest.raises(ranking.RankingError, match=r"^measure 'ndcg@10', expected one of"):
    ranking.metrics(run, {}, ("ndcg@10",))


def test_the_search_keeps_each_querys_best_documents_over_chunks_and_devices():
  rng = np.random.default_rng(0)
  queries, documents = rng.normal(size=(7, 5)), rng.normal(size=(53, 5))
  documents[40] = documents[3]  # a tie: the earlier document first
  want = queries @ documents.T
  for chunk in (4, 53, None):
    scores, ids = search.top_k(search.dense_scores("dot"), queries, documents, 10, chunk)
    order = np.lexsort((np.arange(53)[None].repeat(7, 0), -want), axis=1)[:, :10]
    np.testing.assert_array_equal(ids, order)
    np.testing.assert_allclose(scores, np.take_along_axis(want, order, 1), rtol=1e-5)
  scores, ids = search.top_k(search.dense_scores("dot"), queries, documents[:3], 10)
  assert ids.shape == (7, 3)  # fewer documents than k
  with pytest.raises(search.SearchError, match=r"^similarity='l2', expected one of"):
    search.dense_scores("l2")
  # FAISS's index where it is installed (on the CPU), the same documents as JAX's search
  for similarity in ("cosine", "dot", "euclidean"):
    want = search.top_k(search.dense_scores(similarity), queries, documents, 10)
    got = search.dense_top_k(similarity, queries, documents, 10)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def write_beir(root, documents: list[str], queries: list[str], qrels: dict) -> str:
  """A BEIR folder of documents d0, d1 … and queries q0, q1 …, judged by `qrels`."""
  os.makedirs(os.path.join(root, "qrels"), exist_ok=True)
  with open(os.path.join(root, "corpus.jsonl"), "w") as f:
    f.writelines(json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n"
                 for i, t in enumerate(documents))
  with open(os.path.join(root, "queries.jsonl"), "w") as f:
    f.writelines(json.dumps({"_id": f"q{i}", "text": t}) + "\n" for i, t in enumerate(queries))
  with open(os.path.join(root, "qrels", "test.tsv"), "w") as f:
    f.write("query-id\tcorpus-id\tscore\n")
    f.writelines(f"{q}\t{d}\t{r}\n" for q, judged in qrels.items() for d, r in judged.items())
  return str(root)


def topic_set(root) -> str:
  """Real text: paragraphs of Python's pydoc topics, every 6th, the documents; each topic's
  name a query, its paragraphs the relevant ones (binary, as sentence-transformers'
  evaluator takes them)."""
  from benchmarks.finetune_packed import paragraphs
  texts, topics = paragraphs()
  kept = [(t, topic) for i, (t, topic) in enumerate(zip(texts, topics)) if i % 6 == 0]
  names = sorted({topic for _, topic in kept})
  qrels = {f"q{names.index(topic)}": {} for topic in names}
  for i, (_, topic) in enumerate(kept):
    qrels[f"q{names.index(topic)}"][f"d{i}"] = 1
  return write_beir(root, [t for t, _ in kept], [n.replace("-", " ") for n in names], qrels)


def tiny_set(root, documents: int = 40, queries: int = 8) -> str:
  rng = random.Random(1)
  text = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))
  qrels = {f"q{q}": {f"d{d}": rng.choice([1, 2]) for d in rng.sample(range(documents), 3)}
           for q in range(queries)}
  return write_beir(root, [text(rng.randint(3, 12)) for _ in range(documents)],
                    [text(rng.randint(2, 5)) for _ in range(queries)], qrels)


@pytest.fixture(scope="module")
def minilm_evaluated(tmp_path_factory):
  """(the published all-MiniLM-L6-v2, the topics set, evaluate's result) of one command."""
  from tests.published import all_minilm_l6_v2
  model = all_minilm_l6_v2()
  root = tmp_path_factory.mktemp("evaluate")
  data = topic_set(root / "topics")
  out = root / "metrics.json"
  done = subprocess.run([sys.executable, "-m", "train.evaluate", "--model", model, "--beir", data,
                         "--out", str(out)], cwd=runs.ROOT, env=runs.environment(1),
                        capture_output=True, text=True, timeout=runs.limit(300), check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result["run"] == str(root / "metrics.trec") and done.stdout.startswith(f"{out}: ")
  return model, data, result


def test_the_commands_figures_are_pytrec_evals_on_the_run_file_it_wrote(minilm_evaluated):
  _, data, result = minilm_evaluated
  with open(result["run"]) as f:
    run = ranking.read_run(f)
  qrels = beir.read(data).qrels
  want = _trec_eval(run, qrels)
  assert set(want) == set(qrels) and result["queries"] == len(qrels)
  for name, value in result["metrics"].items():
    assert value == pytest.approx(np.mean([m[name] for m in want.values()]), abs=1e-12), name
  assert 0.2 < result["metrics"]["ndcg_at_10"] < 1  # a model that ranks: well above chance


@pytest.mark.slow  # the published model in sentence-transformers, and its evaluator
def test_the_dense_ranking_is_sentence_transformers_over_the_whole_corpus(minilm_evaluated):
  """Every query's 100 documents are those sentence-transformers' model scores highest, with
  its scores; its InformationRetrievalEvaluator gives the same figures."""
  pytest.importorskip("sentence_transformers")
  from sentence_transformers import SentenceTransformer
  from sentence_transformers.sentence_transformer.evaluation import (
      InformationRetrievalEvaluator)
  model, data, result = minilm_evaluated
  data = beir.read(data)
  theirs = SentenceTransformer(model, device="cpu")
  scores = theirs.similarity(theirs.encode_query(data.queries),
                             theirs.encode_document(data.documents)).numpy()
  with open(result["run"]) as f:
    run = ranking.read_run(f)
  for q, row in zip(data.query_ids, scores):
    got = run[q]
    assert len(got) == 100
    ids = [int(d[1:]) for d in got]
    np.testing.assert_allclose([got[d] for d in got], row[ids], atol=2e-6)
    # none left out scores above the lowest kept, but by a hair
    assert np.delete(row, ids).max() <= min(got.values()) + 2e-6
  evaluator = InformationRetrievalEvaluator(
      dict(zip(data.query_ids, data.queries)), dict(zip(data.corpus_ids, data.documents)),
      {q: set(judged) for q, judged in data.qrels.items()}, mrr_at_k=[10], ndcg_at_k=[10],
      accuracy_at_k=[1], precision_recall_at_k=[100], map_at_k=[100], show_progress_bar=False)
  figures = evaluator(theirs)
  for ours, name in (("ndcg_at_10", "ndcg@10"), ("mrr_at_10", "mrr@10"),
                     ("recall_at_100", "recall@100"), ("map_at_100", "map@100")):
    assert result["metrics"][ours] == pytest.approx(figures[f"cosine_{name}"], abs=2e-3), ours


def _st_scores(kind: str, folder: str, data: beir.BeirSet) -> np.ndarray:
  """sentence-transformers' [queries, documents] scores of `folder`."""
  from sentence_transformers import MultiVectorEncoder, SparseEncoder
  cls = {"sparse": SparseEncoder, "multi_vector": MultiVectorEncoder}[kind]
  theirs = cls(folder, device="cpu")
  scores = theirs.similarity(theirs.encode_query(data.queries),
                             theirs.encode_document(data.documents))
  return np.asarray(scores.to_dense() if scores.is_sparse else scores, np.float64)


@pytest.mark.parametrize("kind", ["sparse", "multi_vector"])
def test_sparse_and_multi_vector_rankings_are_sentence_transformers_scores(tmp_path, kind):
  pytest.importorskip("torch", reason="sentence-transformers saves the folders")
  pytest.importorskip("sentence_transformers")
  import torch
  from sentence_transformers import MultiVectorEncoder, SparseEncoder

  from tests import hf_models
  hf = hf_models.write(tmp_path / "hf", "bert", head="masked_lm" if kind == "sparse" else "base")
  torch.manual_seed(0)
  folder = str(tmp_path / kind)
  (SparseEncoder if kind == "sparse" else MultiVectorEncoder)(hf, device="cpu").save(folder)
  data_dir = tiny_set(tmp_path / "set")
  result = evaluate.evaluate(folder, data_dir, str(tmp_path / "m.json"),
                             run_path=str(tmp_path / "m.trec"))
  assert result["kind"] == kind
  data = beir.read(data_dir)
  want = _st_scores(kind, folder, data)
  with open(tmp_path / "m.trec") as f:
    run = ranking.read_run(f)
  for q, row in zip(data.query_ids, want):
    assert sorted(run[q], key=lambda d: int(d[1:])) == data.corpus_ids  # all 40 ranked
    np.testing.assert_allclose([run[q][d] for d in data.corpus_ids], row, rtol=1e-5, atol=1e-5)
  assert result["metrics"] == pytest.approx(ranking.metrics(run, data.qrels), abs=1e-12)


def test_a_reranker_rescores_the_first_stages_candidates_as_cross_encoder(tmp_path):
  pytest.importorskip("torch", reason="sentence-transformers saves the folders")
  pytest.importorskip("sentence_transformers")
  import torch
  from sentence_transformers import CrossEncoder

  from tests import hf_models
  folder = hf_models.write(tmp_path / "ce", "bert", head="sequence_classification",
                           num_labels=1)
  data_dir = tiny_set(tmp_path / "set")
  data = beir.read(data_dir)
  rng = random.Random(2)
  first = {q: {d: rng.random() for d in rng.sample(data.corpus_ids, 30)} for q in data.query_ids}
  with open(tmp_path / "first.trec", "w") as f:
    f.writelines(ranking.run_lines(first))
  with pytest.raises(RunError, match="a reranker, which needs --first-stage"):
    evaluate.evaluate(folder, data_dir, str(tmp_path / "m.json"), run_path=str(tmp_path / "r"))
  result = evaluate.evaluate(folder, data_dir, str(tmp_path / "m.json"),
                             run_path=str(tmp_path / "m.trec"),
                             first=str(tmp_path / "first.trec"))
  assert result["kind"] == "rerank" and result["first_stage"]["run"] == str(
      tmp_path / "first.trec")
  assert result["first_stage"]["metrics"] == pytest.approx(ranking.metrics(first, data.qrels))
  with open(tmp_path / "m.trec") as f:
    run = ranking.read_run(f)
  theirs = CrossEncoder(folder, device="cpu")
  text = dict(zip(data.corpus_ids, data.documents))
  for q, query in zip(data.query_ids, data.queries):
    assert set(run[q]) == set(first[q])
    docs = sorted(run[q])
    want = theirs.predict([(query, text[d]) for d in docs], activation_fn=torch.nn.Identity())
    np.testing.assert_allclose([run[q][d] for d in docs], want, rtol=0, atol=1e-5)


def test_what_cannot_be_evaluated_is_one_line(tmp_path):
  data_dir = tiny_set(tmp_path / "set")
  with pytest.raises(RunError, match=r"^--beir .*nothing: no such directory, expected a BEIR"):
    beir.read(str(tmp_path / "nothing"))
  (tmp_path / "set" / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td1\n")
  with pytest.raises(RunError, match=r"dev.tsv:2: 2 fields, expected 3"):
    beir.read(data_dir, "dev")
  (tmp_path / "set" / "qrels" / "dev.tsv").write_text("qx\td1\t1\n")
  with pytest.raises(RunError, match=r"dev.tsv: query 'qx' \(and 0 more\) not in queries.jsonl"):
    beir.read(data_dir, "dev")
  with pytest.raises(RunError, match=r"^--model .*: no such directory"):
    evaluate.evaluate(str(tmp_path / "none"), data_dir, str(tmp_path / "m.json"),
                      run_path=str(tmp_path / "m.trec"))
  done = subprocess.run([sys.executable, "-m", "train.evaluate", "--model", str(tmp_path),
                         "--beir", data_dir, "--out", str(tmp_path / "m.json"), "--top-k", "10"],
                        cwd=runs.ROOT, env=runs.environment(1), capture_output=True, text=True,
                        timeout=runs.limit(120), check=False)
  assert done.returncode == 2 and "Traceback" not in done.stderr
  assert "--top-k 10: expected at least 100" in done.stderr
