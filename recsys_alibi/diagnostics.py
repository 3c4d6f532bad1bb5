"""ALiBi numerics: where the linear bias makes attention weights vanish, per head and dtype.

ALiBi (Press, Smith & Lewis, "Train Short, Test Long", ICLR 2022) adds ``-m_h * d`` to the
score of a key ``d = i - j`` positions behind the query. After the softmax subtracts the row
maximum (the key at ``d = 0`` when the scores are equal), the weight of a key at distance ``d``
is ``exp(-m_h * d) / Z`` with ``Z = sum_d' exp(-m_h * d')``. Far enough back, ``exp()`` falls
below the dtype's smallest normal number (precision loss, or zero where a kernel flushes
subnormals) and then to exactly zero: the key gets no weight and no gradient, and a head with
such keys inside its context "goes blind" there.

The per-dtype floors of ``exp(x)`` (natural log of the threshold, measured with torch 2.13):

=========  ====================  =====================
dtype      below smallest normal exactly zero
=========  ====================  =====================
float16    x < -9.70             x <= -17.34
bfloat16   x < -87.34            x <= -93.0  (bf16 has only 7 subnormal bits)
float32    x < -87.34            x <= -103.97
=========  ====================  =====================

bfloat16 and float32 share the exponent range (same normal floor); float16's is far narrower.

Which dtype the softmax really runs in depends on the attention backend, so the module keeps a
registry of :class:`SoftmaxPath` (``SOFTMAX_PATHS``) measured with :func:`probe_zero_share`
on the backends of :mod:`recsys_alibi.model.attention` (see ``docs/numerics.md``). Remedies:
clamp the bias (``model.bias_clamp``), bound the context with a sliding window
(``model.window``; StreamingLLM sink tokens, Xiao et al. 2023, still get the full bias and vanish
too unless the bias is clamped), or use a larger ``model.max_bias`` (flatter slopes).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch

from recsys_alibi.model.alibi import alibi_slopes

__all__ = [
    "DTYPES",
    "SOFTMAX_PATHS",
    "DiagnosisReport",
    "HeadDiagnosis",
    "PathRemedy",
    "SoftmaxPath",
    "bias_clamp_limit",
    "diagnose",
    "diagnose_heads",
    "exp_path",
    "min_max_bias",
    "path_normal_distance",
    "path_zero_distance",
    "probe_zero_share",
    "resolve_dtype",
    "softmax_paths",
    "subnormal_distance",
    "underflow_distance",
    "zero_share",
]

DTYPES: dict[str, torch.dtype] = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_MAX_DISTANCE = 2**53  # largest distance whose float64 value is exact
_SCAN = 4096  # candidate distances evaluated at once at the end of the search

Floor = Literal["zero", "normal"]


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"`` | ``torch.bfloat16`` (also float16, float32) -> the torch dtype.

    Raises:
        ValueError: any other dtype.
    """
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
    elif str(dtype).removeprefix("torch.") in DTYPES:
        return DTYPES[str(dtype).removeprefix("torch.")]
    raise ValueError(f"unsupported dtype {dtype!r}; use one of {', '.join(DTYPES)}")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class SoftmaxPath:
    """How one backend turns the ALiBi bias into the weight a value vector is multiplied by.

    The weight of a key at distance ``d`` from the bias alone is modelled as
    ``w = exp(x) / Z`` with ``x = -slope * d`` computed in ``bias_compute_dtype`` and rounded to
    ``bias_dtype`` (the dtype the additive mask or score has), ``exp`` evaluated in
    ``exp_dtype``, ``Z = (1 - exp(-slope * n)) / (1 - exp(-slope))`` when ``normalized`` (the
    softmax normaliser of a row of ``n`` keys from the bias alone; ``n = L``, the longest row of
    a length-L context, gives the largest ``Z``; no length: ``n -> inf``) and ``w`` stored in
    ``weight_dtype``. ``floor="zero"``: the weight vanishes when it rounds to 0 in
    ``weight_dtype``; ``floor="normal"``: already below the smallest normal number of
    ``weight_dtype`` (a kernel on the path flushes subnormals: vectorised exp, a bf16 GEMM).

    Attributes:
        name: ``exp`` (plain ``torch.exp`` in the dtype: the rule of :func:`underflow_distance`),
            ``eager-weights`` (the weights tensor the eager backend returns), ``eager``,
            ``sdpa``, ``flex`` (what reaches the output).
        device: ``cpu`` or ``cuda``.
        dtype: the input dtype of the attention call (q, k, v; the autocast dtype).
        measured: True when probed on this torch version (CPU, torch 2.13), False when taken
            from PyTorch's documentation only (GPU paths: no GPU was available).
        note: one line on what was seen.
    """

    name: str
    device: str
    dtype: torch.dtype
    bias_dtype: torch.dtype
    exp_dtype: torch.dtype
    weight_dtype: torch.dtype
    floor: Floor
    normalized: bool = True
    bias_compute_dtype: torch.dtype = torch.float32
    measured: bool = True
    note: str = ""

    def log_floor(self) -> float:
        """Natural log of the weight below which the weight counts as gone (approximate)."""
        fi = torch.finfo(self.weight_dtype)
        if self.floor == "normal":
            return math.log(fi.smallest_normal)
        return math.log(fi.smallest_normal * fi.eps / 2)  # half the smallest subnormal

    def log_z(self, slope: float, row_len: int | None = None) -> float:
        """``ln Z`` of a row of ``row_len`` keys (None: infinitely many); 0 when not normalised."""
        if not self.normalized:
            return 0.0
        full = 1.0 if row_len is None else -math.expm1(-slope * row_len)
        return math.log(full) - math.log(-math.expm1(-slope))

    def is_gone(
        self, slope: float, d: torch.Tensor, bias_clamp: float | None = None, row_len: int | None = None
    ) -> torch.Tensor:
        """Whether the weight of keys at distances ``d`` ((k,) int64) is gone, (k,) bool.

        ``row_len``: keys in the row (sets the normaliser Z); None: infinitely many.
        """
        x = -(torch.tensor(slope, dtype=self.bias_compute_dtype) * d.to(self.bias_compute_dtype))
        if bias_clamp is not None:
            x = x.clamp(min=-bias_clamp)
        y = torch.exp(x.to(self.bias_dtype).to(self.exp_dtype))
        if self.normalized:
            y = y * math.exp(-self.log_z(slope, row_len))  # divide by Z
        w = y.to(self.weight_dtype)
        if self.floor == "zero":
            return w == 0
        return w < torch.finfo(self.weight_dtype).smallest_normal

    def describe(self) -> str:
        """One line: what the path computes in which dtype."""
        norm = ", normalised" if self.normalized else ""
        src = "measured" if self.measured else "from docs, not measured"
        return (
            f"{self.name} ({self.device}, {_name(self.dtype)} in): bias {_name(self.bias_dtype)}, "
            f"exp in {_name(self.exp_dtype)}, weights {_name(self.weight_dtype)}{norm}, gone below the "
            f"{'smallest normal' if self.floor == 'normal' else 'smallest subnormal'} [{src}]"
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, torch.dtype):
                out[key] = _name(value)
        return out


