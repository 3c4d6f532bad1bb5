"""ALiBi: per-head slopes and the linear distance bias.

ALiBi (Press, Smith & Lewis, "Train Short, Test Long: Attention with Linear Biases Enables
Input Length Extrapolation", ICLR 2022) adds ``-m_h * (i - j)`` to the attention score of
query ``i`` and key ``j`` in head ``h``; there is no position embedding at all. The slopes
``m_h`` form a geometric sequence fixed before training (optionally learnable here).

Heads that can see far (``model.slopes``, ``model.free_heads``, ``model.slope_floor``): the
paper's scheme discounts an event ``d`` back by ``m_h * d`` nats, so with the default 4 heads
even the flattest head (1/256) discounts an event 2,048 back by 8 nats. Three options keep
some heads' bias small at thousands of positions, chosen by config (:func:`head_slopes`):

* ``slopes: wide`` -- the steepest head keeps the paper's slope ``2^(-8/H)`` and the others
  are spread geometrically down to ``1 / model.long_context``, so the flattest head discounts
  the far end of the longest context it will read by 1 nat (the paper's geometric spacing,
  Press et al. 2022, Sec. 3, over a range set by the context instead of ``max_bias = 8``);
* ``free_heads: k`` -- the ``k`` flattest heads get slope exactly 0: content-only heads with
  no position signal at all ("NoPE" heads: Kazemnejad et al., "The Impact of Positional
  Encoding on Length Generalization in Transformers", NeurIPS 2023, show causal attention
  needs no position encoding; hybrids that keep some attention without position bias beside
  biased attention are used by long-context models, e.g. Yang et al., "RoPE to NoPE and Back
  Again", 2025). Causal masking still orders events, and the biased heads keep the recency;
* ``learnable_slopes`` with ``slope_floor: zero`` -- ``m_h = relu(w_h)``, initialised to the
  scheme, so a slope may fall to exactly 0 in training (it then stays there: the head has
  become a free head); ``slope_floor: positive`` is the softplus form (slopes stay > 0);
* ``free_head_scale: log_beyond`` (with ``free_heads >= 1``) -- past the training length a free
  head's scores are multiplied by ``log(n) / log(max_len)`` for a query that sees ``n`` keys
  (:func:`free_head_query_scale`), so a key whose content margin was learnt at the training
  length keeps its weight among thousands of keys instead of being diluted as ``1 / n``.
  With ``max_bias: 4`` (one steep local head of slope 1/2) and three such heads of four, the
  long-range probe keeps the cue at 2,048 events: HR@10 0.90 / 0.88 (fp32 / bf16) over eight
  training runs, 14 of 16 runs >= 0.8 (docs/numerics.md).

Positions: a bias for ``q_len`` queries and ``k_len`` keys puts the keys at positions
``0 .. k_len - 1`` and the queries at the LAST ``q_len`` of them (``k_len - q_len .. k_len - 1``),
which is what KV-cache decoding needs.
"""

from __future__ import annotations

import math
import numbers
import operator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from recsys_alibi.config import ModelConfig

__all__ = [
    "AlibiSlopes", "alibi_bias", "alibi_slopes", "check_slopes", "distances", "head_slopes", "int_arg", "wide_slopes",
]  # fmt: skip


def int_arg(name: str, value: object) -> int:
    """``value`` as a Python int: an int, a NumPy integer or a 0-d integer tensor.

    Raises:
        TypeError: naming ``name``, for anything else (a float such as 2.5 or NaN, a bool, a str, None).
    """
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")


def check_slopes(slopes: object) -> None:
    """Validate ALiBi slopes: a 1-D floating tensor, every entry finite and >= 0 (0: a free head).

    The entries are read only when ``slopes`` is on the CPU (elsewhere that would be a host sync
    on every attention call).

    Raises:
        TypeError: ``slopes`` is not a tensor (e.g. a list) or not floating.
        ValueError: ``slopes`` is not 1-D, or has a negative, infinite or NaN entry.
    """
    if not isinstance(slopes, Tensor):
        raise TypeError(f"slopes must be a torch.Tensor of shape (H,), got {type(slopes).__name__}")
    if not slopes.is_floating_point():
        raise TypeError(f"slopes must be a floating tensor, got {slopes.dtype}")
    if slopes.dim() != 1:
        raise ValueError(f"slopes must be (H,), got shape {tuple(slopes.shape)}")
    if slopes.device.type == "cpu" and slopes.numel():
        lo, hi = torch.aminmax(slopes.detach())
        if not (float(lo) >= 0 and float(hi) < math.inf):  # NaN fails both
            raise ValueError(f"slopes must be finite and >= 0, got {slopes.detach().tolist()}")


