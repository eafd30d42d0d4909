"""Text in, labels out: a fine-tuned classifier with its tokenizer and classes, in one file.

    classifier = TextClassifier.load("classifier.msgpack")
    classifier(["a text", "another"])                  # -> its labels, e.g. ["net", "doc"]
    classifier.probabilities(["a text"])               # -> float32 [1, num_labels]
    classifier(["a question"], pairs=["its context"])  # for a model trained on pairs

`python -m train.export --workdir RUN --out classifier.msgpack` writes the file from a
fine-tuning run; `save` writes one from parts. It holds what the model is (the encoder's
record), its parameters (encoder and head), the pooling, the classes, the tokenizer's model,
and how an example is laid out (seq_len, the ids of padding and of the separator between a
text and its pair, or the special ids a Hugging Face tokenizer puts around them). How it
runs (compute dtype, attention kernel) is the reader's: `load` takes EncoderConfig's
execution fields. Of a text only the ids seq_len can hold are tokenized; texts
are padded to the smallest of a few lengths that holds them and batches to a fixed size, so
it compiles once per length.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import numpy as np

from flax_encoder.classifier import POOLINGS, SequenceClassifier
from flax_encoder.config import EncoderConfig
from flax_encoder.inference import default_buckets, padded_batches
from flax_encoder.tokenizer import Template, Tokenizer, encode_examples
from flax_encoder.weights import CLASSIFIER_FORMAT, read, write


class TextClassifier:
  """A SequenceClassifier with the tokenizer and classes it was trained with."""

  def __init__(self, config: EncoderConfig, params: dict, labels: Sequence, tokenizer: Tokenizer,
               seq_len: int, separator_id: int, pooling: str = "mean", batch_size: int = 64,
               template: Template | None = None, type_separator: int | None = None):
    if pooling not in POOLINGS:
      raise ValueError(f"pooling: {pooling!r}, expected one of {POOLINGS}")
    if tokenizer.vocab_size > config.vocab_size:
      raise ValueError(f"tokenizer: ids up to {tokenizer.vocab_size - 1}, expected fewer than the "
                       f"encoder's vocab_size {config.vocab_size}")
    if not 0 < seq_len <= config.max_len:
      raise ValueError(f"seq_len: {seq_len}, expected an integer in [1, {config.max_len}]")
    if not isinstance(batch_size, int) or batch_size < 1:
      raise ValueError(f"batch_size: {batch_size!r}, expected an integer >= 1")
    # Inside jit an id past the embedding is no error but NaN probabilities: refused here.
    name, laid = (("template", (*template.start, *template.between, *template.end)) if template
                  else ("separator_id", (separator_id,)))
    bad = next((i for i in laid if not 0 <= i < config.vocab_size), None)
    if bad is not None:
      raise ValueError(f"{name}: id {bad}, expected ids below the encoder's vocab_size "
                       f"{config.vocab_size}")
    self.config, self.labels, self.tokenizer = config, list(labels), tokenizer
    self.seq_len, self.separator_id, self.pooling = seq_len, separator_id, pooling
    self.batch_size, self.template, self.type_separator = batch_size, template, type_separator
    self.params = jax.device_put(params)
    model = SequenceClassifier(config, len(self.labels), pooling, type_separator)
    self._probabilities = jax.jit(
        lambda params, ids: jax.nn.softmax(model.apply({"params": params}, ids)))
    self.buckets = default_buckets(config, seq_len)

  def save(self, path: str | os.PathLike) -> None:
    """Writes everything `load` needs into the one file `path`."""
    write(path, CLASSIFIER_FORMAT, self.config, self.params, labels=self.labels,
          pooling=self.pooling, seq_len=self.seq_len, separator_id=self.separator_id,
          tokenizer={"kind": self.tokenizer.kind, "offset": self.tokenizer.offset,
                     "model": self.tokenizer.model or b""},
          **({"template": self.template.to_dict()} if self.template else {}),
          type_separator=-1 if self.type_separator is None else self.type_separator)

  @classmethod
  def load(cls, path: str | os.PathLike, batch_size: int = 64, **settings) -> TextClassifier:
    """The classifier in `path` (`save`'s file), run as `settings` say (EncoderConfig's
    execution fields: dtype, attention_impl, remat)."""
    config, params, contents = read(path, CLASSIFIER_FORMAT, **settings)
    spec = contents["tokenizer"]
    tokenizer = Tokenizer(spec["kind"], spec["model"] or None, int(spec["offset"]))
    labels = contents["labels"]
    labels = [labels[str(i)] for i in range(len(labels))] if isinstance(labels, dict) else labels
    template = contents.get("template")
    type_separator = int(contents.get("type_separator", -1))
    return cls(config, params, labels, tokenizer, int(contents["seq_len"]),
               int(contents["separator_id"]), contents["pooling"], batch_size,
               Template.from_dict(template) if template else None,
               None if type_separator < 0 else type_separator)

  def probabilities(self, texts: Sequence[str],
                    pairs: Sequence[str | None] | None = None) -> np.ndarray:
    """float32 [len(texts), num_labels]: each text's (or text and pair's) class
    probabilities, in order."""
    _check_texts("texts", texts)
    if pairs is not None:
      _check_texts("pairs", pairs, optional=True)
      if len(pairs) != len(texts):
        raise ValueError(f"pairs: {len(pairs)} of them, expected one per text ({len(texts)})")
    rows = encode_examples(self.tokenizer, list(texts), None if pairs is None else list(pairs),
                           self.seq_len, self.separator_id, self.template)
    out = np.zeros((len(rows), len(self.labels)), np.float32)
    for batch, ids in padded_batches(rows, self.buckets, self.batch_size, self.config.pad_id):
      out[batch] = np.asarray(self._probabilities(self.params, ids))[:len(batch)]
    return out

  def __call__(self, texts: Sequence[str], pairs: Sequence[str | None] | None = None) -> list:
    """The most probable label of each text (or text and pair), in order."""
    return [self.labels[i] for i in np.argmax(self.probabilities(texts, pairs), -1)]


def _check_texts(name: str, values, optional: bool = False) -> None:
  if isinstance(values, str) or not isinstance(values, Sequence):
    raise ValueError(f"{name}: a {type(values).__name__}, expected a list of strings")
  bad = next((v for v in values if not (isinstance(v, str) or (optional and v is None))), ...)
  if bad is not ...:
    raise ValueError(f"{name}: holds {bad!r}, expected strings"
                     + (" (or None for no pair)" if optional else ""))
