"""ALiBi numerics: exact underflow distances, per-backend predictions against measurement, the report."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from recsys_alibi.config import load_config
from recsys_alibi.diagnostics import (
    DiagnosisReport,
    bias_clamp_limit,
    diagnose,
    diagnose_heads,
    exp_path,
    min_max_bias,
    path_zero_distance,
    probe_zero_share,
    resolve_dtype,
    softmax_paths,
    subnormal_distance,
    underflow_distance,
    zero_share,
)
from recsys_alibi.model.alibi import alibi_slopes
from recsys_alibi.model.masks import MaskSpec

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def _all_scheme_slopes() -> list[float]:
    """Every distinct slope of the default scheme (max_bias 8) for H = 1..32."""
    return sorted({float(s) for h in range(1, 33) for s in alibi_slopes(h)})


def _brute_first(slope: float, dtype: torch.dtype, below_normal: bool) -> int:
    """Smallest d with exp((-slope * d in float64) cast to dtype) == 0 (or < smallest normal), by scanning."""
    limit = int(120 / slope) + 16  # exp(-120) is zero in every dtype here
    d = torch.arange(limit + 1, dtype=torch.float64)
    e = torch.exp((-slope * d).to(dtype))
    hit = e < torch.finfo(dtype).smallest_normal if below_normal else e == 0
    return int(torch.nonzero(hit)[0])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_underflow_distance_equals_brute_force_for_every_head(dtype):
    for slope in _all_scheme_slopes():
        assert underflow_distance(slope, dtype) == _brute_first(slope, dtype, below_normal=False), slope


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_subnormal_distance_equals_brute_force_for_every_head(dtype):
    for slope in _all_scheme_slopes():
        assert subnormal_distance(slope, dtype) == _brute_first(slope, dtype, below_normal=True), slope


def test_underflow_distance_hand_values():
    # slope 1/2: fp16 exp(x) == 0 for x <= -17.34 (fp16 grid), bf16 for x <= -93.0, fp32 for x < -103.97
    assert underflow_distance(0.5, torch.float16) == 35
    assert underflow_distance(0.5, torch.bfloat16) == 186
    assert underflow_distance(0.5, torch.float32) == 208
    # bf16 and fp32 share the exponent range: same normal floor ln(2^-126) = -87.34
    assert subnormal_distance(0.5, torch.bfloat16) == subnormal_distance(0.5, torch.float32) == 175
    assert subnormal_distance(0.5, torch.float16) == 20  # ln(2^-14) = -9.70
    # a huge slope: the first step already underflows (-1e6 is -inf in fp16)
    assert underflow_distance(1e6, torch.float16) == 1


def test_underflow_distance_monotone_and_exact_at_boundary():
    for dtype in DTYPES:
        dists = [underflow_distance(s, dtype) for s in _all_scheme_slopes()]
        assert dists == sorted(dists, reverse=True)  # flatter slope -> farther
        for slope in (0.5, 0.0123, 1 / 256):
            d = underflow_distance(slope, dtype)
            x = torch.tensor([-slope * (d - 1), -slope * d], dtype=torch.float64).to(dtype)
            before, at = torch.exp(x).tolist()
            assert before > 0 and at == 0


@pytest.mark.parametrize("bad", [0.0, -0.5, float("nan"), float("inf")])
def test_underflow_distance_rejects_bad_slopes(bad):
    with pytest.raises(ValueError, match="slope"):
        underflow_distance(bad, torch.float32)


def test_underflow_distance_in_float64_equals_brute_force():
    # break-api-s67 finding 7: the contract rule is defined for any dtype; float64 was refused
    d = torch.arange(0, 5000, dtype=torch.float64)
    e = torch.exp(-0.5 * d)
    assert int(torch.nonzero(e == 0)[0]) == 1491  # brute force
    assert underflow_distance(0.5, torch.float64) == 1491
    assert underflow_distance(0.5, "float64") == 1491
    assert subnormal_distance(0.5, torch.float64) == int(torch.nonzero(e < torch.finfo(torch.float64).smallest_normal)[0])
    assert subnormal_distance(0.5, torch.float64) == 1417
    for slope in _all_scheme_slopes()[::7] + [1.0, 3.7, 1e6]:
        limit = int(760 / slope) + 16  # exp(-760) is zero in float64
        x = -slope * torch.arange(limit + 1, dtype=torch.float64)
        assert underflow_distance(slope, torch.float64) == int(torch.nonzero(torch.exp(x) == 0)[0]), slope
        normal = torch.exp(x) < torch.finfo(torch.float64).smallest_normal
        assert subnormal_distance(slope, torch.float64) == int(torch.nonzero(normal)[0]), slope


def test_underflow_distance_rejects_bad_dtypes_and_tiny_slopes():
    for bad in (torch.int8, torch.complex64, "float8"):
        with pytest.raises(ValueError, match="dtype"):
            underflow_distance(0.5, bad)
    with pytest.raises(ValueError, match="dtype"):  # the backends' paths stay the three attention dtypes
        softmax_paths(torch.float64)
    with pytest.raises(ValueError, match="2\\*\\*53"):
        underflow_distance(1e-300, torch.float32)
    assert resolve_dtype("bfloat16") is torch.bfloat16 and resolve_dtype(torch.float16) is torch.float16


def _brute_zero_share(zero_d, length, window, sinks):
    spec = MaskSpec(q_len=length, k_len=length, causal=True, window=window, sinks=sinks)
    pos = torch.arange(length)
    vis = spec.visible(pos, pos, batch=False)[0, 0]
    dist = pos[:, None] - pos[None, :]
    return ((dist >= zero_d) & vis).sum().item() / vis.sum().item()


@pytest.mark.parametrize("window,sinks", [(None, 0), (40, 0), (40, 3), (500, 2)])
def test_zero_share_counts_visible_pairs(window, sinks):
    for zero_d in (0, 1, 17, 39, 40, 63, 99, 100, 1000):
        expected = 0.0 if zero_d >= 100 else _brute_zero_share(zero_d, 100, window, sinks)
        assert zero_share(zero_d, 100, window, sinks) == pytest.approx(expected, abs=1e-12)
    assert zero_share(None, 100) == 0.0
    assert zero_share(0, 1) == 1.0


def test_paths_registry_names_dtypes():
    names = [p.name for p in softmax_paths("bfloat16")]
    assert names == ["exp", "eager-weights", "eager", "sdpa", "flex"]
    flex = softmax_paths("bfloat16")[-1]
    assert flex.bias_dtype == torch.float32 and flex.exp_dtype == torch.float32 and flex.measured
    assert not any(p.measured for p in softmax_paths("bfloat16", "cuda")[1:])
    with pytest.raises(ValueError, match="device"):
        softmax_paths("float32", "tpu")
    # the "exp" path is the contract rule
    assert path_zero_distance(0.25, exp_path(torch.bfloat16)) == underflow_distance(0.25, torch.bfloat16)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_predicted_zero_share_matches_eager_backend(dtype):
    """The eager backend, measured with zero q/k and identity values, against the prediction."""
    slopes = alibi_slopes(4, 4.0)  # 1/2 .. 1/16
    length = 320
    report = diagnose(4, length, dtype, 4.0)
    measured = probe_zero_share("eager", slopes, length, dtype)
    predicted = [h.zero_share for h in report.heads["eager"]]
    np.testing.assert_allclose(measured.numpy(), predicted, atol=2e-3)
    measured_w = probe_zero_share("eager", slopes, length, dtype, weights=True)
    predicted_w = [h.zero_share for h in report.heads["eager-weights"]]
    np.testing.assert_allclose(measured_w.numpy(), predicted_w, atol=2e-3)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_predicted_zero_share_bounds_sdpa_backend(dtype):
    """SDPA rescales earlier key blocks in fp32: it loses between the subnormal- and normal-floor predictions."""
    slopes = alibi_slopes(4, 4.0)
    length = 320
    report = diagnose(4, length, dtype, 4.0)
    measured = probe_zero_share("sdpa", slopes, length, dtype).numpy()
    predicted = np.array([h.zero_share for h in report.heads["sdpa"]])
    np.testing.assert_allclose(measured, predicted, atol=0.01)
    assert (measured > 0).tolist() == (predicted > 0).tolist()
    if dtype == "float16":
        return  # fp16's own rounding decides; the kernel rounds P before normalising: within 1 point
    assert (measured <= predicted + 2e-3).all()  # upper bound: the normal floor
    sdpa = next(p for p in softmax_paths(dtype) if p.name == "sdpa")
    lower = [h.zero_share for h in diagnose_heads(4, length, dtype, 4.0, path=replace(sdpa, floor="zero"))]
    assert (measured >= np.array(lower) - 2e-3).all()  # lower bound: the subnormal floor


def test_probe_weights_only_for_eager():
    with pytest.raises(ValueError, match="eager"):
        probe_zero_share("sdpa", alibi_slopes(2), 16, "float32", weights=True)


def test_bias_clamp_limit_keeps_every_weight_normal():
    for dtype, expected in (("float16", 9.707), ("bfloat16", 87.25), ("float32", 87.336)):
        ratio = bias_clamp_limit(exp_path(dtype))
        assert ratio == pytest.approx(expected, abs=2e-3)
        assert torch.exp(torch.tensor(-ratio, dtype=torch.float64).to(resolve_dtype(dtype))) >= torch.finfo(
            resolve_dtype(dtype)
        ).smallest_normal
    slopes = alibi_slopes(8)
    for path in softmax_paths("bfloat16"):
        limit = bias_clamp_limit(path, slopes)
        probe = probe_zero_share("eager", slopes, 400, "bfloat16", bias_clamp=limit) if path.name == "eager" else None
        for h in diagnose_heads(8, 100_000, "bfloat16", path=path, bias_clamp=limit):
            assert h.zero_distance is None and h.normal_distance is None and not h.blind
        if probe is not None:
            assert probe.sum() == 0  # the clamped bias loses no key, measured


def test_min_max_bias_is_the_smallest_non_blind_scheme():
    path = softmax_paths("bfloat16")[3]  # sdpa
    mb = min_max_bias(8, 1024, path)
    assert mb is not None and mb > 8

    def blind(max_bias):
        return any(h.blind for h in diagnose_heads(8, 1024, "bfloat16", max_bias, path=path))

    assert not blind(mb) and blind(mb - 0.02)
    heads = diagnose_heads(8, 1024, "bfloat16", path=path)
    assert max(h.max_bias for h in heads) == mb  # the steepest head decides
    for h in heads:
        again = diagnose_heads(8, 1024, "bfloat16", h.max_bias, path=path)[h.head]
        assert not again.blind
    assert min_max_bias(8, 96, path) < 8  # nothing blind at 8: steeper slopes would still do


def test_normaliser_is_bounded_by_the_row_length():
    """A nearly flat head spreads 1/L over L keys: not blind in fp16 although 1 / (1 - e^-m) is huge."""
    flat = diagnose_heads(1, 768, "float16", slopes=[2.0**-40], path="eager")[0]
    assert not flat.blind and flat.zero_distance > 10**12
    measured = probe_zero_share("eager", torch.tensor([2.0**-40]), 768, "float16")
    assert measured.item() == 0.0
    assert bias_clamp_limit(softmax_paths("float16")[2], [2.0**-40], row_len=768) > 0


def test_diagnose_heads_slopes_window_and_errors():
    heads = diagnose_heads(4, 2048, "float16")
    assert [h.head for h in heads] == [0, 1, 2, 3]
    assert heads[0].slope == 0.25 and heads[0].zero_distance == underflow_distance(0.25, torch.float16)
    assert heads[0].blind and heads[0].max_window == heads[0].zero_distance
    assert heads[0].normal_distance == subnormal_distance(0.25, torch.float16)
    assert heads[0].bias_clamp == bias_clamp_limit(exp_path(torch.float16))  # exp path: no normaliser
    # a window shorter than the zero distance leaves no key without weight
    windowed = diagnose_heads(4, 2048, "float16", window=heads[0].zero_distance)
    assert not windowed[0].blind
    # sinks far behind the window are hit by the full bias
    sunk = diagnose_heads(4, 2048, "float16", window=heads[0].zero_distance, sinks=4)
    assert sunk[0].blind
    learned = diagnose_heads(2, 512, "float32", slopes=[0.5, 1e-3])
    assert learned[1].zero_share == 0.0 and learned[0].blind
    with pytest.raises(ValueError, match="slopes"):
        diagnose_heads(2, 512, "float32", slopes=[0.5])
    with pytest.raises(ValueError, match="path"):
        diagnose_heads(2, 512, "float32", path="triton")


def test_report_json_table_summary():
    report = diagnose(4, 512, "bfloat16", window=None)
    assert isinstance(report, DiagnosisReport)
    data = json.loads(report.to_json())
    assert data["dtype"] == "bfloat16" and data["max_len"] == 512
    assert set(data["heads"]) == {"exp", "eager-weights", "eager", "sdpa", "flex"}
    assert len(data["heads"]["sdpa"]) == 4 and data["paths"][0]["bias_dtype"] == "bfloat16"
    table = report.table()
    assert len(table.splitlines()) == 2 + 4 and "sdpa" in table
    summary = report.summary()
    assert "4 heads, max_len 512, bfloat16" in summary and "fix: bias_clamp <=" in summary
    # fp32 at a short length: nothing is lost
    short = diagnose(4, 64, "float32")
    assert all(r.blind_heads == 0 for r in short.remedies.values())


def test_run_diagnose_from_config_writes_json(tmp_path):
    from pipelines.diagnose import run_diagnose

    config = load_config(overrides=["model.n_heads=4", "model.d_model=16", "model.max_len=2048", "model.window=64"])
    out = tmp_path / "diag" / "report.json"
    report = run_diagnose(config, dtype="float16", output=out)
    data = json.loads(out.read_text())
    assert data["n_heads"] == 4 and data["window"] == 64 and data["dtype"] == "float16"
    assert report.window == 64 and report.health is None
    with pytest.raises(ValueError, match="dtype"):
        run_diagnose(config, dtype="float64")


def test_cli_diagnose_prints_table(capsys):
    from pipelines.cli import main

    assert main(["diagnose", "--heads", "4", "--max-len", "512", "--dtype", "float16"]) == 0
    out = capsys.readouterr().out
    assert "4 heads, max_len 512, float16" in out and "sdpa" in out
    # a head count that does not divide the default width 64: the diagnosis reads no width (was refused)
    assert main(["diagnose", "--heads", "6", "--max-len", "512", "--dtype", "bfloat16"]) == 0
    assert "6 heads, max_len 512, bfloat16" in capsys.readouterr().out
    assert main(["diagnose", "--heads", "-2"]) == 2  # refused for its head count, not a width it never gave
    assert "model.n_heads" in capsys.readouterr().err


def test_model_health_on_tiny_ranker():
    from pipelines.diagnose import model_health
    from recsys_alibi.config import ModelConfig
    from recsys_alibi.model.transformer import AlibiRanker

    torch.manual_seed(0)
    model = AlibiRanker(ModelConfig(d_model=8, n_heads=2, n_layers=2, max_len=300, max_bias=2.0), n_items=30).eval()
    health = model_health(model, torch.float32, 300)
    assert len(health["layers"]) == 2 and len(health["layers"][0]) == 2
    h0 = health["layers"][0][0]
    assert 0 < h0["entropy"] < math.log(300) and h0["zero_share"] > 0  # slope 1/2: keys beyond ~200 vanish
    assert health["layers"][0][1]["zero_share"] == 0.0  # slope 1/4 reaches ~400 in fp32


def test_run_diagnose_from_logged_model(mlflow_store, tmp_path):
    import mlflow
    import polars as pl

    from pipelines.diagnose import run_diagnose
    from recsys_alibi.config import ModelConfig
    from recsys_alibi.model.transformer import AlibiRanker
    from recsys_alibi.tracking import log_ranker, setup_tracking

    config = load_config()
    setup_tracking(config.tracking)
    cfg = ModelConfig(d_model=8, n_heads=2, n_layers=1, max_len=64, learnable_slopes=True)
    model = AlibiRanker(cfg, n_items=10)
    items = pl.DataFrame({"item_idx": pl.Series(range(1, 11), dtype=pl.Int32), "item_id": list(range(10)),
                          "count": pl.Series([1] * 10, dtype=pl.Int64)})  # fmt: skip
    with mlflow.start_run():
        logged = log_ranker(model, items, None, tmp_path / "model")
    report = run_diagnose(config, dtype="bfloat16", model_uri=logged.uri)
    assert report.slope_source == "model" and report.n_heads == 2 and report.max_len == 64
    assert report.health is not None and len(report.health["layers"]) == 1
    assert "attention health" in report.summary()
    # --max-len: the length to diagnose the model at (it was dropped without a word); health stays within HEALTH_MAX_LEN
    longer = run_diagnose(config, dtype="bfloat16", model_uri=logged.uri, length=4096)
    assert longer.max_len == 4096 and longer.n_heads == 2 and longer.health["length"] == 1024
    from pipelines.cli import main

    assert main(["diagnose", "--model-uri", logged.uri, "--heads", "4"]) == 2  # the model's heads are its own


def test_free_heads_are_never_blind_and_the_remedies_ignore_them():
    slopes = torch.tensor([0.25, 0.0625, 0.015625, 0.0], dtype=torch.float64)  # free_heads=1
    report = diagnose(4, 2058, "bfloat16", 8.0, slopes)
    for path, heads in report.heads.items():
        assert heads[3].zero_distance is None and heads[3].zero_share == 0.0 and not heads[3].blind, path
    assert path_zero_distance(0.0, exp_path(torch.float32)) is None
    # the clamp limit is that of the biased heads: a zero slope has no bias to clamp
    path = softmax_paths("bfloat16")[-1]
    assert bias_clamp_limit(path, slopes, row_len=2058) == bias_clamp_limit(path, slopes[:3], row_len=2058)
    with pytest.raises(ValueError, match="slope 0.0: exp"):
        underflow_distance(0.0, torch.float32)


def test_diagnose_from_a_config_uses_its_free_heads_and_wide_slopes(tmp_path):
    from pipelines.diagnose import run_diagnose
    from recsys_alibi.config import load_config

    config = load_config(overrides=["model.n_heads=4", "model.d_model=16", "model.max_len=2048",
                                    "model.slopes=wide", "model.free_heads=1"])  # fmt: skip
    report = run_diagnose(config, "bfloat16", output=tmp_path / "d.json")
    slopes = [h.slope for h in report.heads["sdpa"]]
    assert slopes == pytest.approx([1 / 4, 1 / 32, 1 / 256, 0.0], rel=1e-6)
    assert not report.heads["sdpa"][3].blind and report.heads["sdpa"][0].blind  # 1/4 loses keys from ~343 on


def test_cpu_name_names_the_model_and_its_bf16_flags(tmp_path):
    from recsys_alibi.diagnostics.machine import cpu_name

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Intel Xeon\nflags\t\t: fpu avx2 avx512_bf16 amx_bf16\n")
    assert cpu_name(info) == "Intel Xeon (avx512_bf16, amx_bf16)"
    info.write_text("model name\t: AMD EPYC\nflags\t\t: fpu avx2\n")
    assert cpu_name(info) == "AMD EPYC (AVX2 only)"
    assert cpu_name(tmp_path / "missing")  # no /proc: the platform's processor string, never an error


def test_zero_share_is_the_pair_count_in_closed_form_and_costs_nothing_at_a_huge_length():
    # diagnose --max-len 99999999999 allocated one count per distance (745 GiB)
    from recsys_alibi.diagnostics.distances import zero_share

    def by_counting(zero_d, length, window, sinks):  # the definition, one distance at a time
        counts = [length - d if window is None or d < window else min(sinks, length - d) for d in range(length)]
        return sum(counts[zero_d:]) / sum(counts)

    for length, zero_d, window, sinks in [(10, 3, None, 0), (29, 5, 10, 3), (12, 11, 4, 7), (7, 2, 1, 0), (40, 30, 5, 2)]:
        assert zero_share(zero_d, length, window, sinks) == pytest.approx(by_counting(zero_d, length, window, sinks))
    assert zero_share(5, 10**11) == pytest.approx(1 - (5 * 10**11 - 10) / (10**11 * (10**11 + 1) / 2), rel=1e-12)


def test_cli_diagnose_refuses_more_heads_than_it_can_tabulate_quickly(capsys):
    # break-api-s67 finding 13: --heads 100000 ran > 120 s with no bound
    import time

    from pipelines.cli import main

    for heads in ("257", "100000"):
        start = time.perf_counter()
        assert main(["diagnose", "--heads", heads, "--max-len", "10"]) == 2
        assert time.perf_counter() - start < 5
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"model.n_heads={heads}" in err and "at most 256 heads" in err
    from pipelines.diagnose import MAX_HEADS

    assert MAX_HEADS == 256


def test_diagnose_learned_position_model_beyond_its_length_names_the_given_max_len(mlflow_store, tmp_path, capsys):
    # break-api-s67 finding 13: --max-len 5000 was refused as "got a history of 1024" (HEALTH_MAX_LEN)
    import mlflow
    import polars as pl

    from pipelines.cli import main
    from pipelines.diagnose import run_diagnose
    from recsys_alibi.config import ConfigError, ModelConfig
    from recsys_alibi.model.transformer import AlibiRanker
    from recsys_alibi.tracking import log_ranker, setup_tracking

    config = load_config()
    setup_tracking(config.tracking)
    model = AlibiRanker(ModelConfig(d_model=8, n_heads=2, n_layers=1, max_len=200, position="learned"), n_items=10)
    items = pl.DataFrame({"item_idx": pl.Series(range(1, 11), dtype=pl.Int32), "item_id": list(range(10)),
                          "count": pl.Series([1] * 10, dtype=pl.Int64)})  # fmt: skip
    with mlflow.start_run():
        logged = log_ranker(model, items, None, tmp_path / "model")
    with pytest.raises(ConfigError, match="--max-len 5000: the model's learned positions cover 200 items"):
        run_diagnose(config, dtype="float32", model_uri=logged.uri, length=5000)
    assert main(["diagnose", "--model-uri", logged.uri, "--max-len", "5000"]) == 2
    err = capsys.readouterr().err
    assert "--max-len 5000" in err and "1024" not in err
    within = run_diagnose(config, dtype="float32", model_uri=logged.uri, length=150)  # within its positions: runs
    assert within.max_len == 150 and within.health["length"] == 150
