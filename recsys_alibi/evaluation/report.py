"""Evaluation report files: report.json (CONTRACT shape), report.md and PNG plots.

The report changes as a whole: the new output directory is built in a hidden staging folder beside
it (``.NAME.<token>.tmp/NAME``: every report file, plus the directory's other entries, hard-linked or
copied, e.g. the pipeline's ``popularity/`` report), and takes the old directory's place in one swap
(:func:`recsys_alibi.atomic.replace_dir`, as ``score`` swaps its rankings). A reader, or a run killed at
any moment, sees the old report or the new one, never a new ``report.md`` beside an old ``report.json``;
a plot the new report does not have (no context sweep this time, say) is not in the new directory. A
failed write leaves the previous report as it was.

A directory that cannot be swapped (the working directory or a folder holding it, or one whose parent
is not writable) is written file by file instead: staged inside it, then renamed into place with
``report.json`` last.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend chosen first)
from matplotlib.figure import Figure  # noqa: E402

from recsys_alibi.atomic import atomic_path, check_replaceable, json_text, publish_files, replace_dir
from recsys_alibi.evaluation.evaluator import FULL, EvaluationResult  # noqa: E402
from recsys_alibi.staging import staging_dir, target_of  # noqa: E402

__all__ = ["format_metrics_table", "headline_k", "write_report"]

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
CONTEXT_PLOT = "context_length.png"
HISTORY_PLOT = "history_length.png"
REPORT_FILES = (REPORT_JSON, REPORT_MD, CONTEXT_PLOT, HISTORY_PLOT)


def _atomic_write(path: Path, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` on a temporary file next to ``path``, then rename it onto ``path``."""
    with atomic_path(path) as tmp:
        write(str(tmp))
    return path


def _write_text(path: Path, text: str) -> Path:
    return _atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def _write_figure(path: Path, fig: Figure) -> Path:
    try:
        return _atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight"))
    finally:
        plt.close(fig)


def _ks(result: EvaluationResult) -> list[int]:
    if result.ks:
        return list(result.ks)
    return [int(name.split("@")[1]) for name in result.metrics if name.startswith("HR@")]


