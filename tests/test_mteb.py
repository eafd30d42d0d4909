"""MTEB on flax-encoder: the published all-MiniLM-L6-v2 as `SentenceEncoder` through
`flax_encoder.pytorch.mteb_model.MtebModel`, and as sentence-transformers' SentenceTransformer,
on the same retrieval task whose data is local (nothing downloaded): mteb's scores equal; and
`python -m train.evaluate`'s figures equal mteb's."""

import pytest

from tests.test_evaluate import topic_set
from train.data import beir
from train.outputs import evaluate


def _task(data: beir.BeirSet):
  """An mteb retrieval task over `data`, loaded from memory."""
  from datasets import Dataset
  from mteb.abstasks.retrieval import AbsTaskRetrieval
  from mteb.abstasks.task_metadata import TaskMetadata

  class Topics(AbsTaskRetrieval):
    metadata = TaskMetadata(
        type="Retrieval", name="PydocTopics", main_score="ndcg_at_10",
        description="Python's pydoc topics: each topic's name, its paragraphs relevant.",
        reference="https://docs.python.org/3/library/pydoc.html",
        dataset={"path": "local", "revision": "1"}, category="t2t", eval_splits=["test"],
        eval_langs=["eng-Latn"], date=("2024-01-01", "2024-01-01"), dialect=[], domains=[],
        task_subtypes=[], license="not specified", annotations_creators="derived",
        modalities=["text"], sample_creation="found", bibtex_citation="")

    def load_data(self, num_proc=None, **kwargs):
      corpus = Dataset.from_list([{"id": i, "title": "", "text": t}
                                  for i, t in zip(data.corpus_ids, data.documents)])
      queries = Dataset.from_list([{"id": i, "text": t}
                                   for i, t in zip(data.query_ids, data.queries)])
      self.dataset = {"default": {"test": {"corpus": corpus, "queries": queries,
                                           "relevant_docs": data.qrels, "top_ranked": None}}}
      self.data_loaded = True

  return Topics()


@pytest.mark.slow  # mteb, the published model twice and the evaluate command
def test_mteb_scores_sentence_encoder_as_sentence_transformer(tmp_path):
  mteb = pytest.importorskip("mteb", reason="MTEB's evaluation (pip install mteb)")
  pytest.importorskip("sentence_transformers")
  from sentence_transformers import SentenceTransformer

  from flax_encoder.embeddings import SentenceEncoder
  from flax_encoder.pytorch.mteb_model import MtebModel
  from tests.published import all_minilm_l6_v2
  model = all_minilm_l6_v2()
  data_dir = topic_set(tmp_path / "topics")
  data = beir.read(data_dir)
  run = lambda m: mteb.evaluate(m, _task(data), cache=None, show_progress_bar=False
                                ).task_results[0].scores["test"][0]
  theirs = run(SentenceTransformer(model, device="cpu"))
  ours = run(MtebModel(SentenceEncoder.load(model), name="all-MiniLM-L6-v2"))
  figures = [k for k, v in theirs.items() if isinstance(v, float)]
  assert len(figures) > 100 and 0.2 < theirs["ndcg_at_10"] < 1
  for name in figures:  # (some are NaN on both sides: recall at 1000 of 190 documents)
    assert ours[name] == pytest.approx(theirs[name], abs=1e-4, nan_ok=True), name
  # python -m train.evaluate's figures are mteb's (which rounds some to 5 places)
  ranked = evaluate.evaluate(model, data_dir, str(tmp_path / "m.json"))["metrics"]
  for name in ("ndcg_at_10", "mrr_at_10", "recall_at_100", "map_at_100"):
    assert ranked[name] == pytest.approx(theirs[name], abs=1e-5), name
