"""Report files: report.json in the CONTRACT shape, report.md, PNG plots, terminal table."""

from __future__ import annotations

import json

import polars as pl
import pytest
import torch

from recsys_alibi.config import EvaluateConfig
from recsys_alibi.evaluation.baselines import PopularityScorer
from recsys_alibi.evaluation.evaluator import EvaluationResult, evaluate
from recsys_alibi.evaluation.report import format_metrics_table, write_report

CONTRACT_KEYS = {"protocol", "n_users", "metrics", "by_context_length", "by_history_length"}


class TinyModel:
    name = "alibi"
    max_context = None

    def score(self, history: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        last = history.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1))  # (B, 1)
        items = torch.arange(9).unsqueeze(0)  # (1, N+1)
        return -((items - last - 1) % 9).float()  # the item after the last one scores best


class Sasrec(TinyModel):
    name = "sasrec"
    max_context = 3


@pytest.fixture(scope="module")
def results() -> dict[str, EvaluationResult]:
    rows = [([1, 2, 3], [4]), ([5, 6], [7]), ([1, 3, 5, 7, 2], [3]), ([8], [1])]
    examples = pl.DataFrame(
        {"user_id": [10, 11, 12, 13], "history": [h for h, _ in rows], "targets": [t for _, t in rows]},
        schema={"user_id": pl.Int64, "history": pl.List(pl.Int32), "targets": pl.List(pl.Int32)},
    )
    cfg = EvaluateConfig(ks=[1, 5, 10], history_buckets=[2, 4])
    sweep = [1, 2, 5, None]
    return {
        "alibi": evaluate(TinyModel(), examples, 8, cfg, protocol_name="leave_one_out", context_lengths=sweep),
        "sasrec": evaluate(Sasrec(), examples, 8, cfg, protocol_name="leave_one_out", context_lengths=sweep),
        "popularity": evaluate(
            PopularityScorer().fit([h for h, _ in rows], 8), examples, 8, cfg, protocol_name="leave_one_out",
            context_lengths=sweep,
        ),
    }


def test_report_files_and_contract(tmp_path, results):
    main = results["alibi"]
    paths = write_report(main, tmp_path / "out", baselines={k: v for k, v in results.items() if k != "alibi"})
    assert set(paths) == {"json", "markdown", "context_plot", "history_plot"}
    assert all(p.is_file() and p.parent == tmp_path / "out" for p in paths.values())
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in paths.values())  # no temp left

    doc = json.loads(paths["json"].read_text())
    assert CONTRACT_KEYS <= set(doc) and set(doc) - CONTRACT_KEYS == {"by_min_history", "paired_vs_context"}
    assert doc == main.to_json()
    assert doc["protocol"] == "leave_one_out" and doc["n_users"] == 4
    names = {"HR@1", "NDCG@1", "Recall@1", "HR@5", "NDCG@5", "Recall@5", "HR@10", "NDCG@10", "Recall@10", "MRR"}
    names |= {"Coverage@1", "Coverage@5", "Coverage@10"}
    assert set(doc["metrics"]) == names and all(isinstance(v, float) for v in doc["metrics"].values())
    assert set(doc["by_context_length"]) == {"1", "2", "5", "full"}
    assert all(set(m) == names for m in doc["by_context_length"].values())
    assert set(doc["by_history_length"]) <= {"1-2", "3-4", ">4"}
    assert all(set(m) == names for m in doc["by_history_length"].values())

    md = paths["markdown"].read_text()
    assert "| metric | alibi | sasrec | popularity |" in md
    assert "## By history length" in md and "## By context length" in md
    assert "—" in md  # sasrec stops at max_context=3: context 5 has no value
    assert "max_context=3" in md
    for key in ("context_plot", "history_plot"):
        assert paths[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sasrec_stops_where_its_positions_end(results):
    sasrec = results["sasrec"].to_json()["by_context_length"]
    assert all(v is None for v in results["sasrec"].by_context_length["5"].values())
    assert "5" not in sasrec  # report.json keeps the contract's {metric: float}: a context it cannot take is left out
    assert all(isinstance(v, float) for m in sasrec.values() for v in m.values()) and "2" in sasrec
    json.dumps(sasrec)


def test_report_without_sweep_skips_that_plot(tmp_path, results):
    r = results["alibi"]
    bare = EvaluationResult(r.protocol, r.n_users, r.metrics, {}, r.by_history_length, scorer="alibi", ks=r.ks)
    paths = write_report(bare, tmp_path)
    assert "context_plot" not in paths and "history_plot" in paths
    assert "## By context length" not in paths["markdown"].read_text()


def test_report_overwrites_atomically(tmp_path, results):
    write_report(results["alibi"], tmp_path)
    paths = write_report(results["sasrec"], tmp_path)
    assert json.loads(paths["json"].read_text()) == results["sasrec"].to_json()


def test_from_json_round_trip(results):
    r = results["alibi"]
    again = EvaluationResult.from_json(r.to_json())
    assert again.to_json() == r.to_json() and again.ks == (1, 5, 10)


def test_terminal_table(results):
    table = format_metrics_table(results, ks=[10])
    lines = table.splitlines()
    assert lines[0].split() == ["scorer", "HR@10", "NDCG@10", "MRR"]
    assert [line.split()[0] for line in lines[2:]] == ["alibi", "sasrec", "popularity"]
    assert f"{results['alibi'].metrics['NDCG@10']:.4f}" in lines[2]


def test_report_changes_as_a_whole_no_old_plot_beside_a_new_report(tmp_path, results):
    r = results["alibi"]
    write_report(r, tmp_path)
    assert (tmp_path / "context_length.png").is_file()
    bare = EvaluationResult(r.protocol, r.n_users, r.metrics, {}, r.by_history_length, scorer="bare", ks=r.ks)
    write_report(bare, tmp_path)
    assert not (tmp_path / "context_length.png").exists()  # the new report has no sweep: the old plot is gone
    assert json.loads((tmp_path / "report.json").read_text())["by_context_length"] == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history_length.png", "report.json", "report.md"]


def test_a_failed_report_write_leaves_the_previous_report(tmp_path, results, monkeypatch):
    import errno

    from recsys_alibi.evaluation import report

    write_report(results["alibi"], tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def full_disk(path, fig):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(report, "_write_figure", full_disk)
    with pytest.raises(OSError):
        write_report(results["sasrec"], tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # report.json too: nothing half-new


def test_a_report_written_meanwhile_never_removes_the_staging_of_one_still_being_written(tmp_path, results, monkeypatch):
    """The report's stale-staging sweep (issue 41, defect 7's class) took every `.report-*.tmp` in the
    folder, also the staging of a report still being written there, which then failed; a killed
    writer's staging is still removed."""
    from recsys_alibi.evaluation import report
    from recsys_alibi.staging import held_temp, release

    killed, fd = held_temp(tmp_path / "report.json", directory=True)
    release(fd)
    original, inner = report._markdown, []

    def meanwhile(*args):
        if not inner:
            inner.append("started")
            write_report(results["sasrec"], tmp_path)  # another report into the same folder, start to end
        return original(*args)

    monkeypatch.setattr(report, "_markdown", meanwhile)
    paths = write_report(results["alibi"], tmp_path)
    assert inner and not killed.exists() and json.loads(paths["json"].read_text()) == results["alibi"].to_json()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