def headline_k(ks: Sequence[int]) -> int:
    """The K shown in slices and plots: 10 when evaluated, else the middle K."""
    ks = list(ks)
    return 10 if 10 in ks else sorted(ks)[len(ks) // 2]


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def _context_order(keys: Sequence[str]) -> list[str]:
    """Numeric context lengths ascending, then "full"."""
    return sorted(keys, key=lambda k: (k == FULL, int(k) if k != FULL else 0))


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _markdown(results: dict[str, EvaluationResult], title: str) -> str:
    main = next(iter(results.values()))
    names = list(results)
    k = headline_k(_ks(main))
    focus = [f"HR@{k}", f"NDCG@{k}"]
    out = [f"# {title}", ""]
    split = "".join(f" · {name.replace('_', ' ')}: {value}" + (f" ({_utc(value)})" if name == "temporal_cutoff" else "")
                    for name, value in main.split.items())  # fmt: skip
    out.append(f"Protocol: `{main.protocol}` · users: {main.n_users}{split} · full-catalog ranking · ties: {main.ties}")
    out += ["", "## Metrics", ""]
    metric_rows = [[m] + [_fmt(r.metrics.get(m)) for r in results.values()] for m in main.metrics]
    out.append(_md_table(["metric", *names], metric_rows))

    out += ["", f"## By history length ({', '.join(focus)})", ""]
    buckets = list(main.history_bucket_sizes) or list(main.by_history_length)
    header = ["history length", "users"] + [f"{n} {m}" for n in names for m in focus]
    rows = []
    for b in buckets:
        size = main.history_bucket_sizes.get(b)
        cells = [b, "—" if size is None else str(size)]
        for r in results.values():
            cells += [_fmt(r.by_history_length.get(b, {}).get(m)) for m in focus]
        rows.append(cells)
    out.append(_md_table(header, rows))

    keys = _context_order({key for r in results.values() for key in r.by_context_length})
    if keys:
        out += ["", f"## By context length ({', '.join(focus)})", ""]
        out.append("The model sees only the last L events; seen items are still masked from the whole history.")
        out.append("— marks a context longer than the scorer accepts (its max_context).")
        out.append("")
        header = ["context"] + [f"{n} {m}" for n in names for m in focus]
        rows = [
            [key] + [_fmt(r.by_context_length.get(key, {}).get(m)) for r in results.values() for m in focus]
            for key in keys
        ]
        out.append(_md_table(header, rows))

    out += _heavy_section(results, focus) + _paired_section(main, names[0])

    notes = [f"{n}: {note}" for n, r in results.items() for note in r.notes]
    notes += [f"{n}: {r.tied_share:.2%} of users had a target tied with another item" for n, r in results.items()]
    out += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    return "\n".join(out) + "\n"


def _heavy_section(results: dict[str, EvaluationResult], focus: Sequence[str]) -> list[str]:
    """The heavy-user slices (users with at least L events), one row per slice."""
    keys = list(dict.fromkeys(key for r in results.values() for key in r.by_min_history))
    if not keys:
        return []
    header = ["users with"] + [f"{n} {m}" for n in results for m in focus]
    rows = [[f"{key} events"] + [_fmt(r.by_min_history.get(key, {}).get(m)) for r in results.values() for m in focus]
            for key in keys]  # fmt: skip
    return ["", f"## Heavy users ({', '.join(focus)})", "", _md_table(header, rows)]


def _paired_section(main: EvaluationResult, name: str) -> list[str]:
    """Default context against each shorter one, user by user, with bootstrap 95 % intervals."""
    if not main.paired_vs_context:
        return []
    out = ["", f"## {name}: whole history against the last L events (paired, per user)", "",
           "Difference = default context minus last L events, mean over users; 95 % interval: percentile "
           "bootstrap over users (2,000 resamples). An interval that excludes 0 is a gain (or loss) beyond noise.", ""]  # fmt: skip
    rows = []
    for key in _context_order(list(main.paired_vs_context)):
        for label, metrics in main.paired_vs_context[key].items():
            for metric, d in metrics.items():
                ratio = "—" if d.get("ratio") is None else f"{d['ratio']:.2f}x"
                low, high = d["ci95"]
                rows.append([key, label, str(d["n_users"]), metric, _fmt(d["baseline"]), _fmt(d["candidate"]),
                             f"{d['difference']:+.4f} [{low:+.4f}, {high:+.4f}]", ratio])  # fmt: skip
    header = ["L", "users", "n", "metric", "last L", "default", "difference [95 % CI]", "ratio"]
    return [*out, _md_table(header, rows)]


def _context_figure(results: dict[str, EvaluationResult], metric: str) -> Figure | None:
    keys = _context_order({key for r in results.values() for key in r.by_context_length})
    if not keys:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    xs = list(range(len(keys)))
    for name, r in results.items():
        ys = [r.by_context_length.get(key, {}).get(metric) for key in keys]
        ax.plot(xs, [float("nan") if y is None else y for y in ys], marker="o", label=name)
    ax.set_xticks(xs, keys)
    ax.set_xlabel("context length (last L events)")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} vs context length")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=min(len(results), 4), frameon=False)
    return fig


def _history_figure(results: dict[str, EvaluationResult], metric: str) -> Figure | None:
    main = next(iter(results.values()))
    buckets = list(main.history_bucket_sizes) or list(main.by_history_length)
    buckets = [b for b in buckets if any(b in r.by_history_length for r in results.values())]
    if not buckets:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    width = 0.8 / len(results)
    for i, (name, r) in enumerate(results.items()):
        ys = [r.by_history_length.get(b, {}).get(metric, float("nan")) for b in buckets]
        ax.bar([j + (i - (len(results) - 1) / 2) * width for j in range(len(buckets))], ys, width, label=name)
    ax.set_xticks(range(len(buckets)), buckets)
    ax.set_xlabel("history length (events)")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} by history length")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=min(len(results), 4), frameon=False)
    return fig