def _power_of_two_slopes(n: int, max_bias: float) -> list[float]:
    # m_h = 2^(-max_bias * h / n), h = 1..n
    return [2.0 ** (-max_bias * h / n) for h in range(1, n + 1)]


def alibi_slopes(n_heads: int, max_bias: float = 8.0) -> Tensor:
    """ALiBi slopes, one per head.

    ``m_h = 2^(-max_bias * h / n)`` for ``h = 1..n`` when ``n`` is a power of two (Press et
    al. 2022). Otherwise the rule of the paper's reference code: the ``c`` slopes of the
    closest lower power of two ``c``, followed by the 1st, 3rd, 5th, ... slopes of the ``2c``
    scheme (those that interleave with the first ``c``) until there are ``n`` slopes.

    Example: ``n=8`` gives 1/2, 1/4, ..., 1/256; ``n=6`` gives 1/4, 1/16, 1/64, 1/256 (the
    4-head scheme) then 1/2, 1/8 (the 1st and 3rd of the 8-head scheme).

    Args:
        n_heads: number of heads H, >= 1.
        max_bias: the exponent of the smallest slope, ``2^-max_bias`` (8 in the paper), > 0.

    Returns:
        (H,) float32 on the CPU, computed in float64 and rounded once; every entry > 0.

    Raises:
        TypeError: ``n_heads`` is not an integer (2.5, "4", None, True) or ``max_bias`` is not a
            real number.
        ValueError: ``n_heads < 1``, ``max_bias <= 0`` or NaN, or ``max_bias`` so large (>= 150)
            that the smallest slope ``2^-max_bias`` rounds to 0 in float32.
    """
    n_heads = int_arg("n_heads", n_heads)
    if n_heads < 1:
        raise ValueError(f"n_heads must be >= 1, got {n_heads}")
    if isinstance(max_bias, bool) or not isinstance(max_bias, numbers.Real):
        raise TypeError(f"max_bias must be a real number, got {max_bias!r} ({type(max_bias).__name__})")
    if not max_bias > 0:
        raise ValueError(f"max_bias must be > 0, got {max_bias}")
    c = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = _power_of_two_slopes(c, max_bias)
    if c < n_heads:
        slopes += _power_of_two_slopes(2 * c, max_bias)[0::2][: n_heads - c]
    out = torch.tensor(slopes, dtype=torch.float64).to(torch.float32)
    if bool((out == 0).any()):  # a silent free head otherwise
        raise ValueError(f"max_bias={max_bias} is too large: slope 2^-{max_bias} rounds to 0 in float32 (use < 150)")
    return out


def wide_slopes(n_heads: int, long_context: int) -> Tensor:
    """Slopes spread from the paper's steepest head down to ``1 / long_context``.

    ``m_1 = 2^(-8/H)`` (the steepest slope of :func:`alibi_slopes` with ``max_bias = 8``) and
    ``m_H = 1 / long_context``, geometric in between: ``m_h = m_1 (m_H / m_1)^((h-1)/(H-1))``,
    so the flattest head's bias at the far end of a ``long_context`` row is -1 nat. A single
    head (H = 1) gets ``1 / long_context``. Where ``1 / long_context >= m_1`` (short contexts)
    this is the paper's scheme itself.

    Args:
        n_heads: H >= 1.
        long_context: the longest context (events) the model will read, >= 2.

    Returns:
        (H,) float32, descending (steepest first), computed in float64.

    Raises:
        ValueError: ``n_heads < 1`` or ``long_context < 2``.

    Example: ``wide_slopes(4, 2048)`` gives 1/4, 1/32, 1/256, 1/2048.
    """
    if n_heads < 1:
        raise ValueError(f"n_heads must be >= 1, got {n_heads}")
    if long_context < 2:
        raise ValueError(f"long_context must be >= 2, got {long_context}")
    first, last = 2.0 ** (-8.0 / n_heads), 1.0 / long_context
    if last >= first:
        return alibi_slopes(n_heads)
    if n_heads == 1:
        return torch.tensor([last], dtype=torch.float64).to(torch.float32)
    steps = torch.arange(n_heads, dtype=torch.float64) / (n_heads - 1)  # (H,) 0..1
    return (first * (last / first) ** steps).to(torch.float32)


SLOPE_SCHEMES = {
    "geometric": lambda cfg: alibi_slopes(cfg.n_heads, cfg.max_bias),
    "wide": lambda cfg: wide_slopes(cfg.n_heads, cfg.long_context),
}


