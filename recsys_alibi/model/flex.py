"""The flex backend: compiled FlexAttention with ALiBi in a ``score_mod`` and a ``BlockMask``.

The bias ``-slope[h] * (i - j)`` is computed inside the fused kernel; nothing of size L x L is
materialised. Each call runs a ``score_mod`` specialised to what it needs
(:mod:`recsys_alibi.model.score_mods`: causal or symmetric, clamp or none, decoding offset or
none; fixed slopes detached so that only learnable slopes get a gradient) under the batch's
:class:`~recsys_alibi.model.block_mask.FlexMask`, built once per batch on the device and shared
by every layer and by the backward pass (:func:`recsys_alibi.model.attention.batch_mask`), or
per call when no batch mask is given (cached when it depends on the shape only).

Shapes are bucketed (B to a power of two, Lq and Lk to multiples of 128; the padding is masked,
costs no attention blocks, and is cut off again), so one compiled kernel serves every call of
one padded shape and specialisation.

Kernel options (CUDA): block sizes, warps and pipeline stages pinned per GPU architecture and
head width (:func:`pinned_kernel_options`), starting from the Hopper defaults of torch's own flex
heuristics (``torch/_inductor/template_heuristics/triton.py``), so an upgrade of torch does not
silently change them; ``FlexAlibi(kernel_options=...)`` or ``flex_alibi_attention(...,
kernel_options=...)`` override them (``benchmarks/attention.py --kernel-options``). On CPU
torch's defaults are kept (the C++ flex kernel takes no such options).

CPU (torch 2.13): forward only; inputs that need gradients fall back to sdpa with one warning.
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._dynamo.exc import FailOnRecompileLimitHit
from torch.nn.attention.flex_attention import flex_attention

from recsys_alibi.model.block_mask import FlexMask, bucket_batch, build_flex_mask, round_up
from recsys_alibi.model.masks import MaskSpec, zero_rows_of
from recsys_alibi.model.score_mods import ScoreModKey, alibi_score_mod
from recsys_alibi.model.sdpa import needs_grad, sdpa_attention

__all__ = ["FlexAlibi", "flex_alibi_attention", "flex_runner", "pinned_kernel_options"]

logger = logging.getLogger(__name__)

# (compute capability major, head width D) -> options; Hopper (sm90) values are torch 2.13's
# defaults for bf16/fp16 there (forward BLOCK_M x BLOCK_N, warps, stages; backward M1 N1 M2 N2).
# They are a pinned starting point, to be re-tuned on the GPU (docs/benchmarks.md, "On a GPU").
_PINNED: dict[tuple[int, int], dict[str, int]] = {
    (9, 64): {
        "fwd_BLOCK_M": 128, "fwd_BLOCK_N": 128, "fwd_num_warps": 4, "fwd_num_stages": 3,
        "bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 128, "bwd_BLOCK_M2": 128, "bwd_BLOCK_N2": 64,
        "bwd_num_warps": 8, "bwd_num_stages": 3,
    },
    (9, 128): {
        "fwd_BLOCK_M": 128, "fwd_BLOCK_N": 64, "fwd_num_warps": 8, "fwd_num_stages": 3,
        "bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 128, "bwd_BLOCK_M2": 128, "bwd_BLOCK_N2": 64,
        "bwd_num_warps": 8, "bwd_num_stages": 3,
    },
}  # fmt: skip


def pinned_kernel_options(device: torch.device, head_dim: int, dtype: torch.dtype) -> dict[str, int]:
    """Pinned flex ``kernel_options`` for this device, head width D and dtype.

    Returns:
        The options for a 16-bit dtype on a CUDA architecture with a pinned entry (Hopper, D = 64
        or 128); ``{}`` (torch's own defaults) on CPU, in float32 and elsewhere.
    """
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return {}
    major, _ = torch.cuda.get_device_capability(device)
    return dict(_PINNED.get((major, head_dim), {}))


class FlexAlibi:
    """Compiled ALiBi FlexAttention with per-shape caches.

    Holds one ``torch.compile(flex_attention, dynamic=False)`` callable (dynamo keys its graphs
    by padded shape and specialisation), the block masks that depend on the shape only (LRU),
    the kernel-option override, and the set of fallback warnings already logged.

    Args:
        max_cached_masks: shape-only block masks kept.
        kernel_options: used instead of :func:`pinned_kernel_options` on CUDA when given.
        compiled: False runs flex_attention uncompiled (it materialises the scores: a reference
            for tests of every specialisation in float64, never a fast path).
        recompile_limit: graphs dynamo may compile for flex_attention in this process (one per
            padded shape and specialisation). Past it a call that needs a new graph raises
            dynamo's ``FailOnRecompileLimitHit`` (which :func:`flex_alibi_attention` answers with
            sdpa and one warning) instead of running flex uncompiled, which would materialise
            the L x L scores.
    """

    def __init__(
        self,
        max_cached_masks: int = 16,
        kernel_options: Mapping[str, int] | None = None,
        compiled: bool = True,
        recompile_limit: int = 64,
    ) -> None:
        self._compiled = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention
        self.recompile_limit = recompile_limit
        self._masks: OrderedDict[tuple, FlexMask] = OrderedDict()
        self._max_masks = max_cached_masks
        self._warned: set[str] = set()
        self.kernel_options = None if kernel_options is None else dict(kernel_options)
        self.failed: set[tuple] = set()  # signatures that failed to compile or run
        self.over_limit: set[tuple] = set()  # calls that needed a graph past recompile_limit

    def warn_once(self, key: str, message: str) -> None:
        """Log ``message`` as a warning the first time ``key`` is seen."""
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)

    def mask_for(self, spec: MaskSpec, batch: int, device: torch.device) -> FlexMask:
        """The call's FlexMask: built on the device; cached when it depends on the shape only."""
        if spec.has_batch_data:
            return build_flex_mask(spec, batch, device)
        key = (batch, spec.q_len, spec.k_len, spec.causal, spec.window, spec.sinks, str(device))
        mask = self._masks.get(key)
        if mask is None:
            mask = self._masks[key] = build_flex_mask(spec, batch, device)
            if len(self._masks) > self._max_masks:
                self._masks.popitem(last=False)
        self._masks.move_to_end(key)
        return mask

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        slopes: Tensor,
        mask: FlexMask,
        *,
        bias_clamp: float | None = None,
        scale: float | None = None,
        with_bias: bool = True,
        kernel_options: Mapping[str, int] | None = None,
    ) -> Tensor:
        """Flex attention of (B, H, Lq, D) queries under ``mask``; see :func:`flex_alibi_attention`.

        Returns:
            (B, H, Lq, D) in ``q.dtype``, rows of padding not yet zeroed.
        """
        b, _, lq, d = q.shape
        spec = mask.spec
        score_mod = None
        if with_bias:
            m = slopes.to(device=q.device, dtype=torch.promote_types(q.dtype, torch.float32))
            if not needs_grad(slopes):
                m = m.detach()  # fixed slopes: a constant of the backward, no per-score reduction
            key = ScoreModKey(causal=spec.causal, clamp=bias_clamp, offset=spec.q_offset != 0)
            score_mod = alibi_score_mod(key, m, mask.offset)
        pad_b, pad_q, pad_k = mask.batch_pad - b, mask.q_pad - lq, mask.k_pad - spec.k_len
        qp = F.pad(q, (0, 0, 0, pad_q, 0, 0, 0, pad_b)) if pad_q or pad_b else q  # (B_pad, H, q_pad, D)
        kp = F.pad(k, (0, 0, 0, pad_k, 0, 0, 0, pad_b)) if pad_k or pad_b else k  # (B_pad, H, k_pad, D)
        vp = F.pad(v, (0, 0, 0, pad_k, 0, 0, 0, pad_b)) if pad_k or pad_b else v
        if kernel_options is None:
            kernel_options = self.kernel_options
        if kernel_options is None:
            kernel_options = pinned_kernel_options(q.device, d, q.dtype)
        # one graph per padded shape and specialisation; allow more than dynamo's default 8, and
        # past that raise (the caller falls back to sdpa) rather than run flex_attention uncompiled
        with torch._dynamo.config.patch(recompile_limit=self.recompile_limit, fail_on_recompile_limit_hit=True):
            out = self._compiled(
                qp, kp, vp, score_mod=score_mod, block_mask=mask.block_mask, scale=scale,
                kernel_options=dict(kernel_options) or None,
            )  # fmt: skip
        return out[:b, :, :lq]


