"""A retrieval set in BEIR's layout, the one BEIR, MTEB and sentence-transformers' evaluators read:

  DIR/corpus.jsonl    {"_id": "d1", "title": "...", "text": "..."} a line (title optional)
  DIR/queries.jsonl   {"_id": "q1", "text": "..."} a line
  DIR/qrels/test.tsv  query-id, corpus-id, score: tab-separated, a header line first
                      (and train.tsv, dev.tsv: the other splits)

A document's text is its title, a space and its text, as BEIR's and MTEB's models read it (the
text alone where the title is empty). The queries of a split are those its qrels judge.
"""

from __future__ import annotations

import dataclasses
import json
import os

from train.errors import RunError

SPLITS = ("train", "dev", "test")


@dataclasses.dataclass(frozen=True)
class BeirSet:
  """One split of a BEIR folder: every document, the judged queries, their judgements."""

  corpus_ids: list[str]
  documents: list[str]
  query_ids: list[str]
  queries: list[str]
  qrels: dict  # query id -> {document id: relevance}


def _jsonl(path: str, fields: tuple[str, ...]) -> list[dict]:
  if not os.path.isfile(path):
    raise RunError(f"--beir: {path}: no such file, expected BEIR's {os.path.basename(path)} "
                   f"(a JSON object a line with {', '.join(fields)})")
  records = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise RunError(f"{path}:{number}: not JSON ({e.msg}), expected an object a line") from None
      if not isinstance(record, dict):
        raise RunError(f"{path}:{number}: a {type(record).__name__}, expected a JSON object")
      for field in fields:
        if not isinstance(record.get(field), (str, int)) or isinstance(record.get(field), bool):
          raise RunError(f"{path}:{number}: {field}={record.get(field)!r}, expected a string")
      records.append(record)
  return records


def read_qrels(path: str) -> dict:
  """A qrels .tsv (query-id, corpus-id, score; a header line) as {query: {document: score}}."""
  if not os.path.isfile(path):
    raise RunError(f"--beir: {path}: no such file, expected the split's qrels (query-id, "
                   f"corpus-id, score, tab-separated)")
  qrels: dict = {}
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      fields = line.rstrip("\n").split("\t")
      if number == 1 and fields[-1:] == ["score"]:
        continue  # BEIR's header
      if fields == [""]:
        continue
      if len(fields) != 3:
        raise RunError(f"{path}:{number}: {len(fields)} fields, expected 3 (query-id, "
                       f"corpus-id, score)")
      try:
        score = int(fields[2])
      except ValueError:
        raise RunError(f"{path}:{number}: score {fields[2]!r}, expected an integer") from None
      qrels.setdefault(fields[0], {})[fields[1]] = score
  return qrels


def read(directory: str, split: str = "test") -> BeirSet:
  """The documents, the queries `split`'s qrels judge, and those judgements."""
  if not os.path.isdir(directory):
    raise RunError(f"--beir {directory}: no such directory, expected a BEIR folder "
                   f"(corpus.jsonl, queries.jsonl, qrels/{split}.tsv)")
  qrels = read_qrels(os.path.join(directory, "qrels", f"{split}.tsv"))
  corpus = _jsonl(os.path.join(directory, "corpus.jsonl"), ("_id",))
  corpus_ids = [str(d["_id"]) for d in corpus]
  documents = [(str(d.get("title") or "") + " " + str(d.get("text") or "")).strip()
               for d in corpus]
  queries = {str(q["_id"]): str(q["text"]) for q in
             _jsonl(os.path.join(directory, "queries.jsonl"), ("_id", "text"))}
  missing = [q for q in qrels if q not in queries]
  if missing:
    raise RunError(f"{directory}/qrels/{split}.tsv: query {missing[0]!r} (and "
                   f"{len(missing) - 1} more) not in queries.jsonl")
  known = set(corpus_ids)
  judged = [q for q in qrels if any(d in known for d in qrels[q])]
  if not judged:
    raise RunError(f"{directory}/qrels/{split}.tsv: no query judges a document of corpus.jsonl")
  return BeirSet(corpus_ids, documents, judged, [queries[q] for q in judged],
                 {q: qrels[q] for q in judged})
