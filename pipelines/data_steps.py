"""``recsys-alibi generate`` and ``recsys-alibi prepare``: the data steps of the job layer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from recsys_alibi.atomic import atomic_path, stale_temps
from pipelines.outputs import check_outside_input
from recsys_alibi.config import JobConfig


@dataclass(frozen=True)
class GenerateJobResult:
    """The synthetic events file and its size."""

    path: Path
    events: int
    users: int
    items: int

    def summary(self) -> str:
        return f"generated {self.events} events of {self.users} users on {self.items} items -> {self.path}"


def run_generate(config: JobConfig, output: str | Path) -> GenerateJobResult:
    """Write the seeded synthetic behaviour log of ``config.generate`` to ``output`` (Parquet, atomic;
    temporary files a killed run left beside ``output`` are removed first)."""
    from recsys_alibi.data.synthetic import generate_events

    events = generate_events(config.generate, config.seed)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    for stale in stale_temps(output):  # what a killed generate left
        stale.unlink()
    with atomic_path(output) as tmp:
        events.write_parquet(tmp)
    return GenerateJobResult(
        path=output,
        events=events.height,
        users=events.get_column("user_id").n_unique(),
        items=events.get_column("item_id").n_unique(),
    )


def run_prepare(config: JobConfig, input_path: str | Path | None, output_dir: str | Path):
    """Events -> cleaned events, vocabulary, sequences, rejects and statistics in ``output_dir``.

    Raises:
        DataError: no input given, or the input cannot be read (one line naming the fix).
        OutputPathError: ``output_dir`` is inside the input folder (its files would be read back as events).
    """
    from recsys_alibi.data.ingest import DataError
    from recsys_alibi.data.prepare import prepare

    input_path = input_path or config.data.input
    if input_path is None:
        raise DataError("prepare needs an input: pass --input PATH or set data.input in the config")
    check_outside_input(output_dir, input_path)
    fmt = None if config.data.format == "auto" else config.data.format
    return prepare(config.data, input_path, output_dir, fmt=fmt)
