"""Atomic writes: old or new content, never half; a symbolic link is written through, not replaced."""

from __future__ import annotations

import os

import pytest

from pipelines.cli import main
from recsys_alibi.atomic import atomic_path, write_json_atomic


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
