"""ALiBi numerics: where the linear bias makes attention weights vanish, per head and dtype.

ALiBi (Press, Smith & Lewis, "Train Short, Test Long", ICLR 2022) adds ``-m_h * d`` to the
score of a key ``d = i - j`` positions behind the query. After the softmax subtracts the row
maximum (the key at ``d = 0`` when the scores are equal), the weight of a key at distance ``d``
is ``exp(-m_h * d) / Z`` with ``Z = sum_d' exp(-m_h * d')``. Far enough back, ``exp()`` falls
below the dtype's smallest normal number (precision loss, or zero where a kernel flushes
subnormals) and then to exactly zero: the key gets no weight and no gradient, and a head with
such keys inside its context "goes blind" there.

The floors of ``exp(x)`` per dtype are in :mod:`recsys_alibi.diagnostics.paths`. A free head
(slope 0, ``model.free_heads``) has no bias and is never blind.

Which dtype the softmax really runs in depends on the attention backend, so the module keeps a
registry of :class:`~recsys_alibi.diagnostics.paths.SoftmaxPath` (``SOFTMAX_PATHS``) measured with :func:`probe_zero_share`
on the backends of :mod:`recsys_alibi.model.attention` (see ``docs/numerics.md``). Remedies:
clamp the bias (``model.bias_clamp``), bound the context with a sliding window
(``model.window``; StreamingLLM sink tokens, Xiao et al. 2023, still get the full bias and vanish
too unless the bias is clamped), or use a larger ``model.max_bias`` (flatter slopes).

Modules, one concept each: :mod:`~recsys_alibi.diagnostics.paths` (dtypes and softmax paths),
:mod:`~recsys_alibi.diagnostics.distances` (where weights vanish, remedy limits),
:mod:`~recsys_alibi.diagnostics.report` (per-head diagnosis and the report),
:mod:`~recsys_alibi.diagnostics.probe` (measuring a backend). Every public name is re-exported
here: ``from recsys_alibi.diagnostics import underflow_distance`` is the contract.
"""

from recsys_alibi.diagnostics.distances import (
    bias_clamp_limit,
    min_max_bias,
    path_normal_distance,
    path_zero_distance,
    subnormal_distance,
    underflow_distance,
    zero_share,
)
from recsys_alibi.diagnostics.paths import DTYPES, EXP_DTYPES, SOFTMAX_PATHS, SoftmaxPath, exp_path, resolve_dtype, softmax_paths
from recsys_alibi.diagnostics.probe import probe_zero_share
from recsys_alibi.diagnostics.report import DiagnosisReport, HeadDiagnosis, PathRemedy, diagnose, diagnose_heads

__all__ = [
    "DTYPES",
    "EXP_DTYPES",
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
