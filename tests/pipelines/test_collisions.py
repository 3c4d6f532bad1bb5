"""Every command's outputs apart from its inputs and from other outputs (issue 41, defect 1 and its class).

Each case is refused with one ``error:`` line and exit code 2 before any work, and nothing is written.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.collisions import EXPORT_FILES, REPORT_FILES, Output, check_apart, local_model_path
from pipelines.outputs import OutputPathError

COMMON = ["--set", "data.min_events_per_user=1", "--set", "data.min_events_per_item=1"]
MODEL = ["--model-uri", "runs:/nosuchrun/model"]  # refused before the model is looked up


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _error(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture
def folders(tmp_path, capsys) -> dict[str, Path]:
    """An events folder, its prepared directory, and folders holding a scoring output, an export, a report, rules."""
    events = tmp_path / "events"
    events.mkdir()
    lines = ["user_id,item_id,timestamp"] + [f"u{u},i{(u + j) % 4},{10 * j + u}" for u in range(3) for j in range(4)]
    (events / "day1.csv").write_text("\n".join(lines) + "\n")
    assert main(["prepare", "--input", str(events), "--output", str(tmp_path / "prepared"), *COMMON]) == 0
    made = {"events": events, "prepared": tmp_path / "prepared"}
    for name, marker in (("rankings", "_manifest.json"), ("export", "export.json"), ("report", "report.json")):
        (tmp_path / name).mkdir()
        (tmp_path / name / marker).write_text("{}\n")
        made[name] = tmp_path / name
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "deny.parquet").write_bytes(b"PAR1")
    made["rules"] = tmp_path / "rules"
    capsys.readouterr()
    return made


def test_export_into_the_prepared_input_or_a_scoring_output_is_refused(folders, capsys):
    """The issue's case: `export --output PREPARED` replaced the prepared items.parquet with item vectors;
    `export --output RANKINGS` put export.json among the rankings."""
    prepared, before = folders["prepared"], _snapshot(folders["prepared"])
    assert main(["export", *MODEL, "--input", str(prepared), "--output", str(prepared)]) == 2
    assert _error(capsys) == (f"error: --output {prepared} is the input --input {prepared}: writing it would replace what "
                              "is read; choose another --output")  # fmt: skip
    assert main(["export", *MODEL, "--input", str(prepared), "--output", str(folders["rankings"])]) == 2
    assert _error(capsys) == (f"error: --output {folders['rankings']} already holds a scoring output (_manifest.json): the "
                              "two would mix and the readers of each would fail on the other's files; choose another --output")  # fmt: skip
    assert _snapshot(prepared) == before and sorted(p.name for p in folders["rankings"].iterdir()) == ["_manifest.json"]


def test_evaluate_into_the_prepared_input_is_refused_and_writes_nothing(folders, capsys):
    """A baseline needs no model: before the fix this wrote report.json and plots into the prepared directory."""
    prepared, before = folders["prepared"], _snapshot(folders["prepared"])
    assert main(["evaluate", "--prepared", str(prepared), "--baseline", "popularity", "--output", str(prepared)]) == 2
    assert _error(capsys).startswith(f"error: --output {prepared} is the input --prepared {prepared}: ")
    assert _snapshot(prepared) == before
    assert main(["evaluate", "--prepared", str(prepared), "--baseline", "popularity", "--output", str(folders["export"])]) == 2
    assert "already holds an export (export.json)" in _error(capsys)


@pytest.mark.parametrize("case", ["prepared", "changed-since", "rule folder", "export", "report"])
def test_score_output_colliding_with_an_input_or_another_output_is_refused(folders, capsys, case):
    prepared = folders["prepared"]
    output = {"prepared": prepared, "changed-since": folders["rankings"], "rule folder": folders["rules"] / "out",
              "export": folders["export"], "report": folders["report"]}[case]  # fmt: skip
    args = ["score", *MODEL, "--input", str(prepared), "--output", str(output), "--changed-since", str(folders["rankings"]),
            "--set", f"score.deny={folders['rules']}"]  # fmt: skip
    before = {name: _snapshot(folder) for name, folder in folders.items()}
    assert main(args) == 2
    expected = {
        "prepared": f"is the input --input {prepared}: writing it would replace what is read",
        "changed-since": f"is inside the input --changed-since {folders['rankings']}: its files would be read back",
        "rule folder": f"is inside the input score.deny {folders['rules']}: its files would be read back",
        "export": "already holds an export (export.json)",
        "report": "already holds an evaluation report (report.json)",
    }[case]
    assert expected in _error(capsys)
    assert {name: _snapshot(folder) for name, folder in folders.items()} == before


def test_prepare_generate_and_diagnose_outputs_among_other_outputs_are_refused(folders, capsys):
    prepared = folders["prepared"]
    assert main(["prepare", "--input", str(folders["events"]), "--output", str(folders["rankings"]), *COMMON]) == 2
    assert "already holds a scoring output" in _error(capsys)
    assert main(["generate", "--users", "5", "--items", "5", "--output", str(prepared / "events.parquet")]) == 2
    assert f"is in {prepared}, which holds a prepared directory (manifest.json)" in _error(capsys)
    assert main(["diagnose", "--heads", "2", "--max-len", "8", "--output", str(folders["report"] / "d.json")]) == 2
    assert "which holds an evaluation report" in _error(capsys)
    assert not (folders["report"] / "d.json").exists()


def test_pipeline_refuses_outputs_in_a_rule_folder_before_any_work(tmp_path, folders, capsys):
    """(Its own rankings as score.changed_since are allowed: read while it scores into a staging folder, tested in
    test_pipeline_end_to_end.)"""
    assert main(["pipeline", "--output", str(folders["rules"] / "run"), "--set", "generate.enabled=false",
                 "--set", f"data.input={folders['events']}", "--set", f"score.allow={folders['rules']}"]) == 2  # fmt: skip
    assert "is inside the input score.allow" in _error(capsys)
    assert sorted(p.name for p in folders["rules"].iterdir()) == ["deny.parquet"]


def test_check_apart_rules(tmp_path):
    """Outputs overlapping each other; an output beside its input, or inside a prepared input (read by name), is fine."""
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "manifest.json").write_text("{}")
    check_apart([Output("--output", prepared / "rankings", "rankings")], {"--input": prepared})
    check_apart([Output("--output", tmp_path / "ex.v2", "export")], {"--input": prepared})
    with pytest.raises(OutputPathError, match="overlap; give them separate paths"):
        check_apart([Output("a", tmp_path / "x", "rankings"), Output("b", tmp_path / "x" / "y", "report")], {})
    with pytest.raises(OutputPathError, match="holds the input --input .* at part-00001.parquet, which it writes"):
        check_apart([Output("--output", tmp_path / "r", "rankings")], {"--input": tmp_path / "r" / "part-00001.parquet"})
    assert local_model_path("runs:/abc/model") is None and local_model_path("models:/m@champion") is None
    (tmp_path / "we[1].csv").write_text("user_id,item_id,timestamp\n")  # a file of that name is no glob
    check_apart([Output("--output", tmp_path / "out", "prepared")], {"--input": tmp_path / "we[1].csv"})
    with pytest.raises(OutputPathError, match="is inside the input --input"):  # a glob reads its folder whole
        check_apart([Output("--output", tmp_path / "out", "prepared")], {"--input": tmp_path / "we[2].csv"})
    assert local_model_path(str(prepared)) == str(prepared) and local_model_path(f"file://{prepared}") == str(prepared)


def test_the_names_an_export_and_a_report_write_are_the_writers_own():
    from recsys_alibi.evaluation import report
    from serving import export

    assert EXPORT_FILES == (export.ITEMS, export.USERS, export.INDEX, export.MANIFEST)
    assert REPORT_FILES == (report.REPORT_JSON, report.REPORT_MD, report.CONTEXT_PLOT, report.HISTORY_PLOT)


def test_prepare_into_the_folder_of_its_raw_input_file_refuses_to_replace_it(tmp_path, folders, capsys):
    """``prepare --input DIR/events.parquet --output DIR``: the cleaned events would replace the raw log (lost); a
    prepared directory's own file prepared into it again is fine (it is read whole before anything is replaced)."""
    import polars as pl

    raw = tmp_path / "raw"
    raw.mkdir()
    pl.read_csv(folders["events"] / "day1.csv").write_parquet(raw / "events.parquet")
    before = _snapshot(raw)
    assert main(["prepare", "--input", str(raw / "events.parquet"), "--output", str(raw), *COMMON]) == 2
    assert _error(capsys) == (f"error: --output {raw} holds the input --input {raw / 'events.parquet'} at events.parquet, "
                              "which it writes; choose another --output")  # fmt: skip
    assert _snapshot(raw) == before
    prepared = folders["prepared"]
    assert main(["prepare", "--input", str(prepared / "events.parquet"), "--output", str(prepared), *COMMON]) == 0


def test_pipeline_into_a_folder_that_holds_another_output_is_refused_before_any_work(tmp_path, folders, capsys):
    for kind, marker in (("rankings", "_manifest.json"), ("prepared", "manifest.json"), ("export", "export.json")):
        before = _snapshot(folders[kind])
        assert main(["pipeline", "--output", str(folders[kind]), "--set", "generate.enabled=false",
                     "--set", f"data.input={folders['events']}"]) == 2  # fmt: skip
        assert f"error: output {folders[kind]} already holds " in (line := _error(capsys)) and f"({marker})" in line
        assert _snapshot(folders[kind]) == before