def head_slopes(cfg: ModelConfig) -> Tensor:
    """The initial (H,) float32 slopes of a model config: scheme, then free heads.

    ``cfg.slopes`` picks the scheme from ``SLOPE_SCHEMES`` (``geometric``: :func:`alibi_slopes`
    with ``cfg.max_bias``; ``wide``: :func:`wide_slopes` with ``cfg.long_context``); then the
    ``cfg.free_heads`` smallest slopes (ties: the earlier head) are set to exactly 0.

    Returns:
        (H,) float32 on the CPU, every entry >= 0.
    """
    slopes = SLOPE_SCHEMES[cfg.slopes](cfg).clone()
    if cfg.free_heads:
        order = torch.argsort(slopes, stable=True)  # flattest first
        slopes[order[: cfg.free_heads]] = 0.0
    return slopes


def free_head_query_scale(cfg: ModelConfig, positions: Tensor) -> Tensor | None:
    """Per-head, per-query factors on the queries of the free heads (``model.free_head_scale``).

    With ``"log_beyond"`` a free head's scores are multiplied by ``max(1, log(n) / log(max_len))``,
    where ``n = position + 1`` is the number of keys the (causal) query sees: 1 within the
    training length, so the heads train exactly as unscaled ones, and growing as ``log n`` past
    it, so the weight that a key with the content margin learnt in training gets does not fall
    as ``1 / n`` among thousands of keys. Log-length scaled attention: Chiang & Cholak 2022,
    "Overcoming a theoretical limitation of self-attention"; "scalable softmax", Nakanishi 2025;
    applied only past the training length as YaRN's attention temperature is (Peng et al.
    2023). Scaling at every ``n`` (1 only at ``n = max_len``) was screened and left some
    training runs unable to learn the probe (docs/numerics.md). Position-biased heads keep
    factor 1 (their bias already bounds their range).

    Args:
        cfg: ``n_heads``, ``free_heads``, ``free_head_scale``, ``max_len`` and the slope scheme.
        positions: (B, L) int64, each query's position inside its own sequence (0 = first event).

    Returns:
        (B, H, L, 1) float32 on ``positions.device``, or None when the option is off.
    """
    if cfg.free_head_scale == "none":  # the config refuses a scale without free heads
        return None
    free = (head_slopes(cfg) == 0).to(positions.device)  # (H,)
    factor = (torch.log1p(positions.float()) / math.log(cfg.max_len)).clamp(min=1.0)  # (B, L): max(1, log n / log max_len)
    ones = torch.ones_like(factor)
    return torch.where(free[None, :, None], factor[:, None, :], ones[:, None, :]).unsqueeze(-1)


def distances(
    q_len: int, k_len: int | None = None, *, causal: bool = True, device: torch.device | None = None
) -> Tensor:
    """Signed query-key distances ``i - j`` (``|i - j|`` when not causal).

    Returns:
        (q_len, k_len) int64; queries are the last ``q_len`` of the ``k_len`` positions.

    Raises:
        TypeError: ``q_len`` or ``k_len`` is not an integer.
        ValueError: ``q_len < 1`` or ``k_len < q_len``.
    """
    q_len = int_arg("q_len", q_len)
    k_len = q_len if k_len is None else int_arg("k_len", k_len)
    if q_len < 1 or k_len < q_len:
        raise ValueError(f"need 1 <= q_len <= k_len, got q_len={q_len}, k_len={k_len}")
    i = torch.arange(k_len - q_len, k_len, device=device)[:, None]  # (Lq, 1)
    j = torch.arange(k_len, device=device)[None, :]  # (1, Lk)
    d = i - j
    return d if causal else d.abs()


def alibi_bias(
    slopes: Tensor,
    q_len: int,
    k_len: int | None = None,
    *,
    causal: bool = True,
    bias_clamp: float | None = None,
) -> Tensor:
    """The ALiBi bias for every head, query and key (Press et al. 2022).

    Entry ``[h, r, j]`` with query position ``i = k_len - q_len + r`` is ``-slopes[h] * (i - j)``
    for ``j <= i`` and ``-inf`` for ``j > i`` when ``causal``; ``-slopes[h] * |i - j|`` when not.
    With ``bias_clamp`` the finite entries are ``max(-slope * dist, -bias_clamp)``. The product
    is computed in float64 for 16-bit slopes (in their own dtype for float32/float64) and
    rounded once to ``slopes.dtype``, so the distance is never rounded first; in float16 a
    magnitude above 65504 rounds to ``-inf``. Differentiable with respect to ``slopes``
    (learnable slopes).

    Args:
        slopes: (H,) floating, every entry finite and >= 0, e.g. from :func:`alibi_slopes`.
        q_len: number of queries Lq, the last Lq positions.
        k_len: number of keys Lk (default ``q_len``).
        causal: mask keys after the query with ``-inf``.
        bias_clamp: lower bound on the magnitude of the bias (> 0), or None.

    Returns:
        (H, Lq, Lk) in ``slopes.dtype`` on ``slopes.device``.

    Raises:
        TypeError: ``slopes`` is not a floating tensor, or ``q_len`` / ``k_len`` not integers.
        ValueError: ``slopes`` is not 1-D or has a negative or non-finite entry (checked on
            the CPU), bad lengths, or ``bias_clamp <= 0``.
    """
    check_slopes(slopes)
    if bias_clamp is not None and not bias_clamp > 0:
        raise ValueError(f"bias_clamp must be > 0, got {bias_clamp}")
    d = distances(q_len, k_len, causal=causal, device=slopes.device)  # (Lq, Lk)
    ct = torch.float64 if slopes.element_size() < 4 else slopes.dtype  # exact for 16-bit slopes
    bias = -slopes.to(ct)[:, None, None] * d.abs().to(ct)  # (H, Lq, Lk)
    if bias_clamp is not None:
        bias = bias.clamp(min=-bias_clamp)
    bias = bias.to(slopes.dtype)
    if causal:
        bias = bias.masked_fill(d < 0, float("-inf"))
    return bias


