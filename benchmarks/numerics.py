"""ALiBi numerics experiments behind ``docs/numerics.md``.

Run (from the repository root):

    python -m benchmarks.numerics paths --output runs/numerics          # ~2 min: backends' softmax paths
    python -m benchmarks.numerics probe --output runs/numerics --json runs/numerics/numerics-probe.json
    python -m benchmarks.numerics probe --settings default,steep --precisions fp32 --output runs/numerics

``paths``: for each backend (eager, sdpa, flex) and dtype (fp32, bf16, fp16), the share of causal
(query, key) pairs whose weight from the ALiBi bias alone is exactly zero, measured with zero
queries/keys and identity values (:func:`recsys_alibi.diagnostics.probe_zero_share`), beside the
prediction of :func:`recsys_alibi.diagnostics.diagnose`. Writes ``paths.json`` and ``paths.md``.

``probe``: the cue/answer probe of ``recsys_alibi.data.synthetic`` (task ``long-range``: the test
answer is ``f`` of the cue exactly D events back, and only that cue tells which of 50 answers it
is). Each setting (default slopes, a steep scheme, the steep scheme with each mitigation) is
trained once through the real job steps (generate -> prepare -> ``fit_ranker`` with
:class:`recsys_alibi.training.attention_health.AttentionHealth`) on a log with D = 16, then its
held-out test answers are scored on logs with D = 16, 64, 512 and 2048 (context: the last D + 10
events), in fp32, in bf16 autocast, and fp32-trained weights under bf16 autocast. Per (D, run):
HR@10 over the whole catalog without excluding seen items, the attention weight on the cue,
the attention health (:func:`recsys_alibi.training.attention_health.health_metrics`, what the
callback logs) on a fixed batch of 4 test histories, and the zero share predicted by
:func:`recsys_alibi.diagnostics.diagnose`. Writes ``probe.json`` (or ``--json``) and ``probe.md``
as runs finish; runs already in the JSON are skipped, trained models under ``--output`` reused.

Sizes are chosen for a 2-core CPU shared with other work; every figure in the docs names them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch

from recsys_alibi.atomic import write_text_atomic
from recsys_alibi.data.synthetic import EPISODE_GAP
from recsys_alibi.diagnostics import diagnose, probe_zero_share
from recsys_alibi.diagnostics.machine import command_line, machine_line
from recsys_alibi.model.alibi import alibi_slopes

log = logging.getLogger("benchmarks.numerics")

BACKENDS = ("eager", "sdpa", "flex")
DTYPES = ("float32", "bfloat16", "float16")


# ---------------------------------------------------------------------------------------------
# paths


def run_paths(output: Path, n_heads: int = 8, length: int = 1024, max_bias: float = 8.0,
              command: str | None = None) -> list[dict]:
    """Measured against predicted zero share per backend, dtype and head; writes paths.json/.md (each record
    with ``command`` and the ``machine``: what flushes to zero follows the CPU)."""
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
    machine = machine_line(torch.get_num_threads())  # reads /proc/cpuinfo: once, not per record
    for r in records:
        r.update(command=command, machine=machine)
    output.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output / "paths.json", json.dumps(records, indent=2))
    write_text_atomic(output / "paths.md", paths_markdown(records, n_heads, length, max_bias))
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

TRAIN_DISTANCE = 16  # cue-to-answer distance of the training log (train short, score long)
EVAL_DISTANCES = (16, 64, 512, 2048)
CONTEXT_EXTRA = EPISODE_GAP + 2  # scoring context: the last D + 10 events, as far back as a training query sees
ITEMS = 301  # 1 trigger, 1 + 1 cue/answer of kind a, 50 + 50 of kind b, 198 fillers
TRAIN_USERS = 1024
TRAIN_EPISODES = 1  # whole episodes per training window
EVAL_USERS = 256
HEALTH_ROWS = 4  # fixed batch for the attention health at each scoring length
THRESHOLD = 0.05  # a head is blind when more than this share of its visible weights is exactly zero
STEEP_MAX_BIAS = 4.0  # H = 4: slopes 1/2, 1/4, 1/8, 1/16 (the default max_bias 8 gives 1/4, 1/16, 1/64, 1/256)

MODEL = {"d_model": 64, "n_heads": 4, "n_layers": 1, "dropout": 0.0, "attention_backend": "sdpa"}
TRAIN = {"lr": 0.01, "warmup_steps": 20, "weight_decay": 0.0, "batch_size": 32, "max_epochs": 30,
         "val_batch_size": 64, "val_users": 256, "accelerator": "cpu"}  # fmt: skip
# precision -> (Lightning training precision, scoring dtype); "fp32>bf16" scores the fp32-trained
# weights under bf16 autocast (same weights: the difference is the numerics of scoring alone)
PRECISIONS = {"fp32": ("32-true", "float32"), "bf16": ("bf16-mixed", "bfloat16"), "fp32>bf16": ("32-true", "bfloat16")}
DATA_SEED = 7  # the logs (and so the catalog roles); the training seed varies separately


@dataclass(frozen=True)
class Setting:
    """A model setting of the probe: overrides used in training, and overrides added for scoring.

    String values are filled from the diagnosis of the steep scheme (``STEEP_MAX_BIAS``) for the
    run's dtype at the longest scoring context along the sdpa path (the training path):
    ``"clamp"`` -> its ``bias_clamp`` limit, ``"max_bias"`` -> its smallest ``max_bias`` with no
    blind head, ``"window"`` -> its window. ``score`` holds settings that change nothing at the
    training length (a window longer than the training window, a clamp above the largest bias
    there; checked), so they are applied to the weights trained without them: training with
    them would give the same weights.
    """

    train: dict
    score: dict


SETTINGS: dict[str, Setting] = {
    "default": Setting({}, {}),
    "steep": Setting({"max_bias": STEEP_MAX_BIAS}, {}),
    "steep+clamp": Setting({"max_bias": STEEP_MAX_BIAS}, {"bias_clamp": "clamp"}),
    "steep+clamp8": Setting({"max_bias": STEEP_MAX_BIAS, "bias_clamp": 8.0}, {}),
    "steep+max_bias": Setting({"max_bias": "max_bias"}, {}),
    "steep+learnable": Setting({"max_bias": STEEP_MAX_BIAS, "learnable_slopes": True}, {}),
    "steep+window": Setting({"max_bias": STEEP_MAX_BIAS}, {"window": "window"}),
    "steep+window+sinks": Setting({"max_bias": STEEP_MAX_BIAS}, {"window": "window", "sinks": 4}),
    # heads that can see far (recsys_alibi.model.alibi): zero-slope heads, a context-wide scheme, slopes that may reach 0
    "free1": Setting({"free_heads": 1}, {}),
    "free2": Setting({"free_heads": 2}, {}),
    "free3": Setting({"free_heads": 3}, {}),  # one position-biased (local) head, three content-only
    "free4": Setting({"free_heads": 4}, {}),  # every head content-only: no position bias at all (NoPE)
    # three content-only heads beside one steep local head (slope 1/2: 7.5 nats at D = 16), so that only
    # the content-only heads can carry the cue in training
    "steep+free3": Setting({"max_bias": STEEP_MAX_BIAS, "free_heads": 3}, {}),
    # the same with the free heads' scores x log(n) / log(max_len) past the training length (model.free_head_scale):
    # trained exactly as steep+free3, their softmax does not flatten as the context grows
    "steep+free3+logb": Setting({"max_bias": STEEP_MAX_BIAS, "free_heads": 3, "free_head_scale": "log_beyond"}, {}),
    "wide": Setting({"slopes": "wide", "long_context": max(EVAL_DISTANCES) + CONTEXT_EXTRA}, {}),
    "learnable-zero": Setting({"learnable_slopes": True, "slope_floor": "zero"}, {}),
    # the wide scheme spread to twice the longest scoring context: its flattest head discounts D = 2048 by 1/2 nat
    "wide2x": Setting({"slopes": "wide", "long_context": 2 * (max(EVAL_DISTANCES) + CONTEXT_EXTRA)}, {}),
    "wide+free1": Setting({"slopes": "wide", "long_context": max(EVAL_DISTANCES) + CONTEXT_EXTRA, "free_heads": 1}, {}),
}
HEAD_SETTINGS = ("free1", "free2", "free3", "free4", "steep+free3", "steep+free3+logb", "wide", "learnable-zero", "wide2x", "wide+free1")

# the runs of docs/numerics.md: (precision, setting, training seed); each is scored at every EVAL_DISTANCES
KEY_SETTINGS = ("default", "steep", "steep+clamp", "steep+clamp8", "steep+max_bias")  # also in bf16
PLAN: tuple[tuple[str, str, int], ...] = tuple(
    [("fp32", s, 7) for s in SETTINGS]
    + [("fp32>bf16", s, 7) for s in KEY_SETTINGS]
    + [("bf16", s, 7) for s in KEY_SETTINGS]
    + [("fp32", "default", seed) for seed in (8, 9)]  # which heads carry the cue varies between runs
    + [(p, s, 7) for p in ("fp32", "bf16") for s in HEAD_SETTINGS]
    + [("bf16", "free2", 8)]  # a second bf16 training run of the free heads
)


def train_len(distance: int = TRAIN_DISTANCE) -> int:
    """Training window (``model.max_len``): ``2 D + 16 + (TRAIN_EPISODES - 1) P`` holds the cues and
    answers of ``TRAIN_EPISODES`` whole episodes and, before them, the trigger and answers of one
    more, as a scoring context does (``P = D + EPISODE_GAP``, the episode period)."""
    return 2 * distance + 2 * EPISODE_GAP + (TRAIN_EPISODES - 1) * (distance + EPISODE_GAP)


def _resolve(values: dict, dtype: str) -> dict:
    """Replace the markers of a setting with values from the diagnosis of the steep scheme."""
    longest = max(EVAL_DISTANCES) + CONTEXT_EXTRA
    remedy = diagnose(MODEL["n_heads"], longest, dtype, STEEP_MAX_BIAS).remedies["sdpa"]
    fill = {"clamp": remedy.bias_clamp, "window": remedy.window or longest, "max_bias": remedy.max_bias}
    return {k: fill[v] if isinstance(v, str) and v in fill else v for k, v in values.items()}


def _check_score_only(score: dict, slopes: list[float]) -> None:
    """Refuse a scoring-only setting that would change training at ``train_len()``."""
    length = train_len()
    if score.get("window") is not None and score["window"] < length:
        raise ValueError(f"window {score['window']} < training window {length}: train with it instead")
    if score.get("bias_clamp") is not None and score["bias_clamp"] < max(slopes) * (length - 1):
        raise ValueError(f"bias_clamp {score['bias_clamp']} changes the bias at training length: train with it")


def _data(distance: int, users: int, length: int, work: Path, seed: int) -> Path:
    """Generate and prepare one probe log (histories of exactly ``length`` events); returns the prepared dir."""
    from pipelines.data_steps import run_generate, run_prepare
    from recsys_alibi.config import load_config

    prepared = work / f"data_D{distance}_U{users}_L{length}" / "prepared"
    if (prepared / "sequences.parquet").exists():
        return prepared
    config = load_config(overrides=[
        f"seed={seed}", f"generate.users={users}", f"generate.items={ITEMS}", "generate.task=long-range",
        f"generate.distance={distance}", f"generate.min_events={length}", f"generate.max_events={length}",
        "data.min_events_per_item=1", "data.min_events_per_user=5",
    ])  # fmt: skip
    events = prepared.parent / "events.parquet"
    run_generate(config, events)
    run_prepare(config, events, prepared)
    return prepared


def _test_examples(prepared: Path, train_prepared: Path, context: int) -> tuple[list[np.ndarray], torch.Tensor]:
    """Test histories (last ``context`` events) and targets of a prepared log, in the training vocabulary.

    Returns:
        histories: per user (<= context,) int64 item indices of ``train_prepared``; targets (U,) int64.
    """
    from recsys_alibi.data.prepare import read_items, read_sequences
    from recsys_alibi.data.splits import leave_one_out

    def id_of_idx(items) -> np.ndarray:  # item_idx -> item_id
        table = np.zeros(items.height + 1, dtype=np.int64)
        table[items.get_column("item_idx").to_numpy()] = items.get_column("item_id").to_numpy()
        return table

    ids = id_of_idx(read_items(prepared))
    train_ids = id_of_idx(read_items(train_prepared))
    to_train = np.zeros(max(ids.max(), train_ids.max()) + 1, dtype=np.int64)
    to_train[train_ids[1:]] = np.arange(1, train_ids.shape[0])
    if (to_train[ids[1:]] == 0).any():
        raise ValueError(f"{prepared}: items that the training log never shows")
    test = leave_one_out(read_sequences(prepared), "test")
    histories = [to_train[ids[np.asarray(h[-context:], dtype=np.int64)]] for h in test.get_column("history").to_list()]
    targets = torch.from_numpy(to_train[ids[np.asarray([t[0] for t in test.get_column("targets").to_list()])]])
    return histories, targets


def _score_at(model, histories: list[np.ndarray], targets: torch.Tensor, distance: int, dtype: str) -> dict:
    """HR@10, attention health and the attention on the cue of the test answer, under the run's autocast.

    HR@10: the test event ranked over the whole catalog, seen items NOT excluded (earlier episodes
    may have shown the answer). Health: :func:`health_metrics` (what ``AttentionHealth`` logs) on
    the first ``HEALTH_ROWS`` histories. Cue weight: per head, the eager weight of the last query on
    the key ``D - 1`` back (the cue of the test answer), mean over those rows.
    """
    from recsys_alibi.data.loader import pad_right
    from recsys_alibi.evaluation.metrics import hit_rate_at_k
    from recsys_alibi.evaluation.ranking import target_ranks
    from recsys_alibi.training.attention_health import health_metrics

    model.eval()
    ranks = []
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    with torch.no_grad(), autocast:
        for b0 in range(0, len(histories), 16):
            x, lengths = pad_right(histories[b0 : b0 + 16])
            scores = model.score(x, lengths).float()  # (B, N + 1)
            scores[:, 0] = float("-inf")  # padding is never ranked
            ranks.append(target_ranks(scores, targets[b0 : b0 + 16]))
        x, lengths = pad_right(histories[:HEALTH_ROWS])
        weights = model.attention_weights(x, lengths)  # per layer (B, H, L, L)
    health = health_metrics(weights, lengths, model.cfg.window, model.cfg.sinks)
    rows = torch.arange(x.shape[0])
    cue = weights[0][rows, :, lengths - 1, lengths - distance].float().mean(0)  # (H,) last query on the cue
    return {"hr_at_10": hit_rate_at_k(torch.cat(ranks).numpy(), 10), "health": health, "cue_weight": cue.tolist()}


class _FinalWeights(L.Callback):
    """Save the model's final state dict at the end of training (``fit_ranker`` keeps the best)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.save(pl_module.model.state_dict(), self.path)


