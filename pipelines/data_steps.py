"""``recsys-alibi generate`` and ``recsys-alibi prepare``: the data steps of the job layer."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from recsys_alibi.atomic import atomic_path
from pipelines.collisions import Output, check_apart
from recsys_alibi.config import JobConfig, with_overrides
from recsys_alibi.data.synthetic_items import (
    DAILY_ITEMS_DIR,
    GENERATED,
    check_item_table_free,
    check_written_by_generate,
    write_daily_item_tables,
    write_item_table,
)
from recsys_alibi.staging import remove_stale_temps, stale_temps

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerateJobResult:
    """The synthetic events file and its size."""

    path: Path
    events: int
    users: int
    items: int
    item_table: Path | None = None  # the item table written beside the events (recsys_alibi.data.synthetic_items)

    def summary(self) -> str:
        table = f"; item table -> {self.item_table}" if self.item_table else ""
        return f"generated {self.events} events of {self.users} users on {self.items} items -> {self.path}{table}"


def declares_generated_table(config: JobConfig) -> bool:
    """``data.item_features`` declared and no ``data.items``: the declared columns are those of the item table
    ``generate`` writes (``configs/default.yaml``), so ``generate`` writes it whatever ``generate.item_table`` says."""
    return config.data.items is None and bool(config.data.item_features.columns)


def _generate_section(config: JobConfig):
    """``config.generate``, with ``item_table`` on when the config declares the generated table's columns."""
    declared = declares_generated_table(config)
    return config.generate.model_copy(update={"item_table": True}) if declared else config.generate


def reading_generated_table(config: JobConfig, generated: GenerateJobResult) -> JobConfig:
    """``config`` with ``data.items`` = the item table ``generated`` wrote, when the config declares its columns
    (what ``pipeline`` and ``benchmarks/quality.py`` prepare with); ``config`` itself otherwise."""
    if declares_generated_table(config) and generated.item_table is not None:
        return with_overrides(config, data={"items": str(generated.item_table)})
    return config


def run_generate(config: JobConfig, output: str | Path) -> GenerateJobResult:
    """Write the seeded synthetic behaviour log of ``config.generate`` to ``output`` (Parquet, atomic;
    temporary files a killed run left beside ``output`` are removed first)."""
    from recsys_alibi.data.synthetic import generate_events

    output = Path(output)
    check_item_table_free(_generate_section(config), output)
    events = generate_events(config.generate, config.seed)
    output.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(output)  # what a killed generate left (never a temporary of a generate still running)
    with atomic_path(output) as tmp:
        events.write_parquet(tmp)
    return GenerateJobResult(
        path=output,
        events=events.height,
        users=events.get_column("user_id").n_unique(),
        items=events.get_column("item_id").n_unique(),
        item_table=write_item_table(_generate_section(config), config.seed, output),
    )


DAY_FILE = "day-{:03d}.parquet"  # generate --days: day-001.parquet, day-002.parquet, ...


@dataclass(frozen=True)
class GenerateDaysResult:
    """The daily files of ``generate --days`` and, per day, its events and what first appears in it."""

    directory: Path
    files: tuple[Path, ...]
    events: tuple[int, ...]
    new_users: tuple[int, ...]  # users whose first event is in that day
    new_items: tuple[int, ...]  # items whose first event is in that day
    item_tables: tuple[Path, ...] = ()  # per day, the item table of its new items (_items/day-NNN.parquet)

    def summary(self) -> str:
        lines = [f"generated {sum(self.events)} events as {len(self.files)} daily files -> {self.directory}"]
        for path, events, users, items in zip(self.files, self.events, self.new_users, self.new_items):
            lines.append(f"  {path.name}: {events} events, {users} new users, {items} new items")
        if self.item_tables:
            lines.append(f"item tables of each day's new items -> {self.item_tables[0].parent}")
        return "\n".join(lines)


def run_generate_days(config: JobConfig, directory: str | Path) -> GenerateDaysResult:
    """Write the synthetic log as ``config.generate.days`` daily files into ``directory``
    (:func:`recsys_alibi.data.synthetic.split_days`); each file atomic, temporary files a killed run
    left removed first, and ``day-*.parquet`` files of an earlier run with more days removed.

    Raises:
        DataError: a ``day-*.parquet`` there (or in ``_items/``) that generate did not write (it is never replaced
            nor removed).
    """
    from recsys_alibi.data.synthetic import generate_events, split_days

    cfg = _generate_section(config)
    directory = Path(directory)
    # every file this run replaces or removes must be one generate wrote (never a user's day-001.parquet)
    check_written_by_generate(sorted(directory.glob("day-*.parquet")) + sorted(directory.glob(f"{DAILY_ITEMS_DIR}/day-*.parquet")))
    days = split_days(generate_events(cfg, config.seed), cfg.days, cfg.items, config.seed)
    directory.mkdir(parents=True, exist_ok=True)
    files = tuple(directory / DAY_FILE.format(d + 1) for d in range(len(days)))
    for stale in [p for f in files for p in stale_temps(f)] + sorted(set(directory.glob("day-*.parquet")) - set(files)):
        log.info("generate --days: removing %s (left by an earlier run)", stale)
        stale.unlink()
    seen_users: set[int] = set()
    seen_items: set[int] = set()
    new_users, new_items = [], []
    for path, day in zip(files, days):
        with atomic_path(path) as tmp:
            day.write_parquet(tmp, metadata=GENERATED)
        users, items = set(day.get_column("user_id").to_list()), set(day.get_column("item_id").to_list())
        new_users.append(len(users - seen_users))
        new_items.append(len(items - seen_items))
        seen_users |= users
        seen_items |= items
    tables = write_daily_item_tables(cfg, config.seed, directory, days, [f.name for f in files])
    return GenerateDaysResult(directory, files, tuple(d.height for d in days), tuple(new_users), tuple(new_items),
                              tuple(tables))  # fmt: skip


def run_prepare(config: JobConfig, input_path: str | Path | None, output_dir: str | Path):
    """Events -> cleaned events, vocabulary, sequences, rejects and statistics in ``output_dir``;
    with ``data.append`` the events are merged into the prepared ``output_dir`` instead
    (:func:`recsys_alibi.data.append.append`).

    Raises:
        DataError: no input given, or the input cannot be read, or ``data.item_features`` declared with no
            item table and no ``data.append`` (one line naming the fix); with
            ``data.append``, no prepared directory at ``output_dir`` or other settings than its own.
        OutputPathError: ``output_dir`` is or is inside the input (or ``data.items``), holds it at a name
            it writes, or holds another kind of output (:func:`pipelines.collisions.check_apart`).
    """
    from recsys_alibi.data.ingest import DataError
    from recsys_alibi.data.prepare import prepare

    input_path = input_path or config.data.input
    if input_path is None:
        raise DataError("prepare needs an input: pass --input PATH or set data.input in the config")
    check_apart([Output("--output", Path(output_dir), "prepared")], {"--input": input_path, "data.items": config.data.items})
    if declares_generated_table(config) and not config.data.append:  # the declaration would be ignored
        raise DataError(f"data.item_features declares {', '.join(config.data.item_features.columns)} but prepare has "
                        "no item table: pass --items PATH (generate writes items.parquet beside the events), or "
                        "--set 'data.item_features={}' --set model.item_features.enabled=false")
    fmt = None if config.data.format == "auto" else config.data.format
    if config.data.append:
        from recsys_alibi.data.append import append

        return append(config.data, input_path, output_dir, fmt=fmt)
    return prepare(config.data, input_path, output_dir, fmt=fmt)
