"""The ranker: ALiBi slopes and bias, attention backends, transformer, embeddings."""