def _train(setting: str, precision_name: str, work: Path, seed: int) -> tuple[dict, object, dict]:
    """Train (or reload) the model of a setting with training seed ``seed``.

    Returns:
        (training model overrides, the model with its final weights, training facts). A model
        already trained with the same precision, model overrides and seed under ``work`` is reused.
    """
    from recsys_alibi.config import load_config
    from recsys_alibi.data.prepare import read_items
    from recsys_alibi.model.transformer import AlibiRanker
    from recsys_alibi.training.attention_health import AttentionHealth
    from recsys_alibi.training.datamodule import SequenceDataModule
    from recsys_alibi.training.fit import fit_ranker

    precision, _ = PRECISIONS[precision_name]
    dtype = "bfloat16" if precision.startswith("bf16") else "float32"
    train_over = {**MODEL, "max_len": train_len(), **_resolve(SETTINGS[setting].train, dtype)}
    overrides = [f"seed={seed}", f"output={work / 'runs'}", "evaluate.exclude_seen=false"]
    overrides += [f"model.{k}={v}" for k, v in train_over.items()]
    overrides += [f"train.{k}={v}" for k, v in TRAIN.items()]
    overrides += [f"train.patience={TRAIN['max_epochs']}", f"train.precision={precision}"]
    config = load_config(overrides=overrides)
    prepared = _data(TRAIN_DISTANCE, TRAIN_USERS, train_len() + 3, work, DATA_SEED)
    key = "_".join(f"{k}={v}" for k, v in sorted(train_over.items()) if k not in MODEL)  # same training -> reuse
    ckpt = work / "ckpt" / f"{precision}_seed{seed}_{key}"
    final, facts_path = ckpt / "final_weights.pt", ckpt / "facts.json"
    if not (final.exists() and facts_path.exists()):
        datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
        callbacks = [AttentionHealth(THRESHOLD, max_rows=HEALTH_ROWS), _FinalWeights(final)]
        fit = fit_ranker(config, datamodule, ckpt, callbacks=callbacks, progress=False)
        write_text_atomic(facts_path, json.dumps({"train_seconds": fit.train_seconds, "epochs": fit.epochs,
                                                  "best_val_ndcg_at_10": fit.best_val_ndcg_at_10}))  # fmt: skip
    facts = json.loads(facts_path.read_text())
    # the final weights, not the best validation epoch: the validation target (the one answer of
    # kind a) is learnt within an epoch, so the validation NDCG cannot tell later epochs apart
    model = AlibiRanker(config.model, read_items(prepared).height)
    model.load_state_dict(torch.load(final, map_location="cpu"))
    return train_over, model, facts


