"""Batch scoring job: users' histories in, top-K rankings Parquet out.

Modules, in the order a job uses them:

- :mod:`serving.score`: ``run_score`` / ``score_with_model``, the job and its result;
- :mod:`serving.distributed`: the processes that share the shards (torchrun, gloo);
- :mod:`serving.manifest`: part files, the manifest, and the rules of resuming;
- :mod:`serving.inputs`: prepared dir, sequences Parquet or raw events -> shards in model indices;
- :mod:`serving.rank`: context windows for long histories, batches, raw ids out;
- :mod:`serving.topk`: top-K over the catalog in chunks, and its full-matrix reference.
"""
