"""Train short, test long on MovieLens-1M: ALiBi trained at L=50, evaluated at longer contexts.

Trains (same data, protocol and budget): ALiBi at max_len 50, SASRec (learned positions) at 50,
and reuses or trains ALiBi at 200; evaluates each with the last L events for L in 50, 100, 200,
400 and the whole history (leave-one-out, full catalog, seen items excluded). Writes ``--output``
(default ``runs/extrapolation/extrapolation-ml1m.json``; the committed figures are in docs/results/) with
the command and the machine, and a PNG beside it.

Usage (from the repository root, after ``recsys-alibi prepare`` of ML-1M):

    .venv/bin/python benchmarks/extrapolation.py --prepared runs/movielens-1m/prepared \
        [--alibi-200-uri runs:/ID/model] [--epochs 6]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pipelines.cli import configure_logging
from pipelines.evaluate import evaluate_scorer, test_examples
from pipelines.train import run_train
from recsys_alibi.atomic import atomic_path, write_text_atomic
from recsys_alibi.config import ALIBI_KEYS, ModelConfig, load_config, with_overrides
from recsys_alibi.data.prepare import read_items, read_sequences
from recsys_alibi.diagnostics.machine import command_line, machine_line
from recsys_alibi.model.scorer import RankerScorer
from recsys_alibi.tracking import load_ranker, setup_tracking

CONTEXTS = [50, 100, 200, 400]


def _train(config, prepared: Path, **model) -> str:
    if model.get("position", config.model.position) != "alibi":  # ALiBi's own keys are refused without it
        model = {**{key: ModelConfig.model_fields[key].default for key in ALIBI_KEYS}, **model}
    trained = run_train(with_overrides(config, model=model), prepared, progress=False, register=False)
    print(f"trained {model}: {trained.summary()}", flush=True)
    return trained.model.uri


def _sweep(config, uri: str, examples, n_items: int, out: Path, name: str) -> dict[str, float | None]:
    model = load_ranker(uri).model
    job = evaluate_scorer(config, RankerScorer(model, name=name), examples, n_items, out / name)
    return {key: (None if m.get("NDCG@10") is None else m["NDCG@10"]) for key, m in job.result.by_context_length.items()}


def plot(result: dict, path: Path) -> None:
    """NDCG@10 against the context length for each model of ``result`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ["50", "100", "200", "400", "full"]
    series = {
        "ALiBi trained at 50": {**result["NDCG@10"], "full": result["NDCG@10"].get("whole")},
        "ALiBi trained at 200": result["trained_at_200_by_context"],
        "SASRec (learned positions) at 50": result["sasrec_50_by_context"],
    }
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for label, values in series.items():
        points = [(i, values.get(k)) for i, k in enumerate(keys) if values.get(k) is not None and (k != "full" or "SASRec" not in label)]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.set_xticks(range(len(keys)), [k if k != "full" else "whole" for k in keys])
    ax.set_xlabel("context length given to the model (last L events)")
    ax.set_ylabel("test NDCG@10")
    ax.set_title("MovieLens-1M: train short, test long")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:  # a run cut short leaves the earlier PNG whole
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepared", type=Path, default=Path("runs/movielens-1m/prepared"))
    parser.add_argument("--config", type=Path, default=Path("configs/movielens-1m-6ep.yaml"))
    parser.add_argument("--alibi-200-uri", help="an ALiBi model trained at max_len 200 on the same data")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--output", type=Path, default=Path("runs/extrapolation/extrapolation-ml1m.json"))
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG from an existing --output JSON")
    args = parser.parse_args(argv)
    png = args.output.with_suffix(".png")
    if args.plot_only:
        plot(json.loads(args.output.read_text()), png)
        return
    configure_logging()
    args.output.parent.mkdir(parents=True, exist_ok=True)  # before the training: a finished run is never lost
    started = time.perf_counter()
    config = load_config(args.config, [f"train.max_epochs={args.epochs}", "output=runs/extrapolation"])
    config = with_overrides(config, evaluate={"context_lengths": CONTEXTS})
    setup_tracking(config.tracking)
    examples = test_examples(config, read_sequences(args.prepared))
    n_items = read_items(args.prepared).height
    out = Path(config.output)

    alibi_50 = _sweep(config, _train(config, args.prepared, max_len=50), examples, n_items, out, "alibi-50")
    sasrec_50 = _sweep(
        config, _train(config, args.prepared, max_len=50, position="learned"), examples, n_items, out, "sasrec-50"
    )
    uri_200 = args.alibi_200_uri or _train(config, args.prepared, max_len=200)
    alibi_200 = _sweep(config, uri_200, examples, n_items, out, "alibi-200")
    result = {
        "train_len": 50,
        "NDCG@10": {key.replace("full", "whole"): value for key, value in alibi_50.items()},
        "sasrec_50": sasrec_50.get("50"),
        "trained_at_200": alibi_200.get("200"),
        "trained_at_200_by_context": alibi_200,
        "sasrec_50_by_context": sasrec_50,
        "epochs": args.epochs,
        "seconds": round(time.perf_counter() - started, 1),
        "command": command_line("benchmarks/extrapolation.py", argv),
        "machine": machine_line(__import__("torch").get_num_threads()),
    }
    write_text_atomic(args.output, json.dumps(result, indent=2))
    plot(result, png)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
