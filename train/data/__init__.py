"""The data: corpora read and prepared (sources, prepare, vocabulary, tokens, dataset), the
fine-tuning examples (examples) and the batches training reads (pipeline)."""
