"""Bad input files stop every command that reads them with one `error:` line and exit 2."""

from __future__ import annotations

from pipelines.cli import main

LATIN1 = "user_id,item_id,timestamp\nu1,caf\xe9,1\nu1,b,2\n".encode("latin-1")


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_non_utf8_input_is_a_user_error_in_prepare_and_pipeline(tmp_path, mlflow_store, capsys):
    log = tmp_path / "latin.csv"
    log.write_bytes(LATIN1)
    assert main(["prepare", "--input", str(log), "--output", str(tmp_path / "prepared"), "--quiet"]) == 2
    assert "is not UTF-8 text: byte 0xe9 at line 2" in _one_error_line(capsys)
    assert main(["pipeline", "--set", f"data.input={log}", "--output", str(tmp_path / "job"), "--quiet"]) == 2
    assert "is not UTF-8 text" in _one_error_line(capsys)


def test_ragged_and_semicolon_inputs_through_the_command(tmp_path, capsys):
    semi = tmp_path / "semi.csv"
    semi.write_text("user_id;item_id;timestamp\n" + "".join(f"u{u};i{u % 3};{u}\n" for u in range(30)))
    out = tmp_path / "prepared"
    common = ["--set", "data.min_events_per_user=1", "--set", "data.min_events_per_item=1", "--quiet"]
    assert main(["prepare", "--input", str(semi), "--output", str(out), *common]) == 0
    assert "prepared 30 events" in capsys.readouterr().out
    assert main(["prepare", "--input", str(semi), "--output", str(out), "--set", "data.separator=','", *common]) == 2
    assert "data.separator=';'" in _one_error_line(capsys)
