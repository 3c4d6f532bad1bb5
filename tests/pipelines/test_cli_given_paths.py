"""Paths and usage the command line refuses in one ``error:`` line (exit code 2) before any work:
symbolic-link loops, empty paths, argparse usage errors; and messages that name the path the user
gave, never a temporary beside it; training settings refused before any process starts."""

from __future__ import annotations

import errno
import os

import pytest

from pipelines.cli import main
from recsys_alibi import atomic, staging

LOOP_FIX = "is a symbolic-link loop; remove the link or give another path"


def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line]
    assert len(err) == 1, err
    return err[0]


@pytest.fixture
def loop(tmp_path, monkeypatch):
    """``loopA -> loopB -> loopA`` in the working directory."""
    monkeypatch.chdir(tmp_path)
    os.symlink("loopA", "loopB")
    os.symlink("loopB", "loopA")
    return tmp_path


@pytest.mark.parametrize(("command", "flag", "given"), [
    (["generate", "--users", "5", "--items", "10"], "--output", "loopA"),
    (["prepare", "--input", "events.csv"], "--output", "loopA"),
    (["prepare", "--output", "P"], "--input", "loopA"),
    (["train"], "--prepared", "loopA"),
    (["evaluate", "--baseline", "popularity"], "--prepared", "loopA"),
    (["evaluate", "--baseline", "popularity", "--prepared", "P"], "--output", "loopA"),
    (["score", "--model-uri", "runs:/x/model", "--input", "P"], "--output", "loopA"),
    (["export", "--model-uri", "runs:/x/model"], "--input", "loopA"),
    (["diagnose", "--heads", "2", "--max-len", "8"], "--output", "loopA"),
    (["prepare", "--input", "events.csv", "--output", "P"], "--config", "loopA"),
])  # fmt: skip
def test_a_symbolic_link_loop_is_one_line_in_every_command(loop, capsys, command, flag, given):
    assert main([*command, flag, given]) == 2
    assert _one_error_line(capsys) == f"error: {flag} loopA {LOOP_FIX}"
    assert sorted(os.listdir(loop)) == ["loopA", "loopB"]  # nothing created


def test_a_path_through_a_loop_names_the_loop(loop, capsys):
    assert main(["evaluate", "--baseline", "popularity", "--output", "loopA/report"]) == 2
    assert _one_error_line(capsys) == f"error: --output loopA/report: loopA {LOOP_FIX}"


def test_a_loop_in_a_config_key_is_one_line(loop, capsys):
    assert main(["train", "--prepared", "P", "--set", "output=loopA"]) == 2
    assert _one_error_line(capsys) == f"error: output (checkpoints) loopA {LOOP_FIX}"
    assert main(["prepare", "--output", "P", "--set", "data.input=loopA"]) == 2
    assert _one_error_line(capsys) == f"error: {loop / 'loopA'} {LOOP_FIX}"  # resolved by the collision check


def test_load_config_names_a_config_loop(loop):
    from recsys_alibi.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=f"^config loopA {LOOP_FIX}$"):
        load_config("loopA")


@pytest.mark.parametrize(("command", "flag"), [
    (["prepare", "--input", "events.csv"], "--output"), (["prepare", "--output", "P"], "--input"),
    (["generate"], "--output"), (["train"], "--prepared"), (["pipeline"], "--output"), (["train"], "--config"),
    (["score", "--model-uri", "runs:/x/model"], "--input"), (["score", "--model-uri", "runs:/x/model"], "--items"),
])  # fmt: skip
def test_an_empty_path_flag_is_refused(tmp_path, monkeypatch, capsys, command, flag):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main([*command, flag, ""])
    assert stopped.value.code == 2
    assert _one_error_line(capsys) == (f"error: argument {flag}: an empty path (an unset variable?); give a path "
                                       f"(see recsys-alibi {command[0]} --help)")  # fmt: skip
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("key", ["output", "data.input", "data.items", "score.allow", "score.deny", "score.items"])
def test_an_empty_path_key_is_refused(tmp_path, monkeypatch, capsys, key):
    monkeypatch.chdir(tmp_path)
    assert main(["prepare", "--output", "P", "--set", f"{key}=''"]) == 2
    assert _one_error_line(capsys) == (f"error: invalid config at '{key}': an empty path (an unset variable?): give a "
                                       "path, or leave the key out (got '')")  # fmt: skip


