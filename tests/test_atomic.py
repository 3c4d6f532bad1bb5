"""Atomic writes: old or new content, never half; a symbolic link is written through, not replaced;
only a regular file is ever replaced (never a device, a FIFO, a socket)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.outputs import OutputPathError, check_output_dir
from recsys_alibi.atomic import OutputKindError, atomic_path, check_replaceable, publish_files, write_json_atomic
from recsys_alibi.config import DataConfig
from recsys_alibi.data.prepare import prepare


def test_a_symlinked_output_file_is_written_through_and_the_link_kept(tmp_path):
    target = tmp_path / "real" / "out.json"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "out.json"
    link.symlink_to(target)
    write_json_atomic(link, {"a": 1})
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == '{\n  "a": 1\n}\n'
    assert not list(tmp_path.glob(".*.tmp")) and not list(target.parent.glob(".*.tmp"))


def test_a_dangling_symlink_gets_its_target_created(tmp_path):
    (tmp_path / "real").mkdir()
    link = tmp_path / "events.parquet"
    link.symlink_to(tmp_path / "real" / "events.parquet")
    with atomic_path(link) as tmp:
        tmp.write_bytes(b"new")
    assert link.is_symlink() and (tmp_path / "real" / "events.parquet").read_bytes() == b"new"


def test_a_failed_write_through_a_symlink_keeps_the_target(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    with pytest.raises(RuntimeError), atomic_path(link) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert target.read_text() == "old" and link.is_symlink() and not list(tmp_path.glob(".*.tmp"))


def test_generate_into_a_symlinked_output_writes_the_linked_file(tmp_path, capsys):
    (tmp_path / "store").mkdir()
    link = tmp_path / "events.parquet"
    link.symlink_to(tmp_path / "store" / "events.parquet")
    assert main(["generate", "--output", str(link), "--users", "5", "--items", "4", "--seed", "1"]) == 0
    assert link.is_symlink() and (tmp_path / "store" / "events.parquet").stat().st_size > 0


# --- only regular files are replaced: a device, FIFO or socket at an output path is refused (issue 31, defect 9)


def _fifo(path):
    os.mkfifo(path)
    return path


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_atomic_path_refuses_a_fifo_before_anything_is_written(tmp_path):
    fifo = _fifo(tmp_path / "out.json")
    ran = []
    with pytest.raises(OutputKindError, match="FIFO"), atomic_path(fifo) as tmp:
        ran.append(tmp)
    assert ran == [] and stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.listdir(tmp_path) == ["out.json"]


def test_a_symlink_to_a_fifo_is_refused_and_both_kept(tmp_path):
    fifo = _fifo(tmp_path / "pipe")
    link = tmp_path / "out.json"
    link.symlink_to(fifo)
    with pytest.raises(OutputKindError, match=r"a link to .*pipe\) is a FIFO"):
        write_json_atomic(link, {"a": 1})
    assert link.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode) and sorted(os.listdir(tmp_path)) == [
        "out.json", "pipe"]  # fmt: skip


def test_publish_files_moves_and_removes_nothing_when_a_target_is_a_fifo(tmp_path):
    staging, out = tmp_path / "staging", tmp_path / "out"
    staging.mkdir(), out.mkdir()
    (staging / "a.json").write_text("new")
    (out / "a.json").write_text("old")
    (out / "c.png").write_text("old plot")  # an earlier writer's file this one does not stage
    _fifo(out / "b.md")
    with pytest.raises(OutputKindError, match="b.md is a FIFO"):
        publish_files(staging, out, ("a.json", "b.md", "c.png"), last="a.json")
    assert (out / "a.json").read_text() == "old" and (out / "c.png").read_text() == "old plot"
    assert stat.S_ISFIFO(os.lstat(out / "b.md").st_mode) and (staging / "a.json").read_text() == "new"


@pytest.mark.parametrize("command", ["generate", "diagnose"])
def test_a_fifo_given_as_file_output_is_refused_with_one_line(tmp_path, capsys, command):
    fifo = _fifo(tmp_path / "out")
    args = ["--users", "5", "--items", "4"] if command == "generate" else ["--heads", "2", "--max-len", "16"]
    assert main([command, "--output", str(fifo), *args]) == 2
    assert "is a FIFO (named pipe), not a regular file" in _error_line(capsys)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.listdir(tmp_path) == ["out"]


def test_a_fifo_or_device_given_as_directory_output_is_refused_naming_its_kind(tmp_path):
    fifo = _fifo(tmp_path / "report")
    with pytest.raises(OutputPathError, match=r"report is a FIFO \(named pipe\), but a directory is written there"):
        check_output_dir(fifo)
    with pytest.raises(OutputPathError, match="/dev/null is a character device, but a directory is written there"):
        check_output_dir("/dev/null", "--output")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_dev_null_is_never_replaced_by_an_output(tmp_path, capsys):
    devnull = "/dev/null"
    if not os.path.exists(devnull) or not stat.S_ISCHR(os.stat(devnull).st_mode):
        pytest.skip("no character device /dev/null here")
    # the guard: the validation itself must refuse it, so the writes below never reach the rename
    with pytest.raises(OutputKindError, match="character device"):
        check_replaceable(devnull)
    link = tmp_path / "events.parquet"
    link.symlink_to(devnull)
    with pytest.raises(OutputKindError, match="character device"):
        check_replaceable(link)
    assert main(["generate", "--output", devnull, "--users", "5", "--items", "4"]) == 2
    assert "/dev/null is a character device, not a regular file" in _error_line(capsys)
    with pytest.raises(OutputKindError), atomic_path(link) as tmp:
        tmp.write_bytes(b"never")
    assert stat.S_ISCHR(os.stat(devnull).st_mode) and link.is_symlink() and not list(Path("/dev").glob(".null.*.tmp"))


def test_prepare_refuses_a_fifo_among_its_outputs_before_writing_anything(tmp_path, capsys):
    events = tmp_path / "events.parquet"
    assert main(["generate", "--output", str(events), "--users", "30", "--items", "20"]) == 0
    out = tmp_path / "prepared"
    out.mkdir()
    _fifo(out / "sequences.parquet")
    capsys.readouterr()
    assert main(["prepare", "--input", str(events), "--output", str(out)]) == 2  # the command: before reading
    assert f"--output {out} holds sequences.parquet, a FIFO (named pipe)" in _error_line(capsys)
    with pytest.raises(OutputKindError, match="sequences.parquet is a FIFO"):  # the library: before publishing
        prepare(DataConfig(), events, out)
    assert os.listdir(out) == ["sequences.parquet"] and stat.S_ISFIFO(os.lstat(out / "sequences.parquet").st_mode)


def test_an_output_directory_holding_a_fifo_is_refused_before_the_job_reads_it(tmp_path, capsys):
    out = tmp_path / "rankings"
    out.mkdir()
    _fifo(out / "_manifest.json")  # read back by score's resume check: reading it would wait forever
    args = ["score", "--model-uri", "runs:/0123/model", "--input", str(tmp_path / "prepared"), "--output", str(out)]
    assert main(args) == 2
    assert f"--output {out} holds _manifest.json, a FIFO (named pipe)" in _error_line(capsys)
    assert os.listdir(out) == ["_manifest.json"] and stat.S_ISFIFO(os.lstat(out / "_manifest.json").st_mode)


def test_pipeline_refuses_a_fifo_in_a_steps_folder_before_its_first_step(tmp_path, capsys):
    (tmp_path / "rankings").mkdir()
    _fifo(tmp_path / "rankings" / "_manifest.json")  # read by its last step, after hours of training
    assert main(["pipeline", "--output", str(tmp_path), "--quiet"]) == 2
    assert "output (rankings) " in _error_line(capsys)
    assert sorted(os.listdir(tmp_path)) == ["rankings"]  # nothing generated


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_json_writer_refuses_nan_and_infinity_naming_the_key_and_writes_nothing(tmp_path, bad):
    """No JSON file of the project holds a bare NaN or Infinity (issue 41, defect 5): the one writer refuses them."""
    from recsys_alibi.atomic import json_text, write_json_atomic

    target = tmp_path / "out.json"
    target.write_text('{"old": 1}\n')
    with pytest.raises(ValueError, match=rf"^\$\.index\.runs\[1\] is {bad}, which JSON cannot hold; it was not written$"):
        write_json_atomic(target, {"index": {"runs": [1.0, bad]}, "ok": None})
    assert target.read_text() == '{"old": 1}\n' and [p.name for p in tmp_path.iterdir()] == ["out.json"]
    assert json_text({"b": None, "a": 1.5}) == '{\n  "a": 1.5,\n  "b": null\n}\n'


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two renames"])
def test_replace_dir_puts_the_new_directory_in_place_and_the_old_one_at_the_source(tmp_path, monkeypatch, exchange):
    from recsys_alibi import atomic

    if not exchange:  # a C library or file system without RENAME_EXCHANGE
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    target, staging = tmp_path / "rankings", tmp_path / ".staging"
    target.mkdir()
    (target / "part-00000.parquet").write_bytes(b"old")
    (target / "part-00001.parquet").write_bytes(b"old, a shard the new run does not have")
    (staging / "rankings").mkdir(parents=True)
    (staging / "rankings" / "part-00000.parquet").write_bytes(b"new")
    atomic.replace_dir(staging / "rankings", target)
    assert sorted(p.name for p in target.iterdir()) == ["part-00000.parquet"]  # no file of the old one
    assert (target / "part-00000.parquet").read_bytes() == b"new"
    assert sorted(p.name for p in (staging / "rankings").iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    assert sorted(p.name for p in staging.iterdir()) == ["rankings"]
    (staging / "fresh").mkdir()
    atomic.replace_dir(staging / "fresh", tmp_path / "fresh")
    assert (tmp_path / "fresh").is_dir() and not (staging / "fresh").exists()  # nothing there before: one rename


def test_replace_dir_refuses_a_target_that_is_not_a_directory(tmp_path):
    from recsys_alibi.atomic import replace_dir

    (tmp_path / "new").mkdir()
    (tmp_path / "rankings").write_text("a file")
    with pytest.raises(OutputKindError, match="is a regular file, not a directory"):
        replace_dir(tmp_path / "new", tmp_path / "rankings")
    assert (tmp_path / "rankings").read_text() == "a file" and (tmp_path / "new").is_dir()
