"""break-config-s66 finding 7: the evaluation report directory is replaced as a whole, so a run killed while
it publishes never leaves a new report.md beside an old report.json."""

from __future__ import annotations

import json
import os

import polars as pl
import pytest
import torch

from recsys_alibi.config import EvaluateConfig
from recsys_alibi.evaluation import report
from recsys_alibi.evaluation.baselines import PopularityScorer
from recsys_alibi.evaluation.evaluator import evaluate


class Next:
    name = "alibi"
    max_context = None

    def score(self, history: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        last = history.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1))  # (B, 1)
        return -((torch.arange(9).unsqueeze(0) - last - 1) % 9).float()  # (B, N + 1): the next item first


ROWS = [([1, 2, 3], [4]), ([5, 6], [7]), ([1, 3, 5, 7, 2], [3]), ([8], [1])]
EXAMPLES = pl.DataFrame({"user_id": [10, 11, 12, 13], "history": [h for h, _ in ROWS], "targets": [t for _, t in ROWS]},
                        schema={"user_id": pl.Int64, "history": pl.List(pl.Int32), "targets": pl.List(pl.Int32)})
CFG = EvaluateConfig(ks=[1, 5, 10], history_buckets=[2, 4])


def _model(sweep=(1, 2, None)):
    return evaluate(Next(), EXAMPLES, 8, CFG, protocol_name="leave_one_out", context_lengths=list(sweep))


def _popularity():
    return evaluate(PopularityScorer().fit([h for h, _ in ROWS], 8), EXAMPLES, 8, CFG, protocol_name="leave_one_out")


def _files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_new_report_replaces_the_old_directory_whole_and_keeps_its_other_entries(tmp_path):
    out = tmp_path / "report"
    report.write_report(_popularity(), out / "popularity")  # the pipeline's baseline report, inside the directory
    report.write_report(_model(), out)
    (out / "notes.txt").write_text("mine\n")
    assert sorted(p.name for p in out.iterdir()) == ["context_length.png", "history_length.png", "notes.txt",
                                                     "popularity", "report.json", "report.md"]  # fmt: skip
    inode = os.stat(out).st_ino
    report.write_report(_popularity(), out, title="Evaluation: popularity")  # no context sweep: no context plot
    assert os.stat(out).st_ino != inode  # another directory took its place
    assert sorted(p.name for p in out.iterdir()) == ["history_length.png", "notes.txt", "popularity", "report.json",
                                                     "report.md"]  # fmt: skip
    assert (out / "notes.txt").read_text() == "mine\n"
    assert json.loads((out / "popularity" / "report.json").read_text()) == _popularity().to_json()
    assert json.loads((out / "report.json").read_text()) == _popularity().to_json()
    assert (out / "report.md").read_text().startswith("# Evaluation: popularity")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no staging folder left beside it


@pytest.mark.parametrize("where", ["carry_over", "replace_dir"])
def test_a_run_stopped_while_publishing_leaves_the_old_report_whole(tmp_path, monkeypatch, where):
    """The old directory is touched by one swap only: stopped before it (killed while the new one is built or just
    before the swap), every old file is as it was, report.json and report.md of the same report."""
    out = tmp_path / "report"
    report.write_report(_model(), out, title="Evaluation: alibi")
    report.write_report(_popularity(), out / "popularity")
    before = _files(out)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # what the kill would stop; the staging folder is left for the next writer

    monkeypatch.setattr(report, where, killed)
    with pytest.raises(KeyboardInterrupt):
        report.write_report(_popularity(), out, title="Evaluation: popularity")
    assert _files(out) == before
    assert (out / "report.md").read_text().startswith("# Evaluation: alibi")
    monkeypatch.undo()
    report.write_report(_popularity(), out, title="Evaluation: popularity")  # the next run publishes whole
    assert (out / "report.md").read_text().startswith("# Evaluation: popularity")
    assert json.loads((out / "report.json").read_text()) == _popularity().to_json()


def test_the_working_directory_as_output_is_written_file_by_file(tmp_path, monkeypatch):
    """The folder the process stands in cannot be swapped: the report is staged inside it, report.json last."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlflow.db").write_text("kept")
    paths = report.write_report(_model(), ".")
    assert (tmp_path / "report.json").is_file() and paths["json"].name == "report.json"
    assert (tmp_path / "mlflow.db").read_text() == "kept" and os.getcwd() == str(tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_folder_where_a_report_file_goes_is_refused_not_dropped(tmp_path):
    from recsys_alibi.atomic import OutputKindError

    out = tmp_path / "report"
    (out / "report.md").mkdir(parents=True)
    with pytest.raises(OutputKindError):
        report.write_report(_model(), out)
    assert (out / "report.md").is_dir()