def exp_path(dtype: str | torch.dtype, floor: Floor = "zero") -> SoftmaxPath:
    """The contract rule: ``x = -slope * d`` in float64, cast to ``dtype``, ``exp`` in ``dtype``."""
    dt = resolve_dtype(dtype)
    return SoftmaxPath(
        name="exp", device="any", dtype=dt, bias_dtype=dt, exp_dtype=dt, weight_dtype=dt, floor=floor,
        normalized=False, bias_compute_dtype=torch.float64, note="torch.exp of the bias alone, no normaliser",
    )  # fmt: skip


def _cpu_paths(dt: torch.dtype) -> list[SoftmaxPath]:
    f32, reduced = torch.float32, dt != torch.float32
    # Measured on CPU, torch 2.13 (benchmarks/numerics.py, section "paths"): the reduced-precision
    # softmax computes in fp32 and keeps subnormals in its bf16/fp16 output; the bf16 GEMM of
    # the eager P @ V flushes subnormal weights; the SDPA flash kernel and compiled flex flush
    # subnormal exp() results in fp32 for every input dtype. fp16's own floors (-17.3) lie far
    # above fp32's, so for fp16 only the rounding of the weight to fp16 matters.
    eager_floor: Floor = "normal" if dt == torch.bfloat16 else "zero"
    fused_floor: Floor = "zero" if dt == torch.float16 else "normal"
    return [
        SoftmaxPath("eager-weights", "cpu", dt, dt, f32, dt, "zero",
                    note="softmax of the input dtype computes in fp32, rounds to the input dtype, keeps subnormals"),
        SoftmaxPath("eager", "cpu", dt, dt, f32, dt, eager_floor,
                    note="P @ V: the bf16 GEMM flushes subnormal weights" if dt == torch.bfloat16
                    else "P @ V keeps subnormal weights"),
        SoftmaxPath("sdpa", "cpu", dt, dt, f32, dt, fused_floor,
                    note="CPU flash kernel: scores + mask in fp32, exp in fp32 flushes subnormals"
                    + (", P rounded to the input dtype for P @ V" if reduced else "")),
        SoftmaxPath("flex", "cpu", dt, f32, f32, dt, fused_floor,
                    note="compiled C++ kernel: score_mod and softmax in fp32 (bias never rounded to the "
                    "input dtype), exp flushes subnormals"),
    ]  # fmt: skip


