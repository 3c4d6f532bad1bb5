"""Batch scoring job: sequences in, top-K rankings Parquet out."""
