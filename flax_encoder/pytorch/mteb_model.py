"""A flax-encoder `SentenceEncoder` as an `mteb` model: MTEB's tasks run on it as on a
SentenceTransformer (mteb scores in torch, so this lives in the PyTorch bridge; `pip install
mteb`).

    import mteb
    from flax_encoder.embeddings import SentenceEncoder
    from flax_encoder.pytorch.mteb_model import MtebModel

    model = MtebModel(SentenceEncoder.load("all-MiniLM-L6-v2"), name="all-MiniLM-L6-v2")
    results = mteb.evaluate(model, mteb.get_tasks(tasks=["SciFact"]), cache=None)

Queries are encoded by `encode_query` and documents by `encode_document` (the folder's "query"
and "document" prompts, as mteb's SentenceTransformer wrapper picks them); other texts by the
encoder itself. Scores are the folder's similarity (cosine, dot, euclidean, manhattan),
computed by mteb as for a SentenceTransformer.
"""

from __future__ import annotations

import numpy as np
from mteb.models.abs_encoder import AbsEncoder
from mteb.models.model_meta import ModelMeta, ScoringFunction
from mteb.types import PromptType


class MtebModel(AbsEncoder):
  """mteb's encoder protocol around a SentenceEncoder (`encoder`), reported as `name`."""

  def __init__(self, encoder, name: str = "flax-encoder", revision: str | None = None):
    self.model = encoder
    self.mteb_model_meta = ModelMeta.create_empty(overwrites=dict(
        name=name, revision=revision, framework=["JAX"], embed_dim=encoder.model.dim,
        max_tokens=encoder.max_seq_length,
        similarity_fn_name=ScoringFunction(encoder.similarity)))

  def encode(self, inputs, *, task_metadata, hf_split: str, hf_subset: str,
             prompt_type: PromptType | None = None, **kwargs) -> np.ndarray:
    """float32 [texts, dim]: every text of the batches of `inputs` ({'text': [...]} each)."""
    texts = [text for batch in inputs for text in batch["text"]]
    if prompt_type == PromptType.query:
      return np.asarray(self.model.encode_query(texts), np.float32)
    if prompt_type == PromptType.document:
      return np.asarray(self.model.encode_document(texts), np.float32)
    return np.asarray(self.model(texts), np.float32)