@functools.lru_cache(maxsize=1)
def flex_runner() -> FlexAlibi:
    """The process-wide :class:`FlexAlibi` (created on first use)."""
    return FlexAlibi()


def flex_alibi_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    slopes: Tensor,
    *,
    causal: bool = True,
    lengths: Tensor | None = None,
    window: int | None = None,
    seq_ids: Tensor | None = None,
    sinks: int = 0,
    bias_clamp: float | None = None,
    scale: float | None = None,
    with_bias: bool = True,
    mask: FlexMask | None = None,
    kernel_options: Mapping[str, int] | None = None,
) -> Tensor:
    """ALiBi attention with compiled FlexAttention; falls back to sdpa with one warning.

    Arguments and result as :func:`recsys_alibi.model.attention.alibi_attention`, plus:

    Args:
        with_bias: False drops the ALiBi bias (benchmarks: the cost of the bias itself).
        mask: the batch's :class:`FlexMask` (built once per batch and shared by the layers);
            when given, its rules replace ``causal``, ``lengths``, ``window``, ``seq_ids`` and
            ``sinks``.
        kernel_options: flex kernel options instead of the pinned ones (CUDA).

    Falls back when gradients are needed on CPU (no flex backward there in torch 2.13), for float64 inputs (no
    Inductor kernel), when compiling fails for a shape (remembered: that shape is not tried again; the
    warning gives the error's first line), and for calls that would need a new compiled graph once the
    runner's ``recompile_limit`` is reached (graphs already compiled keep running; one warning). Empty
    inputs (B or H = 0) go to sdpa without compiling and without a warning.

    Returns:
        (B, H, Lq, D) in ``q.dtype``; padded and empty rows are zeros.
    """
    if mask is None:
        kw = dict(causal=causal, lengths=lengths, window=window, seq_ids=seq_ids, sinks=sinks)
        spec = MaskSpec.from_inputs(q, k, v, slopes, bias_clamp=bias_clamp, **kw)
    else:
        spec, kw = mask.spec, mask.spec.rules()
    kw["bias_clamp"] = bias_clamp
    runner = flex_runner()
    fallback_slopes = slopes if with_bias else torch.zeros_like(slopes)
    if q.device.type == "cpu" and needs_grad(q, k, v, slopes):
        runner.warn_once(
            "cpu-grad", "flex attention has no backward on CPU (torch 2.13); using sdpa for inputs that need gradients"
        )
        return sdpa_attention(q, k, v, fallback_slopes, scale=scale, **kw)
    if q.dtype == torch.float64:  # Inductor lowers no float64 flex kernel: its failure is an 85-line IR dump
        runner.warn_once("float64", "flex attention has no float64 kernel; using sdpa for float64 inputs")
        return sdpa_attention(q, k, v, fallback_slopes, scale=scale, **kw)
    if q.numel() == 0:  # nothing to compute (flex cannot compile H = 0)
        return sdpa_attention(q, k, v, fallback_slopes, scale=scale, **kw)
    b, h, lq, d = q.shape
    signature = (bucket_batch(b), h, round_up(lq), round_up(spec.k_len), d, q.dtype, str(q.device))
    # what picks a graph: the shape and every rule the mask and score functions close over (a window, sinks,
    # packing, padding), so a call past the limit does not bar a graph compiled before it for another rule
    graph = (signature, spec.causal, spec.q_offset != 0, spec.window, spec.sinks, spec.seq_ids is not None,
             spec.lengths is not None, bias_clamp, scale, with_bias)  # fmt: skip
    if signature not in runner.failed and graph not in runner.over_limit:
        try:
            fm = runner.mask_for(spec, b, q.device) if mask is None else mask
            out = runner(
                q, k, v, slopes, fm, bias_clamp=bias_clamp, scale=scale, with_bias=with_bias,
                kernel_options=kernel_options,
            )  # fmt: skip
            return zero_rows_of(out, spec.zero_rows(spec.q_positions(q.device)))
        except FailOnRecompileLimitHit:  # not a property of the shape: its compiled graphs keep running
            runner.over_limit.add(graph)  # not tried again (each try logs dynamo's warning)
            runner.warn_once(
                "recompile-limit",
                f"flex attention reached its limit of {runner.recompile_limit} compiled graphs in this process; "
                "using sdpa for calls that would need a new one",
            )
            return sdpa_attention(q, k, v, fallback_slopes, scale=scale, **kw)
        except Exception as err:  # compile/codegen failures surface as many exception types
            runner.failed.add(signature)
            runner.warn_once(
                f"fail-{type(err).__name__}",
                f"flex attention failed for shape {tuple(q.shape)} ({type(err).__name__}: "
                f"{str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}); using sdpa",  # not the IR dump
            )
    return sdpa_attention(q, k, v, fallback_slopes, scale=scale, **kw)