def _cuda_paths(dt: torch.dtype) -> list[SoftmaxPath]:
    f32 = torch.float32
    # Not measured (no GPU in the session that wrote this): from PyTorch's autocast op lists
    # (CUDA autocasts softmax to float32; matmul and SDPA to the low dtype) and the fused
    # kernels' design (flash/flex: online softmax with exp2 in fp32, P cast to the input dtype
    # for P @ V; GPU exp2 approximations flush subnormals).
    fused_floor: Floor = "zero" if dt == torch.float16 else "normal"
    return [
        SoftmaxPath("eager-weights", "cuda", dt, dt, f32, f32, "zero", measured=False,
                    note="autocast runs softmax in fp32: the weights tensor is fp32"),
        SoftmaxPath("eager", "cuda", dt, dt, f32, dt, "zero", measured=False,
                    note="autocast casts the fp32 weights to the low dtype for P @ V"),
        SoftmaxPath("sdpa", "cuda", dt, dt, f32, dt, fused_floor, measured=False,
                    note="flash/efficient kernels: exp2 in fp32, P in the input dtype"),
        SoftmaxPath("flex", "cuda", dt, f32, f32, dt, fused_floor, measured=False,
                    note="Triton kernel: score_mod and exp2 in fp32, P cast to the input dtype"),
    ]  # fmt: skip


SOFTMAX_PATHS = {"cpu": _cpu_paths, "cuda": _cuda_paths}


def softmax_paths(dtype: str | torch.dtype, device: str = "cpu") -> list[SoftmaxPath]:
    """The contract rule (``exp``) followed by every backend's path for ``dtype`` on ``device``.

    Raises:
        ValueError: unknown dtype or device.
    """
    dt = resolve_dtype(dtype)
    if device not in SOFTMAX_PATHS:
        raise ValueError(f"unknown device {device!r}; use one of {', '.join(SOFTMAX_PATHS)}")
    return [exp_path(dt), *SOFTMAX_PATHS[device](dt)]


# ---------------------------------------------------------------------------------------------
# Distances


def _check_slope(slope: float) -> float:
    slope = float(slope)
    if not (math.isfinite(slope) and slope > 0):
        raise ValueError(f"slope must be a finite number > 0, got {slope}")
    return slope