class AlibiSlopes(nn.Module):
    """The (H,) slope vector as a module, fixed or learnable.

    Fixed: a buffer equal to ``init`` (default :func:`alibi_slopes`). Learnable with
    ``floor="positive"``: ``m_h = softplus(w_h) + c_h`` with ``w = log(expm1(m0))``, the inverse
    softplus of the initial slopes ``m0``, and ``c`` a constant buffer ``m0 - softplus(w)`` of at
    most one float32 ulp of ``m0``, so that the initial slopes equal ``m0`` bit for bit (float32
    softplus alone cannot reach every value). The correction is dropped where it would make a
    slope <= 0, so slopes stay positive. Learnable with ``floor="zero"``: ``m_h = relu(w_h)``,
    ``w = m0``: a slope may reach exactly 0 (and then keeps a zero gradient: a free head).
    Heads whose initial slope is 0 (``model.free_heads``) stay at 0 in every form.

    Args:
        n_heads: H.
        max_bias: see :func:`alibi_slopes` (used when ``init`` is None).
        learnable: train the slopes.
        init: (H,) initial slopes >= 0, e.g. :func:`head_slopes`; None: the paper's scheme.
        floor: ``"positive"`` (softplus) or ``"zero"`` (relu), for learnable slopes.

    Example:
        >>> AlibiSlopes(8)().tolist()[:2]
        [0.5, 0.25]

    ``forward()`` returns (H,) float32 on the module's device.

    Raises:
        ValueError: ``init`` is not (H,) or has a negative entry; unknown ``floor``.
    """

    def __init__(
        self,
        n_heads: int,
        max_bias: float = 8.0,
        learnable: bool = False,
        *,
        init: Tensor | None = None,
        floor: str = "positive",
    ) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.max_bias = max_bias
        self.learnable = learnable
        self.floor = floor
        init = alibi_slopes(n_heads, max_bias) if init is None else init.detach().to(torch.float32).cpu()
        if init.shape != (n_heads,) or bool((init < 0).any()):
            raise ValueError(f"init must be ({n_heads},) slopes >= 0, got {init.tolist()}")
        if floor not in ("positive", "zero"):
            raise ValueError(f"floor must be 'positive' or 'zero', got {floor!r}")
        free = init == 0
        self.register_buffer("free", free, persistent=False)
        if learnable and floor == "zero":
            self.raw = nn.Parameter(init.clone())
        elif learnable:
            raw = torch.log(torch.expm1(init.double().clamp(min=1e-30))).float()
            self.raw = nn.Parameter(raw)
            self.register_buffer("correction", init - F.softplus(raw), persistent=True)
        else:
            self.register_buffer("fixed", init, persistent=False)

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> "AlibiSlopes":
        """The slopes of a model config (:func:`head_slopes`, ``learnable_slopes``, ``slope_floor``)."""
        return cls(cfg.n_heads, cfg.max_bias, cfg.learnable_slopes, init=head_slopes(cfg), floor=cfg.slope_floor)

    def forward(self) -> Tensor:
        if not self.learnable:
            return self.fixed
        if self.floor == "zero":
            m = F.relu(self.raw)
        else:
            soft = F.softplus(self.raw)
            m = soft + self.correction
            m = torch.where(m > 0, m, soft)
        return torch.where(self.free, torch.zeros_like(m), m)

    def extra_repr(self) -> str:
        free = int(self.free.sum())
        return (
            f"n_heads={self.n_heads}, max_bias={self.max_bias}, learnable={self.learnable}, "
            f"floor={self.floor}, free_heads={free}"
        )
