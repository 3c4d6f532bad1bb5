"""ALiBi numerics experiments behind ``docs/numerics.md``.

Run (from the repository root):

    python -m benchmarks.numerics paths --output runs/numerics          # ~2 min: backends' softmax paths
    python -m benchmarks.numerics probe --output runs/numerics          # the long-range probe runs
    python -m benchmarks.numerics probe --distances 64 --variants fp32,bf16 --output runs/numerics

``paths``: for each backend (eager, sdpa, flex) and dtype (fp32, bf16, fp16), the share of causal
(query, key) pairs whose weight from the ALiBi bias alone is exactly zero, measured with zero
queries/keys and identity values (:func:`recsys_alibi.diagnostics.probe_zero_share`), beside the
prediction of :func:`recsys_alibi.diagnostics.diagnose`. Writes ``paths.json`` and ``paths.md``.

``probe``: the long-range probe of ``recsys_alibi.data.synthetic`` (``item[t] = f(item[t - D])``,
a model must look exactly D events back) through the real job steps (generate -> prepare ->
``fit_ranker`` with :class:`recsys_alibi.training.attention_health.AttentionHealth`), fp32 against
bf16 autocast and bf16 with each mitigation. Per run: HR@10 on the test event over the whole
catalog without excluding seen items (the probe's answer is usually a seen item), the predicted
and the measured zero-weight share, blind heads and mean attention entropy. Writes
``probe.json`` (one record per run, appended as runs finish) and ``probe.md``.

Sizes are chosen for a 2-core CPU shared with other work; every figure in the docs names them.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from recsys_alibi.diagnostics import diagnose, probe_zero_share
from recsys_alibi.model.alibi import alibi_slopes

log = logging.getLogger("benchmarks.numerics")

BACKENDS = ("eager", "sdpa", "flex")
DTYPES = ("float32", "bfloat16", "float16")


# ---------------------------------------------------------------------------------------------
# paths


def run_paths(output: Path, n_heads: int = 8, length: int = 1024, max_bias: float = 8.0) -> list[dict]:
    """Measured against predicted zero share per backend, dtype and head; writes paths.json/.md."""
    slopes = alibi_slopes(n_heads, max_bias)
    records = []
    for dtype in DTYPES:
        report = diagnose(n_heads, length, dtype, max_bias)
        for backend in BACKENDS:
            started = time.perf_counter()
            measured = probe_zero_share(backend, slopes, length, dtype).tolist()
            seconds = time.perf_counter() - started
            predicted = [h.zero_share for h in report.heads[backend]]
            records.append({"dtype": dtype, "backend": backend, "length": length, "measured": measured,
                            "predicted": predicted, "seconds": seconds})  # fmt: skip
            log.info("paths %s %s: %.1f s", dtype, backend, seconds)
        measured_w = probe_zero_share("eager", slopes, length, dtype, weights=True).tolist()
        predicted_w = [h.zero_share for h in report.heads["eager-weights"]]
        records.append({"dtype": dtype, "backend": "eager-weights", "length": length, "measured": measured_w,
                        "predicted": predicted_w, "seconds": 0.0})  # fmt: skip
        records.append({"dtype": dtype, "backend": "exp", "length": length, "measured": None,
                        "predicted": [h.zero_share for h in report.heads["exp"]], "seconds": 0.0})  # fmt: skip
    output.mkdir(parents=True, exist_ok=True)
    (output / "paths.json").write_text(json.dumps(records, indent=2))
    (output / "paths.md").write_text(paths_markdown(records, n_heads, length, max_bias))
    return records


def paths_markdown(records: list[dict], n_heads: int, length: int, max_bias: float) -> str:
    """One table: rows (dtype, path), columns heads 0..3 'measured / predicted' in percent."""
    shown = min(n_heads, 4)
    head = "| dtype | path | " + " | ".join(f"head {h} (m={2 ** (-max_bias * (h + 1) / n_heads):g})"
                                             for h in range(shown)) + " |"  # fmt: skip
    lines = [f"Zero-weight share of causal pairs, L={length}, H={n_heads}, max_bias={max_bias}: "
             "measured / predicted, percent (heads beyond the first {shown} lose nothing at this length)."
             .replace("{shown}", str(shown)), "", head, "|" + "---|" * (shown + 2)]  # fmt: skip
    for r in records:
        cells = []
        for h in range(shown):
            pred = f"{100 * r['predicted'][h]:.1f}"
            cells.append(pred if r["measured"] is None else f"{100 * r['measured'][h]:.1f} / {pred}")
        lines.append(f"| {r['dtype']} | {r['backend']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# probe


@dataclass(frozen=True)
class ProbeSize:
    """Data and training size of the probe at one distance D."""

    distance: int
    max_len: int  # training window and evaluation context, items
    users: int
    items: int
    epochs: int
    batch_size: int


SIZES = {
    64: ProbeSize(64, 96, 200, 100, 6, 16),
    512: ProbeSize(512, 768, 64, 100, 3, 8),
    2048: ProbeSize(2048, 3072, 16, 100, 1, 4),
}

# variant name -> (train.precision, model overrides); values filled from the diagnosis are
# marked with a string: "clamp" -> the path's bias_clamp limit, "window" -> its window,
# "max_bias" -> its smallest non-blind max_bias.
VARIANTS: dict[str, tuple[str, dict]] = {
    "fp32": ("32-true", {}),
    "bf16": ("bf16-mixed", {}),
    "bf16+clamp": ("bf16-mixed", {"bias_clamp": "clamp"}),
    "bf16+max_bias": ("bf16-mixed", {"max_bias": "max_bias"}),
    "bf16+window": ("bf16-mixed", {"window": "window"}),
    "bf16+window+sinks": ("bf16-mixed", {"window": "window", "sinks": 4}),
    "bf16+learnable": ("bf16-mixed", {"learnable_slopes": True}),
}

MODEL = {"d_model": 32, "n_heads": 4, "n_layers": 2, "dropout": 0.0, "attention_backend": "sdpa"}


def _resolve(overrides: dict, n_heads: int, max_len: int, max_bias: float) -> dict:
    """Replace the markers of a variant with values from the bf16 sdpa diagnosis."""
    report = diagnose(n_heads, max_len, "bfloat16", max_bias)
    remedy = report.remedies["sdpa"]
    values = {"clamp": remedy.bias_clamp, "window": remedy.window or max_len, "max_bias": remedy.max_bias}
    return {k: values[v] if isinstance(v, str) else v for k, v in overrides.items()}


def _data(size: ProbeSize, work: Path, seed: int) -> Path:
    """Generate and prepare the probe data once per size; returns the prepared directory."""
    from pipelines.data_steps import run_generate, run_prepare
    from recsys_alibi.config import load_config

    prepared = work / f"data_D{size.distance}" / "prepared"
    if (prepared / "sequences.parquet").exists():
        return prepared
    config = load_config(overrides=[
        f"seed={seed}", f"generate.users={size.users}", f"generate.items={size.items}",
        "generate.task=long-range", f"generate.distance={size.distance}",
        f"generate.min_events={size.max_len + 3}", f"generate.max_events={size.max_len + 40}",
        "data.min_events_per_item=1", "data.min_events_per_user=5",
    ])  # fmt: skip
    events = prepared.parent / "events.parquet"
    run_generate(config, events)
    run_prepare(config, events, prepared)
    return prepared


def _test_hr10(model, prepared: Path, max_len: int) -> float:
    """HR@10 of the test event over the whole catalog, seen items NOT excluded, last max_len items."""
    from recsys_alibi.data.loader import pad_right
    from recsys_alibi.data.prepare import read_sequences
    from recsys_alibi.data.splits import leave_one_out
    from recsys_alibi.evaluation.metrics import hit_rate_at_k
    from recsys_alibi.evaluation.ranking import target_ranks

    test = leave_one_out(read_sequences(prepared), "test")
    histories = [np.asarray(h[-max_len:], dtype=np.int64) for h in test.get_column("history").to_list()]
    targets = torch.tensor([t[0] for t in test.get_column("targets").to_list()])
    ranks = []
    model.eval()
    with torch.no_grad():
        for b0 in range(0, len(histories), 16):
            x, lengths = pad_right(histories[b0 : b0 + 16])
            scores = model.score(x, lengths)  # (B, N + 1)
            scores[:, 0] = float("-inf")  # padding is never ranked
            ranks.append(target_ranks(scores, targets[b0 : b0 + 16]))
    return hit_rate_at_k(torch.cat(ranks).numpy(), 10)


def run_probe_one(size: ProbeSize, variant: str, work: Path, seed: int = 7) -> dict:
    """One training run of the probe; returns its record."""
    from recsys_alibi.config import load_config
    from recsys_alibi.training.attention_health import AttentionHealth
    from recsys_alibi.training.datamodule import SequenceDataModule
    from recsys_alibi.training.fit import fit_ranker

    precision, marked = VARIANTS[variant]
    model_over = {**MODEL, "max_len": size.max_len}
    model_over.update(_resolve(marked, MODEL["n_heads"], size.max_len, 8.0))
    overrides = [f"seed={seed}", f"output={work / 'runs'}"]
    overrides += [f"model.{k}={v}" for k, v in model_over.items()]
    overrides += [
        f"train.max_epochs={size.epochs}", f"train.batch_size={size.batch_size}", "train.lr=0.003",
        "train.warmup_steps=10", f"train.patience={size.epochs}", f"train.precision={precision}",
        "train.val_batch_size=32", "train.accelerator=cpu",
    ]  # fmt: skip
    config = load_config(overrides=overrides)
    prepared = _data(size, work, seed)
    datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
    health = AttentionHealth(zero_share_threshold=0.05, max_rows=8)
    ckpt = work / "ckpt" / f"D{size.distance}_{variant}"
    fit = fit_ranker(config, datamodule, ckpt, callbacks=[health], progress=False)
    model = fit.module.model
    cfg = model.cfg
    dtype = "bfloat16" if precision.startswith("bf16") else "float32"
    with torch.no_grad():
        slopes = model.slopes().detach().double()
    report = diagnose(cfg.n_heads, size.max_len, dtype, cfg.max_bias, slopes if cfg.learnable_slopes else None,
                      bias_clamp=cfg.bias_clamp, window=cfg.window, sinks=cfg.sinks)  # fmt: skip
    predicted = [h.zero_share for h in report.heads["eager-weights"]]  # AttentionHealth reads eager weights
    measured = {k: v for k, v in health.last.items()}
    zero = [[measured[f"attn/l{l}_h{h}_zero_share"] for h in range(cfg.n_heads)] for l in range(cfg.n_layers)]
    ent = [[measured[f"attn/l{l}_h{h}_entropy"] for h in range(cfg.n_heads)] for l in range(cfg.n_layers)]
    record = {
        "distance": size.distance, "variant": variant, "precision": precision, "max_len": size.max_len,
        "users": size.users, "items": size.items, "epochs": fit.epochs, "batch_size": size.batch_size,
        "model": {k: getattr(cfg, k) for k in ("d_model", "n_heads", "n_layers", "max_bias", "bias_clamp",
                                               "window", "sinks", "learnable_slopes")},
        "slopes": slopes.tolist(),
        "hr_at_10": _test_hr10(model, prepared, size.max_len), "chance_hr_at_10": 10 / datamodule.n_items,
        "val_ndcg_at_10_seen_excluded": fit.best_val_ndcg_at_10,
        "predicted_zero_share": predicted, "predicted_blind_heads": sum(p > 0 for p in predicted),
        "measured_zero_share": zero, "measured_blind_heads": [sum(z > 0 for z in layer) for layer in zero],
        "entropy": ent, "mean_entropy": float(np.mean(ent)), "train_seconds": fit.train_seconds,
    }  # fmt: skip
    return record


def _setting(model: dict) -> str:
    """The mitigation settings of a run that differ from the default model."""
    parts = [f"max_bias={model['max_bias']:g}"] if model["max_bias"] != 8.0 else []
    parts += [f"{k}={model[k]:g}" for k in ("bias_clamp", "window") if model[k] is not None]
    parts += ["sinks=%d" % model["sinks"]] if model["sinks"] else []
    parts += ["learnable slopes"] if model["learnable_slopes"] else []
    return ", ".join(parts) or "default"


def probe_markdown(records: list[dict]) -> str:
    """The probe table: one row per run."""
    lines = [
        "| D | L | variant | setting | HR@10 (chance) | blind heads pred. / meas. (l0, l1) | zero share "
        "pred. / meas. (mean over heads, l0, l1) | mean entropy (nats) | train s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        pred = float(np.mean(r["predicted_zero_share"]))
        meas = ", ".join(f"{100 * float(np.mean(layer)):.1f}" for layer in r["measured_zero_share"])
        blind = ", ".join(str(b) for b in r["measured_blind_heads"])
        lines.append(
            f"| {r['distance']} | {r['max_len']} | {r['variant']} | {_setting(r['model'])} "
            f"| {r['hr_at_10']:.3f} ({r['chance_hr_at_10']:.2f}) | {r['predicted_blind_heads']} / {blind} | {100 * pred:.1f} / {meas} | {r['mean_entropy']:.2f} "
            f"| {r['train_seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def run_probe(output: Path, distances: Sequence[int], variants: Sequence[str]) -> list[dict]:
    """Every (distance, variant) run; records are appended to probe.json as they finish."""
    output.mkdir(parents=True, exist_ok=True)
    path = output / "probe.json"
    records = json.loads(path.read_text()) if path.exists() else []
    done = {(r["distance"], r["variant"]) for r in records}
    for distance in distances:
        for variant in variants:
            if (distance, variant) in done:
                continue
            started = time.perf_counter()
            record = run_probe_one(SIZES[distance], variant, output)
            record["wall_seconds"] = time.perf_counter() - started
            records.append(record)
            path.write_text(json.dumps(records, indent=2))
            (output / "probe.md").write_text(probe_markdown(records))
            log.info("probe D=%d %s: HR@10 %.3f, %.0f s", distance, variant, record["hr_at_10"],
                     record["wall_seconds"])  # fmt: skip
    return records


def main(argv: Sequence[str] | None = None) -> int:
    """``paths`` or ``probe`` (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.numerics", description=__doc__.splitlines()[0])
    parser.add_argument("section", choices=["paths", "probe"])
    parser.add_argument("--output", type=Path, default=Path("runs/numerics"))
    parser.add_argument("--distances", default="64,512,2048")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for noisy in ("lightning", "lightning.pytorch", "lightning.fabric", "torch.fx", "torch._dynamo"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r".*(LeafSpec|litlogger|is_fx_tracing|noload|distutils).*")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.section == "paths":
        run_paths(args.output)
        print((args.output / "paths.md").read_text())
    else:
        unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
        if unknown:
            parser.error(f"unknown variants {unknown}; use {', '.join(VARIANTS)}")
        run_probe(args.output, [int(d) for d in args.distances.split(",")], args.variants.split(","))
        print((args.output / "probe.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
