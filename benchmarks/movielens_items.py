"""MovieLens item tables for ``prepare --items`` (issue 44): genres (a list) and the release year per movie.

    python benchmarks/movielens_items.py --dataset ml-100k --output runs/items-ml100k.parquet
    python benchmarks/movielens_items.py --dataset ml-1m --output runs/items-ml1m.parquet

Read from ``--data`` (default ``../shared/data`` beside the checkout; never copied into the repository): ML-100K ``u.item`` (``|``-separated:
id, title, release date ``01-Jan-1995``, video date, URL, then 19 genre flags named by ``u.genre``)
and ML-1M ``movies.dat`` (``id::Title (1995)::Genre|Genre``). Keyed by the raw movie id, the
``item_id`` of ``u.data`` and ``ratings.dat``; declare the columns with
``--set data.items=<table> --set data.item_features.categorical=[genres] --set data.item_features.numeric=[year]``.
A movie without a year (ML-100K's "unknown" entry) has a null ``year``; one without a genre flag an
empty list.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import polars as pl

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SCHEMA = {"item_id": pl.Int64, "genres": pl.List(pl.String), "year": pl.Float64}
YEAR = re.compile(r"\((\d{4})\)\s*$")  # the year at the end of an ML-1M title


def ml100k_items(folder: Path) -> pl.DataFrame:
    """``item_id``, ``genres`` (list of u.genre names whose flag is 1), ``year`` (of the release date) of u.item."""
    names = [line.split("|")[0] for line in (folder / "u.genre").read_text(encoding="latin-1").splitlines() if line]
    rows = []
    for line in (folder / "u.item").read_bytes().decode("latin-1").splitlines():
        fields = line.split("|")
        flags = fields[5 : 5 + len(names)]
        date = fields[2].strip()
        rows.append((int(fields[0]), [g for g, f in zip(names, flags) if f == "1"], float(date[-4:]) if date else None))
    return pl.DataFrame(rows, schema=SCHEMA, orient="row").sort("item_id")


def ml1m_items(folder: Path) -> pl.DataFrame:
    """``item_id``, ``genres`` (list), ``year`` (from the title) of movies.dat."""
    rows = []
    for line in (folder / "movies.dat").read_bytes().decode("latin-1").splitlines():
        movie, title, genres = line.split("::")
        found = YEAR.search(title)
        rows.append((int(movie), genres.split("|"), float(found.group(1)) if found else None))
    return pl.DataFrame(rows, schema=SCHEMA, orient="row").sort("item_id")


READERS = {"ml-100k": ml100k_items, "ml-1m": ml1m_items}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=sorted(READERS), required=True)
    parser.add_argument("--data", type=Path, default=DATA, help="the folder holding ml-100k/ and ml-1m/")
    parser.add_argument("--output", type=Path, required=True, help="Parquet path")
    args = parser.parse_args(argv)
    from recsys_alibi.atomic import atomic_path

    needed = {"ml-100k": ("u.item", "u.genre"), "ml-1m": ("movies.dat",)}[args.dataset]
    missing = [name for name in needed if not (args.data / args.dataset / name).is_file()]
    if missing:
        parser.error(f"--data {args.data}: no {', '.join(missing)} in {args.data / args.dataset}; "
                     "give the folder holding ml-100k/ and ml-1m/ (the shared data's folder)")  # fmt: skip
    table = READERS[args.dataset](args.data / args.dataset)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(args.output) as tmp:
        table.write_parquet(tmp)
    print(f"wrote {args.output}: {table.height} items, {table['year'].null_count()} without a year")


if __name__ == "__main__":
    main()
