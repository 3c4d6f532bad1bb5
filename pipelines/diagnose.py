"""``recsys-alibi diagnose``: ALiBi numerics per head, dtype and length; a model's attention health.

From a config (``model.n_heads``, ``model.max_len``, ``model.max_bias`` and the mitigations
``model.bias_clamp``, ``model.window``, ``model.sinks``) or from a trained model (``--model-uri``:
its slopes, learnable ones included, and its config), :func:`run_diagnose` reports for every
head where the bias alone makes ``exp()`` fall below the dtype's smallest normal and to zero,
along every backend's softmax path, with the clamp, window or ``max_bias`` that avoids it
(:mod:`recsys_alibi.diagnostics`). For a model it also measures the attention entropy and the
share of exactly-zero weights on a small synthetic batch.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import torch

from recsys_alibi.config import ConfigError, JobConfig
from recsys_alibi.diagnostics import DiagnosisReport, diagnose, resolve_dtype

log = logging.getLogger(__name__)

HEALTH_ROWS = 2  # synthetic histories in the health batch
HEALTH_MAX_LEN = 1024  # longest synthetic history, items (weights are B x H x L x L per layer)
# most heads one diagnosis reports (one table row each, ~0.05 s per head and growing with H; 256 takes
# ~10-15 s on one CPU core): more than any published ALiBi model has (BLOOM: 112); --heads 100000 ran unbounded
MAX_HEADS = 256


def _check_heads(n_heads: int, source: str) -> None:
    if n_heads > MAX_HEADS:
        raise ConfigError(
            f"{source}={n_heads}: diagnose reports one row per head and takes at most {MAX_HEADS} heads "
            f"(a table of {n_heads} would take minutes)"
        )


def _autocast(dtype: torch.dtype):
    """CPU autocast to ``dtype`` (no-op for float32)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=dtype)


def model_health(model, dtype: torch.dtype, length: int, seed: int = 0) -> dict[str, Any]:
    """Attention entropy and zero-weight share of ``model`` on random full-length histories.

    Args:
        model: an ``AlibiRanker`` (eval mode, CPU).
        dtype: run under CPU autocast to this dtype (float32: none).
        length: history length L, items.
        seed: seeds the random item indices.

    Returns:
        ``{"length", "rows", "dtype", "note", "layers": [[{"entropy", "zero_share"}, ...] per head] per layer}``.
    """
    from recsys_alibi.training.attention_health import attention_entropy, visible_pairs, zero_weight_share

    gen = torch.Generator().manual_seed(seed)
    items = torch.randint(1, model.n_items + 1, (HEALTH_ROWS, length), generator=gen)  # (B, L)
    lengths = torch.full((HEALTH_ROWS,), length, dtype=torch.int64)
    buckets = model.items.time_gap_buckets
    gaps = torch.randint(1, buckets, (HEALTH_ROWS, length), generator=gen) if buckets else None  # (B, L)
    with _autocast(dtype):
        weights = model.attention_weights(items, lengths, gaps)  # per layer (B, H, L, L)
    vis = visible_pairs(lengths, length, model.cfg.window, model.cfg.sinks)
    layers = []
    for w in weights:
        ent, zeros = attention_entropy(w), zero_weight_share(w, visible=vis)
        layers.append([{"entropy": float(e), "zero_share": float(z)} for e, z in zip(ent, zeros)])
    note = f"{HEALTH_ROWS} random histories of {length} items, eager weights under {str(dtype).removeprefix('torch.')}"
    return {"length": length, "rows": HEALTH_ROWS, "dtype": str(dtype).removeprefix("torch."), "note": note,
            "layers": layers}  # fmt: skip


def run_diagnose(
    config: JobConfig, dtype: str = "bfloat16", model_uri: str | None = None, output: Path | None = None,
    length: int | None = None,
) -> DiagnosisReport:
    """Diagnose the ALiBi numerics of ``config.model`` or of the model at ``model_uri``.

    Args:
        config: the job config; ``model.n_heads``, ``model.max_len``, ``model.max_bias``,
            ``model.bias_clamp``, ``model.window``, ``model.sinks`` (``--heads``/``--max-len``
            set the first two).
        dtype: ``float16`` | ``bfloat16`` | ``float32``, the attention's (autocast) dtype.
        model_uri: ``runs:/ID/model`` or ``models:/NAME/VERSION``; its slopes and model config
            replace the config's, and its attention health is measured.
        output: write the report as JSON here.
        length: with ``model_uri``, the length (items) to diagnose at instead of the model's ``max_len``
            (ALiBi extrapolates: train short, test long); ``--max-len`` gives it.

    Returns:
        The :class:`recsys_alibi.diagnostics.DiagnosisReport` (``.summary()`` is what the
        command prints).

    Raises:
        ValueError: unknown dtype; ModelUriError: the model cannot be loaded; ConfigError: ``model.max_len``
            is ``auto`` and no model is given, more than ``MAX_HEADS`` (256) heads (config or model), or
            ``length`` beyond a learned-position model's ``max_len`` (it cannot run on longer histories).
    """
    dt = resolve_dtype(dtype)
    health = None
    if model_uri is None:
        cfg, slopes = config.model, None
        _check_heads(cfg.n_heads, "model.n_heads")
        if cfg.max_len == "auto":
            raise ConfigError(
                "model.max_len=auto is set from the data at train time: give --max-len N, or --model-uri of a trained model"
            )
        if cfg.slopes != "geometric" or cfg.free_heads:  # the configured scheme, not the paper's
            from recsys_alibi.model.alibi import head_slopes

            slopes = head_slopes(cfg).to(torch.float64)  # (H,)
    else:
        from recsys_alibi.tracking import load_ranker, setup_tracking

        setup_tracking(config.tracking, reading=model_uri)
        model = load_ranker(model_uri).model
        cfg = model.cfg
        _check_heads(cfg.n_heads, "the model's n_heads")
        if cfg.position == "learned" and length is not None and int(length) > cfg.max_len:
            raise ConfigError(
                f"--max-len {int(length)}: the model's learned positions cover {cfg.max_len} items and it cannot run "
                f"on longer histories; give --max-len {cfg.max_len} or less"
            )
        with torch.no_grad():
            slopes = model.slopes().detach().cpu().to(torch.float64)  # (H,)
        if cfg.position != "alibi":
            log.warning("model.position=%s: the model has no ALiBi bias; the diagnosis is of its slope scheme",
                        cfg.position)  # fmt: skip
            slopes = None
        if length is not None:
            cfg = cfg.model_copy(update={"max_len": int(length)})
        health = model_health(model, dt, min(cfg.max_len, HEALTH_MAX_LEN), seed=config.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    report = diagnose(
        cfg.n_heads, cfg.max_len, dt, cfg.max_bias, slopes,
        device=device, bias_clamp=cfg.bias_clamp, window=cfg.window, sinks=cfg.sinks,
    )  # fmt: skip
    if health is not None:
        report = report.with_health(health)
    if output is not None:
        from recsys_alibi.atomic import write_json_atomic

        output = Path(output)
        output.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(output, report.to_dict())
    return report