def run_probe_one(setting: str, precision_name: str, work: Path, seed: int = 7) -> list[dict]:
    """Train one setting at ``TRAIN_DISTANCE`` and score it at every distance of ``EVAL_DISTANCES``.

    Args:
        setting: a key of ``SETTINGS``. precision_name: a key of ``PRECISIONS``.
        work: directory for the logs, checkpoints and runs. seed: the training seed.

    Returns:
        One record (a JSON-able dict) per scoring distance.
    """
    from recsys_alibi.config import ModelConfig
    from recsys_alibi.data.synthetic import long_range_catalog
    from recsys_alibi.model.transformer import AlibiRanker

    precision, dtype = PRECISIONS[precision_name]
    train_over, trained, facts = _train(setting, precision_name, work, seed)
    with torch.no_grad():
        slopes = trained.slopes().detach().double()
    score_over = _resolve(SETTINGS[setting].score, dtype)
    _check_score_only(score_over, slopes.tolist())
    train_prepared = _data(TRAIN_DISTANCE, TRAIN_USERS, train_len() + 3, work, DATA_SEED)
    records = []
    for distance in EVAL_DISTANCES:
        context = distance + CONTEXT_EXTRA
        cfg = ModelConfig(**{**train_over, **score_over})
        model = AlibiRanker(cfg, trained.n_items)
        model.load_state_dict(trained.state_dict())
        if distance == TRAIN_DISTANCE:  # the training log's own held-out test events
            prepared = train_prepared
        else:
            prepared = _data(distance, EVAL_USERS, 2 * distance + EPISODE_GAP + 2, work, DATA_SEED)
        histories, targets = _test_examples(prepared, train_prepared, context)
        histories, targets = histories[:EVAL_USERS], targets[:EVAL_USERS]
        started = time.perf_counter()
        scored = _score_at(model, histories, targets, distance, dtype)
        report = diagnose(cfg.n_heads, context, dtype, cfg.max_bias, slopes, bias_clamp=cfg.bias_clamp,
                          window=cfg.window, sinks=cfg.sinks)  # fmt: skip
        health = scored["health"]
        zero = [health[f"attn/l0_h{h}_zero_share"] for h in range(cfg.n_heads)]
        records.append({
            "distance": distance, "context": context, "setting": setting, "run": precision_name, "seed": seed,
            "dtype": dtype, "precision": precision, "train_distance": TRAIN_DISTANCE, "train_len": train_len(),
            "train_users": TRAIN_USERS, "eval_users": len(histories), "items": trained.n_items,
            "model": {k: getattr(cfg, k) for k in ("d_model", "n_heads", "n_layers", "max_bias", "bias_clamp",
                                                   "window", "sinks", "learnable_slopes", "slopes", "long_context",
                                                   "free_heads", "slope_floor", "free_head_scale")},
            "scoring_only": sorted(score_over), "slopes": slopes.tolist(),
            "cue_bias": [-m * (distance - 1) for m in slopes.tolist()],
            "hr_at_10": scored["hr_at_10"], "chance_hr_at_10": 10 / trained.n_items,
            "kind_aware_hr_at_10": 10 / len(long_range_catalog(ITEMS, DATA_SEED).cues_b),
            "cue_weight": scored["cue_weight"],
            "predicted_zero_share": [h.zero_share for h in report.heads["eager-weights"]],
            "measured_zero_share": zero, "blind_head_share": float(np.mean([z > THRESHOLD for z in zero])),
            "entropy": [health[f"attn/l0_h{h}_entropy"] for h in range(cfg.n_heads)],
            "mean_entropy": float(np.mean([health[f"attn/l0_h{h}_entropy"] for h in range(cfg.n_heads)])),
            "score_seconds": time.perf_counter() - started, **facts,
        })  # fmt: skip
        log.info("probe %s %s seed %d D=%d: HR@10 %.3f, cue weight %s", precision_name, setting, seed, distance,
                 scored["hr_at_10"], [round(w, 4) for w in scored["cue_weight"]])  # fmt: skip
    return records


