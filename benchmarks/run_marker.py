"""Resume a benchmark's killed run only when the same config started it.

A benchmark trains each run into a folder of its own (``<workdir>/<label>-seed<S>``) and, started again
after a kill (a session's end), continues the run from its last epoch checkpoint (``train.resume``). A
re-run with another config (``--set model.d_model=32``) must start a new run instead: resuming would be
refused (``cannot resume ...: its run trained another model``). :func:`resuming_if_same` records the
sha256 of the resolved config in the folder (``run_config.sha256``) before training and asks for the
resume only when the record is this config's.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

MARKER = "run_config.sha256"


def resuming_if_same(config):
    """``config`` (a resolved ``JobConfig``) with ``train.resume`` set when the run its output folder last
    started had the same config, else unset; records this config's sha256 there (atomically)."""
    from recsys_alibi.atomic import write_text_atomic

    plain = config.model_copy(update={"train": config.train.model_copy(update={"resume": False})})
    key = hashlib.sha256(plain.model_dump_json().encode()).hexdigest()
    marker = Path(config.output) / MARKER
    same = marker.is_file() and marker.read_text().strip() == key
    marker.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(marker, key + "\n")
    return config.model_copy(update={"train": config.train.model_copy(update={"resume": same})})
