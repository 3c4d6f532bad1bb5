"""The training step reads nothing of its tensors on the host (no GPU synchronisation per step).

On the CPU a ``TorchFunctionMode`` records every call that would copy a device tensor to the host
(``.item()``, ``int()``/``bool()`` of a tensor, boolean-mask indexing, ``nonzero``, ``unique``,
...) while the step's forward and backward run with the plain item table and each loss. The
attention function (``recsys_alibi.model.attention``) is replaced there by plain causal SDPA: it
has its own backends and is checked on a GPU by the marked test at the end, which runs the
whole bf16 step under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from recsys_alibi.config import ModelConfig, TrainConfig
from recsys_alibi.data.loader import collate_next_item, collate_packed_next_item
from recsys_alibi.model import transformer
from recsys_alibi.training.losses import LOSSES
from recsys_alibi.training.module import RankerModule

HOST_READS = {
    torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__,
    torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.nonzero, torch.nonzero, torch.argwhere, torch.Tensor.unique,
    torch.unique, torch.masked_select, torch.Tensor.masked_select, torch.Tensor.repeat_interleave,
}  # fmt: skip


class HostReads(TorchFunctionMode):
    """Records ``(function name, caller)`` of every call that needs a tensor's values on the host."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        index = args[1] if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) else ()
        index = index if isinstance(index, tuple) else (index,)
        boolean_index = any(isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in index)
        if func in HOST_READS or boolean_index:
            self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def _causal_sdpa(q, k, v, slopes, **kwargs):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, L, D/H)


def _batches(time_gaps: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    windows = [rng.integers(1, 30, int(n)) for n in rng.integers(3, 17, 8)]
    if time_gaps:
        windows = [(w, rng.integers(1, 6, len(w))) for w in windows]
    return [collate_next_item(windows), collate_packed_next_item(windows, row_len=16)]


def test_host_read_recorder_sees_the_reads_it_looks_for():
    x = torch.tensor([1.0, -2.0, 3.0])
    with HostReads() as reads:
        x.sum().item()
        int(x.argmax())
        x[x > 0].sum()
        torch.nonzero(x)
        (x * 2).exp()  # not a host read
    assert reads.calls == ["item", "__int__", "__getitem__", "nonzero"]


@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("time_gaps", [False, True])
def test_training_step_outside_attention_reads_nothing_on_the_host(monkeypatch, loss, time_gaps):
    monkeypatch.setattr(transformer, "alibi_attention", _causal_sdpa)
    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=1, max_len=16, embedding_backend="torch",
                      time_gap_buckets=6 if time_gaps else 0)  # fmt: skip
    negatives = {"num_negatives": 7} if loss in ("sampled_softmax", "gbce") else {}  # the losses that take it
    module = RankerModule(cfg, TrainConfig(loss=loss, **negatives), 30, torch.ones(31, dtype=torch.int64))
    module.log = lambda *args, **kwargs: None  # no trainer attached
    batches = _batches(time_gaps)
    assert all("target_positions" in b for b in batches)
    for batch in batches + [{k: v for k, v in b.items() if k != "target_positions"} for b in batches]:
        with HostReads() as reads:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                step_loss = module.training_step(batch, 0)
            step_loss.backward()
        assert reads.calls == [], f"host reads in the {loss} step: {reads.calls}"
        assert torch.isfinite(step_loss.detach()).all()


def test_step_with_the_collated_target_positions_equals_the_step_over_every_position():
    """The gather by ``target_positions`` (T rows) and the loss over all B * L rows with target 0
    ignored are the same loss and gradients."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=1, max_len=16, dropout=0.0, attention_backend="sdpa",
                      embedding_backend="torch")  # fmt: skip
    module = RankerModule(cfg, TrainConfig(), 30, torch.ones(31, dtype=torch.int64))
    module.log = lambda *args, **kwargs: None
    for batch in _batches(False):
        results = []
        for given in (batch, {k: v for k, v in batch.items() if k != "target_positions"}):
            module.zero_grad()
            loss = module.training_step(given, 0)
            loss.backward()
            results.append((float(loss), [p.grad.clone() for p in module.parameters() if p.grad is not None]))
        assert batch["target_positions"].numel() == int((batch["targets"] > 0).sum())
        assert abs(results[0][0] - results[1][0]) < 1e-6
        for a, b in zip(results[0][1], results[1][1], strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["flex", "sdpa"])
def test_cuda_bf16_training_step_has_no_host_synchronisation(backend):
    """The whole step (embeddings, ALiBi attention, fused loss, backward) on CUDA in bf16."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=2, n_layers=2, max_len=16, attention_backend=backend,
                      embedding_backend="torch", dropout=0.1)  # fmt: skip
    module = RankerModule(cfg, TrainConfig(), 30, torch.ones(31, dtype=torch.int64)).cuda()
    module.log = lambda *args, **kwargs: None
    batch = {k: v.cuda() for k, v in _batches(False)[1].items()}  # packed rows
    for check in (False, True):  # the first step compiles (flex) and may synchronise
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error" if check else "default")
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = module.training_step(batch, 0)
            loss.backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss.detach()).all()
