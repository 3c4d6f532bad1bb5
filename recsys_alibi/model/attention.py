"""ALiBi attention: one function, three backends that agree to fp32 round-off.

- ``eager``: plain masked softmax, can return the weights (:mod:`recsys_alibi.model.sdpa`).
- ``sdpa``: ``scaled_dot_product_attention`` with an additive mask (:mod:`recsys_alibi.model.sdpa`).
- ``flex``: compiled FlexAttention, ALiBi in a specialised ``score_mod``, a ``BlockMask`` that
  skips invisible blocks (:mod:`recsys_alibi.model.flex`). Forward only on CPU (torch 2.13).

:func:`batch_mask` resolves the backend and builds the visibility of one batch once (for flex
the ``BlockMask``, on the device); every layer then passes it to :func:`alibi_attention`.
Imports run one way: attention -> flex -> block_mask / score_mods -> masks, and
attention / flex -> sdpa -> masks.

ALiBi: Press, Smith & Lewis, "Train Short, Test Long", ICLR 2022. Sink tokens: Xiao et al.,
"Efficient Streaming Language Models with Attention Sinks" (StreamingLLM), 2023.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from recsys_alibi.model.block_mask import FlexMask, build_flex_mask
from recsys_alibi.model.flex import flex_alibi_attention
from recsys_alibi.model.masks import MaskSpec, check_call
from recsys_alibi.model.sdpa import eager_attention, needs_grad, sdpa_attention

__all__ = [
    "BACKENDS",
    "Backend",
    "BatchMask",
    "alibi_attention",
    "batch_mask",
    "choose_backend",
    "eager_attention",
    "needs_grad",
    "resolve_backend",
    "sdpa_attention",
]

Backend = Literal["auto", "flex", "sdpa", "eager"]

# The `auto` rule (choose_backend), from the tables in docs/benchmarks.md:
FLEX_CPU_MIN_LEN = 2048  # CPU, no grad, sliding window: flex from this many keys on
# CUDA: sdpa was as fast or faster up to L = 4,096 (H200, bf16, H = 4, D = 64, fwd and fwd+bwd:
# 1.61 vs 2.69 ms at 1,024, 4.78 vs 5.16 ms at 4,096) and flex faster at 16,384 (14.66 vs 23.3 ms,
# 1/65 of the memory): flex above this many keys
SDPA_CUDA_MAX_LEN = 4096

BACKENDS: dict[str, Callable[..., Tensor]] = {
    "eager": eager_attention,
    "sdpa": sdpa_attention,
    "flex": flex_alibi_attention,
}


def choose_backend(
    backend: str, device: torch.device | str, *, k_len: int, grad: bool, window: int | None = None, packed: bool = False
) -> str:
    """The concrete backend for ``backend`` ("auto" resolved by an explicit rule).

    ``auto`` on CUDA: flex when rows are packed (``seq_ids``) or a sliding window is set (its
    block mask skips what no query sees: packed ML-1M rows of 4,096 keep 19 % of the causal
    blocks, 13 % with histories cut to 200, ``benchmarks/attention.py --density``), or when ``k_len > SDPA_CUDA_MAX_LEN``; sdpa
    otherwise (as fast or faster there on the H200 table). On CPU: sdpa, except flex for inputs
    that need no gradient (no flex backward on CPU in torch 2.13) when a sliding window makes
    its block skipping pay (``window`` set and ``k_len >= FLEX_CPU_MIN_LEN``): each new padded
    shape costs 5-30 s of compilation on CPU, while sdpa without gradients works in query chunks
    and never holds a (B, H, L, L) tensor.

    Args:
        backend: "auto" | "flex" | "sdpa" | "eager".
        device: where the attention runs. k_len: Lk. grad: whether a gradient is needed.
        window, packed: the call's sliding window and whether it has ``seq_ids``.

    Raises:
        ValueError: unknown backend name.
    """
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; use one of auto, {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if torch.device(device).type == "cuda":
        return "flex" if packed or window is not None or k_len > SDPA_CUDA_MAX_LEN else "sdpa"
    if window is not None and k_len >= FLEX_CPU_MIN_LEN and not grad:
        return "flex"
    return "sdpa"


def resolve_backend(
    backend: str, q: Tensor, *grad_inputs: Tensor, window: int | None = None, k_len: int = 0, packed: bool = False
) -> str:
    """:func:`choose_backend` for a call with queries ``q`` (B, H, Lq, D) and the tensors that
    may need a gradient (``grad_inputs``: k, v, slopes)."""
    grad = needs_grad(q, *grad_inputs)
    return choose_backend(backend, q.device, k_len=k_len, grad=grad, window=window, packed=packed)


@dataclass(frozen=True)
class BatchMask:
    """The visibility of one batch, built once and passed to every layer's attention.

    Attributes:
        spec: the rules (:class:`MaskSpec`). backend: the resolved backend.
        flex: the flex block mask on the device when ``backend == "flex"``, else None.
        batch: B.
    """

    spec: MaskSpec
    backend: str
    batch: int
    flex: FlexMask | None = None


def batch_mask(
    spec: MaskSpec, batch: int, device: torch.device, *, backend: Backend = "auto", grad: bool = False
) -> BatchMask:
    """Resolve the backend and build the visibility of a batch once, for all its layers.

    Args:
        spec: the batch's rules, from :meth:`MaskSpec.build` (B rows, Lq queries, Lk keys).
        batch: B. device: where q, k, v will be.
        backend: as :func:`alibi_attention`; "auto" goes through :func:`choose_backend`.
        grad: whether the layers will need gradients (decides "auto").

    Returns:
        :class:`BatchMask`; with flex, its BlockMask is built here on ``device``, vectorised (no
        host sync, no Python loop), full blocks marked.

    Raises:
        ValueError: an unknown backend.
    """
    packed = spec.seq_ids is not None
    name = choose_backend(backend, device, k_len=spec.k_len, grad=grad, window=spec.window, packed=packed)
    flex = build_flex_mask(spec, batch, torch.device(device)) if name == "flex" else None
    return BatchMask(spec, name, batch, flex)


def alibi_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    slopes: Tensor,
    *,
    causal: bool = True,
    lengths: Tensor | None = None,
    window: int | None = None,
    backend: Backend = "auto",
    seq_ids: Tensor | None = None,
    sinks: int = 0,
    bias_clamp: float | None = None,
    scale: float | None = None,
    mask: BatchMask | None = None,
) -> Tensor:
    """Multi-head attention whose only position signal is the ALiBi bias (Press et al. 2022).

    Score of query ``i`` and key ``j`` in head ``h``: ``q.k * scale - slopes[h] * (i - j)``
    (``|i - j|`` when not causal), over the keys it may see:

    Args:
        q: (B, H, Lq, D) float. Queries are the LAST Lq of the Lk positions (KV-cache decoding).
        k, v: (B, H, Lk, D), same dtype and device as q, Lk >= Lq.
        slopes: (H,) floating, e.g. :func:`recsys_alibi.model.alibi.alibi_slopes` or the output
            of :class:`recsys_alibi.model.alibi.AlibiSlopes` (gradients flow into it).
        causal: mask keys after the query (``j > i``).
        lengths: (B,) int, valid positions per row, right padding: keys ``>= length`` are masked
            and output rows ``>= length`` are zeros; the masked keys and values are zeroed first,
            so NaN or inf there never reaches a valid row (not with ``mask``: the model's layers
            pass finite padding).
        window: mask keys with ``i - j >= window`` (``|i - j| >= window`` when not causal).
        backend: "auto" | "flex" | "sdpa" | "eager" (see :func:`resolve_backend`). A backend
            that cannot run falls back to sdpa with one logged warning.
        seq_ids: (B, Lk) int, packed rows: attention only between equal ids; id 0 is padding
            (output zero). Each sequence is one contiguous run; no position offsets are needed
            because ALiBi only sees distances.
        sinks: the first ``sinks`` positions of each sequence stay visible outside the window
            (StreamingLLM, Xiao et al. 2023). No effect without a window.
        bias_clamp: ``bias = max(-slope * dist, -bias_clamp)``, bounds the bias so exp() does
            not underflow in low precision.
        scale: score scale, default ``1 / sqrt(D)``.
        mask: the batch's :class:`BatchMask` from :func:`batch_mask` (built once, shared by the
            layers): its rules and backend replace ``causal``, ``lengths``, ``window``,
            ``seq_ids``, ``sinks`` and ``backend``, which must then be left unset.

    Returns:
        (B, H, Lq, D) in ``q.dtype``. Rows with no visible key are zeros, never NaN.

    Raises:
        TypeError: a non-integer ``window`` / ``sinks``, ``lengths`` or ``seq_ids`` of a
            non-integer dtype, slopes not a floating tensor (e.g. a list), q not floating, k or v
            of another dtype than q.
        ValueError: shapes or arguments out of range (head size D < 1, v's D not q's, slopes
            negative or not finite: read on the CPU only; a NaN or infinite ``scale``), unknown backend, or a ``mask`` that
            does not fit q, k or comes with visibility arguments of its own.
    """
    check_call(q, k, v, slopes, bias_clamp)  # before anything reads them (the backend choice)
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number (None: 1 / sqrt(D)), got {scale}")
    if mask is None:
        if lengths is not None:  # validate, then zero the padded keys and values (0 * NaN is NaN)
            pad = MaskSpec.build(  # the inputs were checked above (check_call): the rules only
                q.shape[0], q.shape[2], k.shape[2], q.device, causal=causal, lengths=lengths, window=window,
                seq_ids=seq_ids, sinks=sinks,
            ).padded_keys(k.device)  # fmt: skip
            k, v = k.masked_fill(pad, 0.0), v.masked_fill(pad, 0.0)
        kw = dict(
            causal=causal, lengths=lengths, window=window, seq_ids=seq_ids,
            sinks=sinks, bias_clamp=bias_clamp, scale=scale,
        )  # fmt: skip
        packed = seq_ids is not None
        name = resolve_backend(backend, q, k, v, slopes, window=window, k_len=k.shape[-2], packed=packed)
        return BACKENDS[name](q, k, v, slopes, **kw)
    if lengths is not None or window is not None or seq_ids is not None or sinks or backend != "auto":
        raise ValueError("pass the visibility rules and backend either to batch_mask or to alibi_attention, not both")
    spec = mask.spec
    if (q.shape[0], q.shape[2], k.shape[2]) != (mask.batch, spec.q_len, spec.k_len):
        got = (q.shape[0], q.shape[2], k.shape[2])
        raise ValueError(f"mask is for (B, Lq, Lk) = {(mask.batch, spec.q_len, spec.k_len)}, got {got}")
    kw = dict(spec.rules(), bias_clamp=bias_clamp, scale=scale)
    if mask.backend == "flex":
        return flex_alibi_attention(q, k, v, slopes, mask=mask.flex, **kw)
    return BACKENDS[mask.backend](q, k, v, slopes, **kw)