def _utc(seconds: int) -> str:
    """``2024-06-12 14:20:08 UTC`` for seconds since the epoch."""
    import datetime as dt

    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def write_report(
    result: EvaluationResult,
    output_dir: str | os.PathLike[str],
    *,
    baselines: dict[str, EvaluationResult] | None = None,
    title: str = "Ranking evaluation",
) -> dict[str, Path]:
    """Write report.json, report.md and the plots into ``output_dir`` (created if needed).

    Args:
        result: the evaluated model; report.json holds exactly its ``to_json()``.
        output_dir: destination directory.
        baselines: name -> result shown beside the model in report.md and the plots.
        title: Markdown heading.

    Returns:
        {"json": ..., "markdown": ..., "context_plot": ..., "history_plot": ...}; a plot is left
        out when there is nothing to draw (no sweep, no bucket).
    """
    out_dir = Path(output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {result.scorer or "model": result}
    for name, r in (baselines or {}).items():
        results[name if name not in results else f"{name} (baseline)"] = r
    metric = f"NDCG@{headline_k(_ks(result))}"

    target = Path(os.path.realpath(out_dir))  # a link to a folder: the folder is swapped, the link kept
    if not _swappable(target):
        with staging_dir(out_dir / REPORT_JSON) as staging:  # a killed run's staging removed first, no other's
            staged = _stage(staging, results, result, title, metric)
            publish_files(staging, out_dir, REPORT_FILES, last=REPORT_JSON)  # report.json last
        return {key: out_dir / path.name for key, path in staged.items()}
    for name in REPORT_FILES:  # a report name held by a folder or a device: refused, never dropped with the swap
        check_replaceable(target / name)
    with staging_dir(target) as staging:  # .NAME.<token>.tmp beside it; a killed run's removed first, no other's
        new = staging / target.name
        new.mkdir()
        os.chmod(new, os.stat(target).st_mode & 0o7777)  # the folder keeps its permissions
        staged = _stage(new, results, result, title, metric)
        carry_over(target, new, REPORT_FILES)
        replace_dir(new, target)  # one swap: the old directory ends in the staging folder, removed with it
    return {key: out_dir / path.name for key, path in staged.items()}


def _stage(folder: Path, results: dict[str, EvaluationResult], result: EvaluationResult, title: str,
           metric: str) -> dict[str, Path]:  # fmt: skip
    """Write the report's files into ``folder``; returns them by key (a plot with nothing to draw left out)."""
    staged = {
        "json": _write_text(folder / REPORT_JSON, json_text(result.to_json(), sort_keys=False)),
        "markdown": _write_text(folder / REPORT_MD, _markdown(results, title)),
    }
    fig = _context_figure(results, metric)
    if fig is not None:
        staged["context_plot"] = _write_figure(folder / CONTEXT_PLOT, fig)
    fig = _history_figure(results, metric)
    if fig is not None:
        staged["history_plot"] = _write_figure(folder / HISTORY_PLOT, fig)
    return staged


def _swappable(target: Path) -> bool:
    """Whether ``target`` can be swapped as a whole: not the working directory nor a folder holding it (the
    process would stand in the old one), and its parent writable (the staging folder goes there)."""
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        return False
    return os.access(target.parent, os.W_OK | os.X_OK)


def carry_over(old: Path, new: Path, owned: Sequence[str]) -> list[str]:
    """Put every entry of the directory ``old`` except the ``owned`` names and temporaries (``.NAME.<token>.tmp``
    of a writer, killed or running) into ``new``: files hard-linked (copied where the file system cannot link),
    folders rebuilt the same way, links kept as links. Returns the names carried."""
    carried = []
    if not old.is_dir():
        return carried
    for entry in sorted(os.scandir(old), key=lambda e: e.name):
        if entry.name in owned or target_of(entry.name) is not None:
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), new / entry.name)
        elif entry.is_dir():
            shutil.copytree(entry.path, new / entry.name, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry.path, new / entry.name)
        carried.append(entry.name)
    return carried


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(source, destination)


def format_metrics_table(results: dict[str, EvaluationResult], ks: Sequence[int] | None = None) -> str:
    """Plain-text table for the terminal: one row per scorer, HR@K / NDCG@K per K, then MRR.

    Args:
        results: name -> result.
        ks: cut-offs shown (default: those of the first result).
    """
    if not results:
        return ""
    ks = list(ks) if ks is not None else _ks(next(iter(results.values())))
    columns = [m for k in ks for m in (f"HR@{k}", f"NDCG@{k}")] + ["MRR"]
    rows = [[name] + [_fmt(r.metrics.get(c)) for c in columns] for name, r in results.items()]
    header = ["scorer", *columns]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])
