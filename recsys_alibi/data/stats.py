"""Summary figures of a prepared dataset: history-length quantiles, sparsity, the histogram.

Pure functions: they compute values or draw onto a file path they are given; ``prepare``
decides where (and writes atomically).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HISTOGRAM_FILE = "history_length.png"  # beside stats.json in a prepared directory
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)


def history_length_summary(lengths: np.ndarray) -> dict[str, float]:
    """min, p10 .. p99, max and mean of the per-user history lengths."""
    if lengths.size == 0:
        return {}
    out: dict[str, float] = {"min": int(lengths.min())}
    for q in QUANTILES:
        out[f"p{round(q * 100)}"] = float(np.quantile(lengths, q))
    out["max"] = int(lengths.max())
    out["mean"] = float(lengths.mean())
    return out


def sparsity(n_events: int, n_users: int, n_items: int) -> float:
    """``1 - events / (users * items)``, clipped at 0 (re-consumptions can exceed the pairs)."""
    if n_users == 0 or n_items == 0:
        return 1.0
    return max(0.0, 1.0 - n_events / (n_users * n_items))


def plot_history_lengths(lengths: np.ndarray, path: str | Path, title: str = "history length") -> None:
    """Histogram of history lengths on log-spaced bins, written as PNG to ``path``.

    Uses the Agg canvas directly, so no global matplotlib backend is touched.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if lengths.size:
        lo, hi = max(1, int(lengths.min())), max(2, int(lengths.max()) + 1)
        bins = np.unique(np.geomspace(lo, hi, num=40).astype(np.int64))
        if bins.size < 2:
            bins = np.array([lo, hi])
        ax.hist(lengths, bins=bins, color="#4c72b0")
        ax.set_xscale("log")
        median = float(np.median(lengths))
        ax.axvline(median, color="black", linestyle="--", linewidth=1, label=f"median {median:g}")
        ax.legend()
    ax.set_xlabel("events per user")
    ax.set_ylabel("users")
    ax.set_title(f"{title} ({lengths.size:,} users)")
    fig.tight_layout()
    fig.savefig(path, format="png")