def _first_gone(
    slope: float, path: SoftmaxPath, bias_clamp: float | None = None, row_len: int | None = None
) -> int | None:
    """Smallest integer d >= 0 whose weight is gone along ``path``; None if no d <= 2**53 is.

    Closed-form estimate ``d ~ -log_floor / slope``, a bracket grown around it until the
    predicate is False at ``lo`` and True at ``hi``, bisection, and a vectorised scan of the
    last few thousand candidates. Exact because the predicate is monotone in ``d`` (``-slope *
    d``, rounding, ``exp`` and the comparisons are all monotone).
    """
    slope = _check_slope(slope)

    def gone(d: int) -> bool:
        return bool(path.is_gone(slope, torch.tensor([d], dtype=torch.int64), bias_clamp, row_len)[0])

    if gone(0):
        return 0
    if not gone(_MAX_DISTANCE):
        return None
    log_z = path.log_z(slope, row_len)
    est = min(_MAX_DISTANCE, max(1, int((-path.log_floor() - log_z) / slope)))
    lo, hi, pad = max(0, est - est // 32 - 2), min(_MAX_DISTANCE, est + est // 32 + 2), est // 32 + 2
    while lo > 0 and gone(lo):
        hi, lo, pad = lo, max(0, lo - 2 * pad), 2 * pad
    while not gone(hi):
        lo, hi, pad = hi, min(_MAX_DISTANCE, hi + 2 * pad), 2 * pad
    # invariant: not gone(lo) (or lo == 0, which is never gone) and gone(hi)
    while hi - lo > _SCAN:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if gone(mid) else (mid, hi)
    cand = torch.arange(lo, hi + 1, dtype=torch.int64)
    flags = path.is_gone(slope, cand, bias_clamp, row_len)
    return int(cand[int(torch.nonzero(flags)[0])])


def underflow_distance(slope: float, dtype: torch.dtype) -> int:
    """Smallest integer ``d >= 0`` for which ``torch.exp(x) == 0``, where ``x`` is ``-slope * d``
    computed in float64 and then cast to ``dtype`` (exp evaluated in ``dtype``).

    This is the distance at which the bias alone pushes the softmax weight ratio
    ``w(d) / w(0) = exp(-slope * d)`` to zero when the softmax runs in ``dtype``.

    Args:
        slope: ALiBi slope m_h > 0 (per position).
        dtype: torch.float16, torch.bfloat16 or torch.float32.

    Returns:
        The distance in positions (items). E.g. slope 1/2: 35 (fp16), 186 (bf16), 208 (fp32).

    Raises:
        ValueError: slope not finite and > 0, unsupported dtype, or no underflow up to 2**53.
    """
    d = _first_gone(slope, exp_path(dtype, "zero"))
    if d is None:
        raise ValueError(f"exp(-{slope} * d) does not underflow in {dtype} for any d <= 2**53")
    return d


def subnormal_distance(slope: float, dtype: torch.dtype) -> int:
    """Smallest integer ``d >= 0`` for which ``torch.exp(x)`` is below the smallest normal of
    ``dtype`` (``torch.finfo(dtype).smallest_normal``), ``x`` as in :func:`underflow_distance`.

    From here on the weight ratio has lost precision (subnormal) or is already zero in kernels
    that flush subnormals. E.g. slope 1/2: 20 (fp16), 175 (bf16), 175 (fp32).

    Raises:
        ValueError: as :func:`underflow_distance`.
    """
    d = _first_gone(slope, exp_path(dtype, "normal"))
    if d is None:
        raise ValueError(f"exp(-{slope} * d) stays normal in {dtype} for every d <= 2**53")
    return d


def path_zero_distance(
    slope: float, path: SoftmaxPath, bias_clamp: float | None = None, row_len: int | None = None
) -> int | None:
    """Smallest distance whose weight from the bias alone is gone along ``path`` (None: never).

    With ``bias_clamp`` the bias is ``max(-slope * d, -bias_clamp)``, so a small enough clamp
    returns None. ``row_len``: keys in the row, for the normaliser (use the context length L;
    None: unbounded, which for flat slopes, ``1 / slope >> L``, overstates Z and the loss).
    """
    return _first_gone(slope, path, bias_clamp, row_len)


def path_normal_distance(
    slope: float, path: SoftmaxPath, bias_clamp: float | None = None, row_len: int | None = None
) -> int | None:
    """Smallest distance whose weight falls below the smallest normal of ``path.weight_dtype``."""
    return _first_gone(slope, replace(path, floor="normal"), bias_clamp, row_len)


def _pair_counts(max_len: int, window: int | None, sinks: int) -> np.ndarray:
    """(L,) float64: visible causal (query, key) pairs at each distance d = 0..L-1.

    ``L - d`` pairs per distance; with a window only ``d < window`` plus, beyond it, the pairs
    whose key is one of the first ``sinks`` positions (``min(sinks, L - d)``).
    """
    d = np.arange(max_len, dtype=np.float64)
    counts = max_len - d
    if window is not None:
        counts = np.where(d < window, counts, np.minimum(float(sinks), counts))
    return counts


def zero_share(zero_distance: int | None, max_len: int, window: int | None = None, sinks: int = 0) -> float:
    """Share of the visible causal (query, key) pairs of a length-``max_len`` sequence at a
    distance ``>= zero_distance`` (0.0 when ``zero_distance`` is None).

    Raises:
        ValueError: ``max_len < 1``.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if zero_distance is None or zero_distance >= max_len:
        return 0.0
    counts = _pair_counts(max_len, window, sinks)
    return float(counts[zero_distance:].sum() / counts.sum())


def bias_clamp_limit(
    path: SoftmaxPath, slopes: torch.Tensor | list[float] | None = None, row_len: int | None = None
) -> float:
    """Largest ``model.bias_clamp`` (``|bias|``, rounded down to 1e-3) that keeps every weight
    from the bias alone at or above the smallest normal of ``path.weight_dtype``.

    Without ``slopes`` the rule is the weight ratio: ``exp(-c)`` (the bias rounded and ``exp``
    evaluated as along ``path``, no normaliser) ``>= smallest normal``; e.g. 87.25 for bf16
    (the bias is rounded to bf16's 0.5 spacing there), 87.336 for fp32, 9.707 for fp16 (-9.703
    after rounding to fp16). With ``slopes`` each head's normaliser ``Z`` over rows of
    ``row_len`` keys (None: any length) is included when ``path.normalized``, so the limit is
    lower by ``ln Z`` of the flattest head (``Z`` is at most ``row_len``). Leave headroom for
    score differences between keys.
    """
    normal = replace(path, floor="normal")
    if slopes is None:
        normal = replace(normal, normalized=False)
        slope_list = [1.0]
    else:
        slope_list = [float(s) for s in torch.as_tensor(slopes, dtype=torch.float64).flatten()]

    def ok(c: float) -> bool:
        return all(_first_gone(m, normal, c, row_len) is None for m in slope_list)

    lo, hi = 0.0, 1.0
    while ok(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 2e-4:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return math.floor(lo * 1000) / 1000


def min_max_bias(
    n_heads: int,
    max_len: int,
    path: SoftmaxPath,
    window: int | None = None,
    sinks: int = 0,
    head: int | None = None,
) -> float | None:
    """Smallest ``max_bias`` (to 0.01, rounded up) for which no head of the fixed slope scheme
    (:func:`recsys_alibi.model.alibi.alibi_slopes`), or only head ``head``, loses a visible key
    at ``max_len``.

    Every slope falls as ``max_bias`` grows (flatter), so the answer is found by bisection. It
    is below the default 8 when nothing is blind at 8 (steeper slopes would still do). None when
    even ``max_bias = 64`` is not enough.
    """

    def ok(max_bias: float) -> bool:
        slopes = alibi_slopes(n_heads, max_bias)
        slope = float(slopes.max() if head is None else slopes[head])
        return zero_share(path_zero_distance(slope, path, row_len=max_len), max_len, window, sinks) == 0.0

    lo, hi = 0.0, 64.0
    if not ok(hi):
        return None
    while hi - lo > 0.005:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return math.ceil(hi * 100) / 100


# ---------------------------------------------------------------------------------------------
# Per-head diagnosis and the report


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
        n_heads=n_heads, max_len=max_len, dtype=_name(dt), device=device, max_bias=float(max_bias),
        slope_source="scheme" if slopes is None else "model", bias_clamp=bias_clamp, window=window,
        sinks=sinks, paths=paths, heads=heads, remedies=remedies,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Measuring a backend


def probe_zero_share(
    backend: str,
    slopes: torch.Tensor,
    length: int,
    dtype: str | torch.dtype,
    *,
    window: int | None = None,
    sinks: int = 0,
    bias_clamp: float | None = None,
    chunk: int = 256,
    weights: bool = False,
) -> torch.Tensor:
    """Measure, per head, the share of causal (query, key) pairs that get exactly zero weight
    from the bias alone in one attention backend.

    Queries and keys are zero (all scores equal, so only the ALiBi bias differs) and the values
    are the identity (in column chunks): output row ``i``, column ``j`` is then key ``j``'s
    weight in query ``i``'s output, as the backend computes it, including any flushing in the
    fused kernel or in the P @ V product. With ``weights=True`` (eager only) the weights tensor
    itself is read instead.

    Args:
        backend: ``eager`` | ``sdpa`` | ``flex`` (through
            :func:`recsys_alibi.model.attention.alibi_attention`).
        slopes: (H,) float32. length: L. dtype: input dtype of q, k, v.
        window, sinks, bias_clamp: as in ``alibi_attention``; the share counts visible pairs.
        chunk: value columns per call (memory: H * L * chunk values).

    Returns:
        (H,) float64 shares in [0, 1].

    Raises:
        ValueError: ``weights=True`` with another backend than eager.
    """
    from recsys_alibi.model.attention import alibi_attention, eager_attention
    from recsys_alibi.model.masks import MaskSpec

    dt = resolve_dtype(dtype)
    slopes = torch.as_tensor(slopes, dtype=torch.float32)
    n_heads = slopes.shape[0]
    spec = MaskSpec(q_len=length, k_len=length, causal=True, window=window, sinks=sinks)
    pos = torch.arange(length)
    visible = spec.visible(pos, pos, batch=False)[0, 0]  # (L, L) bool
    zeros = torch.zeros(n_heads, dtype=torch.float64)
    kw = dict(causal=True, window=window, sinks=sinks, bias_clamp=bias_clamp)
    if weights:
        if backend != "eager":
            raise ValueError("weights=True reads the eager weights tensor; use backend='eager'")
        q = torch.zeros(1, n_heads, length, 8, dtype=dt)
        _, w = eager_attention(q, q, q, slopes, return_weights=True, **kw)  # (1, H, L, L)
        zeros = ((w[0] == 0) & visible).sum(dim=(1, 2)).double()
    else:
        for c0 in range(0, length, chunk):
            c1 = min(length, c0 + chunk)
            q = torch.zeros(1, n_heads, length, c1 - c0, dtype=dt)
            v = torch.zeros(1, n_heads, length, c1 - c0, dtype=dt)
            cols = torch.arange(c0, c1)
            v[0, :, cols, cols - c0] = 1.0  # identity block: (L, chunk)
            with torch.no_grad():
                out = alibi_attention(q, q, v, slopes, backend=backend, **kw)  # (1, H, L, chunk)
            zeros += ((out[0] == 0) & visible[:, c0:c1]).sum(dim=(1, 2)).double()
    return zeros / visible.sum().double()
