"""Prepared data: ingest, cleaning, sequences, splits, loaders."""
