"""Per-head diagnosis of a slope scheme along every softmax path, and the report ``diagnose`` prints."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch

from recsys_alibi.diagnostics.distances import (
    bias_clamp_limit,
    min_max_bias,
    path_normal_distance,
    path_zero_distance,
    zero_share,
)
from recsys_alibi.diagnostics.paths import SoftmaxPath, dtype_name, resolve_dtype, softmax_paths
from recsys_alibi.model.alibi import alibi_slopes

__all__ = ["DiagnosisReport", "HeadDiagnosis", "PathRemedy", "diagnose", "diagnose_heads"]


@dataclass(frozen=True)
class HeadDiagnosis:
    """One head along one softmax path.

    Attributes:
        head: 0-based head index h. slope: m_h.
        path: the :class:`SoftmaxPath` name.
        normal_distance: first distance (items) whose weight is below the smallest normal.
        zero_distance: first distance whose weight is gone (None: never, e.g. under a clamp).
        zero_share: share of visible causal (query, key) pairs at ``max_len`` that get no
            weight from the bias alone (window and sinks applied).
        blind: ``zero_share > 0``.
        max_window: remedy, the largest sliding window with no gone key for this head
            (``zero_distance``); None when no window is needed.
        bias_clamp: remedy, the largest ``|bias|`` clamp that keeps this head's weights normal
            in rows of up to ``max_len`` keys (:func:`bias_clamp_limit` with the head's normaliser).
        max_bias: remedy, the smallest ``max_bias`` of the fixed scheme at which this head
            (its place in the scheme) is not blind at ``max_len`` (:func:`min_max_bias`).
    """

    head: int
    slope: float
    path: str
    normal_distance: int | None
    zero_distance: int | None
    zero_share: float
    blind: bool
    max_window: int | None
    bias_clamp: float
    max_bias: float | None


def diagnose_heads(
    n_heads: int,
    max_len: int,
    dtype: str | torch.dtype,
    max_bias: float = 8.0,
    slopes: torch.Tensor | list[float] | None = None,
    *,
    path: SoftmaxPath | str = "exp",
    device: str = "cpu",
    bias_clamp: float | None = None,
    window: int | None = None,
    sinks: int = 0,
) -> list[HeadDiagnosis]:
    """Diagnose every head of an ALiBi attention at context length ``max_len``.

    Args:
        n_heads: H. max_len: L, items (the longest context the model sees).
        dtype: float16 | bfloat16 | float32 (the attention's input / autocast dtype).
        max_bias: slope scheme when ``slopes`` is None (Press et al. 2022).
        slopes: (H,) slopes of a trained model (learnable slopes), overriding the scheme.
        path: a :class:`SoftmaxPath` or the name of one in :func:`softmax_paths` (``exp``:
            the contract rule of :func:`underflow_distance`; ``eager``, ``sdpa``, ``flex``...).
        device: where the paths apply (``cpu`` | ``cuda``).
        bias_clamp, window, sinks: the model's mitigations (``model.bias_clamp``, ...).

    Returns:
        H :class:`HeadDiagnosis`, head order.

    Raises:
        ValueError: bad sizes, slopes of the wrong shape, unknown dtype or path.
    """
    if n_heads < 1 or max_len < 1:
        raise ValueError(f"need n_heads >= 1 and max_len >= 1, got {n_heads}, {max_len}")
    if slopes is None:
        slopes = alibi_slopes(n_heads, max_bias)
    slope_list = [float(s) for s in torch.as_tensor(slopes, dtype=torch.float64).flatten()]
    if len(slope_list) != n_heads:
        raise ValueError(f"slopes must be ({n_heads},), got {len(slope_list)} values")
    if isinstance(path, str):
        found = {p.name: p for p in softmax_paths(dtype, device)}
        if path not in found:
            raise ValueError(f"unknown softmax path {path!r}; use one of {', '.join(found)}")
        path = found[path]
    heads = []
    for h, slope in enumerate(slope_list):
        zero_d = path_zero_distance(slope, path, bias_clamp, row_len=max_len)
        share = zero_share(zero_d, max_len, window, sinks)
        heads.append(
            HeadDiagnosis(
                head=h, slope=slope, path=path.name,
                normal_distance=path_normal_distance(slope, path, bias_clamp, row_len=max_len),
                zero_distance=zero_d, zero_share=share, blind=share > 0,
                max_window=zero_d if share > 0 else None,
                bias_clamp=bias_clamp_limit(path, [slope], row_len=max_len),
                max_bias=min_max_bias(n_heads, max_len, path, window, sinks, head=h),
            )
        )  # fmt: skip
    return heads


@dataclass(frozen=True)
class PathRemedy:
    """What avoids gone keys at ``max_len`` along one path (config-wide values).

    Attributes:
        path: path name. blind_heads: how many heads lose keys. zero_share: mean over heads.
        bias_clamp: :func:`bias_clamp_limit` with the heads' slopes, the largest
            ``model.bias_clamp`` that keeps every weight normal at ``max_len``.
        window: largest ``model.window`` with no gone key in any head (None: not needed).
        max_bias: smallest ``model.max_bias`` of the fixed scheme with no blind head.
    """

    path: str
    blind_heads: int
    zero_share: float
    bias_clamp: float
    window: int | None
    max_bias: float | None


@dataclass(frozen=True)
class DiagnosisReport:
    """ALiBi numerics of one attention setup: per path, per head, plus remedies.

    ``heads[path]`` lists :class:`HeadDiagnosis` per head; ``paths`` describes each path;
    ``remedies[path]`` the config values that avoid gone keys; ``health`` optionally the
    measured attention health of a model (see ``pipelines.diagnose``).
    """

    n_heads: int
    max_len: int
    dtype: str
    device: str
    max_bias: float
    slope_source: str  # "scheme" | "model"
    bias_clamp: float | None
    window: int | None
    sinks: int
    paths: list[SoftmaxPath]
    heads: dict[str, list[HeadDiagnosis]]
    remedies: dict[str, PathRemedy]
    health: dict[str, Any] | None = field(default=None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (dtypes as names)."""
        return {
            "n_heads": self.n_heads, "max_len": self.max_len, "dtype": self.dtype, "device": self.device,
            "max_bias": self.max_bias, "slope_source": self.slope_source, "bias_clamp": self.bias_clamp,
            "window": self.window, "sinks": self.sinks,
            "paths": [p.to_dict() for p in self.paths],
            "heads": {name: [asdict(h) for h in hs] for name, hs in self.heads.items()},
            "remedies": {name: asdict(r) for name, r in self.remedies.items()},
            "health": self.health,
        }  # fmt: skip

    def to_json(self, indent: int | None = 2) -> str:
        """The report as a JSON string."""
        return json.dumps(self.to_dict(), indent=indent)

    def with_health(self, health: dict[str, Any]) -> "DiagnosisReport":
        """A copy with ``health`` set."""
        return replace(self, health=health)

    def table(self) -> str:
        """Plain-text table: one row per head; per path ``zero distance / zero share at L``."""
        names = [p.name for p in self.paths]
        header = ["head", "slope", "normal d", *[f"{n}: zero d / share" for n in names]]
        rows = []
        for h in range(self.n_heads):
            first = self.heads[names[0]][h]
            cells = [str(h), f"{first.slope:.6g}", _fmt_d(first.normal_distance)]
            for n in names:
                hd = self.heads[n][h]
                cells.append(f"{_fmt_d(hd.zero_distance)} / {100 * hd.zero_share:.1f}%")
            rows.append(cells)
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [header, *rows]]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def summary(self) -> str:
        """Header, the per-head table, each path's dtypes and remedies, and the model's health."""
        mitig = [f"{k}={v}" for k, v in (("bias_clamp", self.bias_clamp), ("window", self.window)) if v is not None]
        if self.sinks:
            mitig.append(f"sinks={self.sinks}")
        lines = [
            f"ALiBi numerics: {self.n_heads} heads, max_len {self.max_len}, {self.dtype} on {self.device}, "
            f"{'max_bias ' + str(self.max_bias) if self.slope_source == 'scheme' else 'slopes of the model'}"
            + (f" ({', '.join(mitig)})" if mitig else ""),
            "distances in items; 'normal d': exp(-slope*d) below the dtype's smallest normal; "
            "'zero d / share': first distance with no weight, share of causal pairs at max_len with none",
            self.table(),
            "softmax paths:",
        ]
        for p in self.paths:
            r = self.remedies[p.name]
            lines.append(f"  {p.describe()}")
            fix = f"bias_clamp <= {r.bias_clamp:g}"
            if r.window is not None:
                fix += f", or window <= {r.window}"
            if r.max_bias is not None and r.blind_heads:
                fix += f", or max_bias >= {r.max_bias:g}"
            status = f"{r.blind_heads}/{self.n_heads} heads blind, {100 * r.zero_share:.1f}% of pairs lost"
            lines.append(f"    {status}" + (f"; fix: {fix}" if r.blind_heads else ""))
        if self.health:
            lines.append(_health_lines(self.health))
        return "\n".join(lines)


def _fmt_d(d: int | None) -> str:
    return "never" if d is None else str(d)


def _health_lines(health: dict[str, Any]) -> str:
    lines = [f"attention health of the model ({health.get('note', '')}):"]
    for layer, heads in enumerate(health.get("layers", [])):
        cells = [f"h{h}: H={x['entropy']:.2f} nats, zero {100 * x['zero_share']:.1f}%" for h, x in enumerate(heads)]
        lines.append(f"  layer {layer}: " + "; ".join(cells))
    return "\n".join(lines)


def diagnose(
    n_heads: int,
    max_len: int,
    dtype: str | torch.dtype,
    max_bias: float = 8.0,
    slopes: torch.Tensor | list[float] | None = None,
    *,
    device: str = "cpu",
    bias_clamp: float | None = None,
    window: int | None = None,
    sinks: int = 0,
) -> DiagnosisReport:
    """Diagnose every head along every softmax path of ``dtype`` on ``device``.

    Arguments as :func:`diagnose_heads`. ``max_bias`` and the remedies refer to the fixed slope
    scheme even when ``slopes`` come from a model.

    Returns:
        A :class:`DiagnosisReport`.
    """
    dt = resolve_dtype(dtype)
    paths = softmax_paths(dt, device)
    heads, remedies = {}, {}
    for p in paths:
        hs = diagnose_heads(
            n_heads, max_len, dt, max_bias, slopes, path=p, bias_clamp=bias_clamp, window=window, sinks=sinks
        )
        heads[p.name] = hs
        blind = [h for h in hs if h.blind]
        per_head_mb = [h.max_bias for h in hs]
        remedies[p.name] = PathRemedy(
            path=p.name,
            blind_heads=len(blind),
            zero_share=float(np.mean([h.zero_share for h in hs])),
            bias_clamp=min(h.bias_clamp for h in hs),
            window=min(h.max_window for h in blind) if blind else None,
            max_bias=None if None in per_head_mb else max(per_head_mb),
        )
    return DiagnosisReport(
        n_heads=n_heads, max_len=max_len, dtype=dtype_name(dt), device=device, max_bias=float(max_bias),
        slope_source="scheme" if slopes is None else "model", bias_clamp=bias_clamp, window=window,
        sinks=sinks, paths=paths, heads=heads, remedies=remedies,
    )  # fmt: skip