@pytest.mark.parametrize(("argv", "expected"), [
    (["evaluate", "--prepared", "P", "--baseline", "random"],
     "error: argument --baseline: invalid choice: 'random' (choose from 'popularity') (see recsys-alibi evaluate --help)"),
    (["score", "--model-uri", "runs:/x/model", "--k", "abc"],
     "error: argument --k: invalid int value: 'abc' (see recsys-alibi score --help)"),
    (["bogus"], "error: argument command: invalid choice: 'bogus' (choose from 'generate', 'prepare', 'train', "
                "'evaluate', 'score', 'export', 'pipeline', 'diagnose') (see recsys-alibi --help)"),
    ([], "error: the following arguments are required: command (see recsys-alibi --help)"),
])  # fmt: skip
def test_a_usage_error_is_one_line(capsys, argv, expected):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    assert _one_error_line(capsys) == expected
    assert capsys.readouterr().out == ""


def test_an_error_on_a_temporary_names_the_output(tmp_path, monkeypatch, capsys):
    """A failure while creating the temporary beside a target (``.NAME.<token>.new``) names the target."""
    target = tmp_path / "gone" / "events.parquet"

    def missing_folder(path, **kwargs):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path.parent / f".{path.name}.0123456789abcdef.new"))

    monkeypatch.setattr(atomic, "held_temp", missing_folder)
    assert main(["generate", "--users", "5", "--items", "10", "--output", str(target)]) == 2
    assert _one_error_line(capsys) == f"error: No such file or directory: {target}"


@pytest.mark.parametrize(("path", "shown"), [
    ("out/.events.parquet.0123456789abcdef.new", "out/events.parquet"),
    ("out/.events.parquet.0123456789abcdef.tmp", "out/events.parquet"),
    ("out/.export.0123456789abcdef.tmp/items.parquet", "out/export"),
    ("out/events.parquet", "out/events.parquet"),
])  # fmt: skip
def test_shown_path_is_the_target_of_a_temporary(path, shown):
    assert str(staging.shown_path(path)) == shown


@pytest.mark.parametrize("precision", ["64", "64-true", "16-true", "bf16-true"])
def test_precisions_the_ranker_cannot_train_with_are_refused_at_load(tmp_path, monkeypatch, capsys, precision):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--prepared", "P", "--set", f"train.precision={precision}"]) == 2
    got = "64" if precision == "64" else f"'{precision}'"
    assert _one_error_line(capsys) == (
        "error: invalid config at 'train.precision': Input should be 'auto', '32-true', 'bf16-mixed', '16-mixed', "
        f"'32', 'bf16' or '16' or 16 or 32 (got {got})"
    )


def test_a_batch_that_does_not_divide_over_the_processes_is_refused_before_they_start(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--prepared", "P", "--set", "train.devices=3", "--set", "train.batch_size=32"]
    assert main([*argv, "--set", "train.accelerator=cpu", "--set", "train.strategy=ddp"]) == 2
    assert _one_error_line(capsys) == (
        "error: invalid config at 'train': train.batch_size=32 is the global batch and must be divisible by the 3 "
        "training processes (train.devices=3 x train.num_nodes=1)"
    )
    assert os.listdir(tmp_path) == []


def test_an_output_directory_with_a_glob_character_is_refused_with_one_line(tmp_path, capsys, monkeypatch):
    """A prepared (or any output) folder is read back by Polars, which would take ``o[1]`` as a pattern."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "e.csv").write_text("user_id,item_id,timestamp\n1,2,3\n1,3,4\n")
    assert main(["prepare", "--input", "e.csv", "--output", "o[1]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --output o[1] has the glob character '[' in its path, and the files written there are read "
                   "back as a pattern; give a directory path without *, ? or ["]
    assert not (tmp_path / "o[1]").exists()