def _setting(r: dict) -> str:
    """The settings of a run that differ from the default model; scoring-only ones marked with *."""
    model, star = r["model"], set(r["scoring_only"])
    parts = [f"max_bias={model['max_bias']:.3g}"] if model["max_bias"] != 8.0 else []
    parts += [f"{k}={model[k]:.4g}" + "*" * (k in star) for k in ("bias_clamp", "window") if model[k] is not None]
    parts += [f"sinks={model['sinks']}*"] if model["sinks"] else []
    parts += [f"slopes={model['slopes']} to 1/{model['long_context']}"] if model.get("slopes", "geometric") != "geometric" else []
    parts += [f"free_heads={model['free_heads']}"] if model.get("free_heads") else []
    scale = model.get("free_head_scale", "none")
    # log_length (log n / log max_len at every n) was screened twice and removed; its records stay in the JSON
    parts += [f"free_head_scale={scale}" + (" (removed)" if scale == "log_length" else "")] if scale != "none" else []
    floor = " (may reach 0)" if model.get("slope_floor") == "zero" else ""
    parts += [f"learnable slopes{floor}"] if model["learnable_slopes"] else []
    return ", ".join(parts) or "max_bias=8"


def probe_markdown(records: list[dict]) -> str:
    """The probe table: one row per (distance, dtype, setting), sorted by distance."""
    lines = [
        (
            "| D | dtype (train → score) | setting | slopes | bias at cue (nats) | HR@10 | chance (uniform / kind) "
            "| cue weight | blind heads | zero share % pred. / meas. | mean entropy (nats) |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {name: i for i, name in enumerate(SETTINGS)}
    runs = {name: i for i, name in enumerate(PRECISIONS)}
    for r in sorted(records, key=lambda r: (r["distance"], runs[r["run"]], order.get(r["setting"], len(order)), r["seed"])):
        pred = 100 * float(np.mean(r["predicted_zero_share"]))
        meas = 100 * float(np.mean(r["measured_zero_share"]))
        slopes = ", ".join(f"{m:.3g}" for m in r["slopes"])
        bias = ", ".join(f"{-b:.0f}" if -b >= 10 else f"{-b:.2g}" for b in r["cue_bias"])
        cue = ", ".join(f"{w:.2g}" for w in r["cue_weight"])
        seed = f", seed {r['seed']}" if r["seed"] != 7 else ""
        lines.append(
            f"| {r['distance']} | {r['run'].replace('>', ' → ')} | {r['setting']} ({_setting(r)}{seed}) | {slopes} | {bias} "
            f"| **{r['hr_at_10']:.3f}** | {r['chance_hr_at_10']:.3f} / {r['kind_aware_hr_at_10']:.2f} | {cue} | {r['blind_head_share']:.1f} | {pred:.1f} / {meas:.1f} "
            f"| {r['mean_entropy']:.2f} |"
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def probe_summary_markdown(records: list[dict]) -> str:
    """HR@10 per run (rows) and scoring distance (columns), with the blind-head share in brackets."""
    distances = sorted({r["distance"] for r in records})
    cell = {(r["run"], r["setting"], r["seed"], r["distance"]): r for r in records}
    order = {name: i for i, name in enumerate(SETTINGS)}
    runs = {name: i for i, name in enumerate(PRECISIONS)}
    keys = sorted({k[:3] for k in cell}, key=lambda k: (runs[k[0]], order.get(k[1], len(order)), k[2]))  # removed settings last
    lines = ["| dtype (train → score) | setting | " + " | ".join(f"D = {d}" for d in distances) + " |",
             "|---|---|" + "---|" * len(distances)]  # fmt: skip
    for run, setting, seed in keys:
        first = next(cell[(run, setting, seed, d)] for d in distances if (run, setting, seed, d) in cell)
        label = f"{setting} ({_setting(first)}" + (f", seed {seed})" if seed != 7 else ")")
        values = []
        for d in distances:
            r = cell.get((run, setting, seed, d))
            values.append("" if r is None else f"{r['hr_at_10']:.2f} [{r['blind_head_share']:.2g}]")
        lines.append(f"| {run.replace('>', ' → ')} | {label} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def run_probe(output: Path, plan: Sequence[tuple[str, str, int]], json_path: Path | None = None,
              command: str | None = None) -> list[dict]:
    """Every (precision, setting, seed) run of ``plan``, each scored at every ``EVAL_DISTANCES``.

    Each new record names ``command`` (the command line that made it), the ``machine`` and its ``torch_threads``
    (the scores follow the CPU and the thread count: docs/numerics.md). Records are written to the JSON (default ``output/probe.json``) and the table to
    ``output/probe.md`` as each run finishes; runs already in the JSON are skipped.
    """
    output.mkdir(parents=True, exist_ok=True)
    path = json_path or output / "probe.json"
    records = json.loads(path.read_text()) if path.exists() else []
    done = {(r["run"], r["setting"], r["seed"]) for r in records}
    machine = machine_line()  # reads /proc/cpuinfo: once, not per record
    for precision, setting, seed in dict.fromkeys(plan):  # in order, each run once
        if (precision, setting, seed) in done:
            continue
        started = time.perf_counter()
        new = run_probe_one(setting, precision, output, seed)
        for r in new:
            r["run_wall_seconds"] = time.perf_counter() - started
            r.update(command=command, machine=machine, torch_threads=torch.get_num_threads())
        records += new
        done.add((precision, setting, seed))  # a plan may name a run twice
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(records, indent=2))
        write_text_atomic(output / "probe.md", probe_summary_markdown(records) + "\n" + probe_markdown(records))
        log.info("probe %s %s seed %d: %.0f s", precision, setting, seed, time.perf_counter() - started)
    return records


def configure_logging() -> None:
    """INFO from this project's loggers with the time, WARNING and up from everything else: the root logger
    stays at WARNING, since fbgemm_gpu logs one "Successfully loaded: 'fbgemm_gpu_*.so'" line per library on
    it at INFO as torchrec is imported; Lightning's and torch's notices silenced."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    for name in ("benchmarks", "recsys_alibi", "pipelines"):
        logging.getLogger(name).setLevel(logging.INFO)
    for noisy in ("lightning", "lightning.pytorch", "lightning.fabric", "torch.fx", "torch._dynamo"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r".*(LeafSpec|litlogger|is_fx_tracing|noload|distutils).*")


def main(argv: Sequence[str] | None = None) -> int:
    """``paths`` or ``probe`` (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.numerics", description=__doc__.splitlines()[0])
    parser.add_argument("section", choices=["paths", "probe"])
    parser.add_argument("--output", type=Path, default=Path("runs/numerics"))
    parser.add_argument("--settings", default=None, help=f"probe: only these of {', '.join(SETTINGS)}")
    parser.add_argument("--precisions", default=None, help=f"probe: only these of {', '.join(PRECISIONS)}")
    parser.add_argument("--all", action="store_true", help="probe: every (precision, setting), not the plan")
    parser.add_argument("--seeds", default=None, help="probe: train each planned run with these seeds (e.g. 7,8,9)")
    parser.add_argument("--json", type=Path, default=None, help="probe: results JSON (default OUTPUT/probe.json)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    configure_logging()
    if args.threads:
        torch.set_num_threads(args.threads)
    command = command_line("-m", ["benchmarks.numerics", *(sys.argv[1:] if argv is None else argv)])
    if args.section == "paths":
        run_paths(args.output, command=command)
        print((args.output / "paths.md").read_text())
    else:
        plan = [(p, s, 7) for p in PRECISIONS for s in SETTINGS] if args.all else list(PLAN)
        for flag, index, known in ((args.precisions, 0, PRECISIONS), (args.settings, 1, SETTINGS)):
            if flag is None:
                continue
            if unknown := [x for x in flag.split(",") if x not in known]:
                parser.error(f"unknown {unknown}; use {', '.join(known)}")
            plan = [run for run in plan if run[index] in flag.split(",")]
        if args.seeds is not None:
            plan = [(p, s, int(seed)) for p, s, _ in plan for seed in args.seeds.split(",")]
        run_probe(args.output, plan, args.json, command)
        print((args.output / "probe.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
