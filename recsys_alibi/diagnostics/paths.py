"""Softmax paths: where each attention backend rounds the ALiBi bias and evaluates ``exp()``.

The per-dtype floors of ``exp(x)`` (natural log of the threshold, measured with torch 2.13):

=========  ====================  =====================
dtype      below smallest normal exactly zero
=========  ====================  =====================
float16    x < -9.70             x <= -17.34
bfloat16   x < -87.34            x <= -93.0  (bf16 has only 7 subnormal bits)
float32    x < -87.34            x <= -103.97
=========  ====================  =====================

bfloat16 and float32 share the exponent range (same normal floor); float16's is far narrower.
The registry ``SOFTMAX_PATHS`` was measured with :func:`recsys_alibi.diagnostics.probe.probe_zero_share`
on the backends of :mod:`recsys_alibi.model.attention` (see ``docs/numerics.md``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

__all__ = ["DTYPES", "EXP_DTYPES", "SOFTMAX_PATHS", "Floor", "SoftmaxPath", "dtype_name", "exp_path", "resolve_dtype", "softmax_paths"]

DTYPES: dict[str, torch.dtype] = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# the contract rule (``exp_path``, ``underflow_distance``) is defined for float64 too; the backends' paths
# (``softmax_paths``, ``diagnose``) are not: attention runs (autocast) in the three dtypes above
EXP_DTYPES: dict[str, torch.dtype] = {**DTYPES, "float64": torch.float64}

Floor = Literal["zero", "normal"]


def resolve_dtype(dtype: str | torch.dtype, allowed: dict[str, torch.dtype] = DTYPES) -> torch.dtype:
    """``"bfloat16"`` | ``torch.bfloat16`` (also float16, float32; ``allowed=EXP_DTYPES``: float64) -> the torch dtype.

    Raises:
        ValueError: any other dtype.
    """
    if isinstance(dtype, torch.dtype):
        if dtype in allowed.values():
            return dtype
    elif str(dtype).removeprefix("torch.") in allowed:
        return allowed[str(dtype).removeprefix("torch.")]
    raise ValueError(f"unsupported dtype {dtype!r}; use one of {', '.join(allowed)}")


def dtype_name(dtype: torch.dtype) -> str:
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
        # half the smallest subnormal, in logs: for float64 the product itself rounds to 0
        return math.log(fi.smallest_normal) + math.log(fi.eps) - math.log(2)

    def log_z(self, slope: float, row_len: int | None = None) -> float:
        """``ln Z`` of a row of ``row_len`` keys (None: infinitely many); 0 when not normalised."""
        if not self.normalized:
            return 0.0
        if slope == 0:  # a free head: every key weighs the same, Z = row_len
            return math.inf if row_len is None else math.log(row_len)
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
            f"{self.name} ({self.device}, {dtype_name(self.dtype)} in): bias {dtype_name(self.bias_dtype)}, "
            f"exp in {dtype_name(self.exp_dtype)}, weights {dtype_name(self.weight_dtype)}{norm}, gone below the "
            f"{'smallest normal' if self.floor == 'normal' else 'smallest subnormal'} [{src}]"
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, torch.dtype):
                out[key] = dtype_name(value)
        return out


def exp_path(dtype: str | torch.dtype, floor: Floor = "zero") -> SoftmaxPath:
    """The contract rule: ``x = -slope * d`` in float64, cast to ``dtype``, ``exp`` in ``dtype``.

    ``dtype``: float16, bfloat16, float32 or float64 (``EXP_DTYPES``).
    """
    dt = resolve_dtype(dtype, EXP_DTYPES)
    return SoftmaxPath(
        name="exp", device="any", dtype=dt, bias_dtype=dt, exp_dtype=dt, weight_dtype=dt, floor=floor,
        normalized=False, bias_compute_dtype=torch.float64, note="torch.exp of the bias alone, no normaliser",
    )  # fmt: skip


def native_cpu_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX tiles); on others (AVX2)
    oneDNN emulates bfloat16 products in float32."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def _cpu_paths(dt: torch.dtype) -> list[SoftmaxPath]:
    f32, reduced = torch.float32, dt != torch.float32
    # Measured on CPU, torch 2.13 (benchmarks/numerics.py, section "paths"): the reduced-precision
    # softmax computes in fp32 and keeps subnormals in its bf16/fp16 output; the native bf16 GEMM
    # of the eager P @ V (AVX512-BF16) flushes subnormal weights, the emulated one of an AVX2 CPU
    # keeps them (measured 2026-12-03 on an AMD EPYC: head 1/2 at 320 events, zero share 0.181
    # against 0.212 with the flush); the SDPA flash kernel and compiled flex flush
    # subnormal exp() results in fp32 for every input dtype. fp16's own floors (-17.3) lie far
    # above fp32's, so for fp16 only the rounding of the weight to fp16 matters.
    flushes = dt == torch.bfloat16 and native_cpu_bf16()
    eager_floor: Floor = "normal" if flushes else "zero"
    fused_floor: Floor = "zero" if dt == torch.float16 else "normal"
    return [
        SoftmaxPath("eager-weights", "cpu", dt, dt, f32, dt, "zero",
                    note="softmax of the input dtype computes in fp32, rounds to the input dtype, keeps subnormals"),
        SoftmaxPath("eager", "cpu", dt, dt, f32, dt, eager_floor,
                    note="P @ V: the native bf16 GEMM flushes subnormal weights" if flushes
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


