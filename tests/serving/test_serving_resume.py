"""A job killed at any moment and started again ends with exactly the output of a clean run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest
from serving_fixtures import Killed, kill_at, killed_temp, score_config, snapshot, tiny_model, vocabulary

from recsys_alibi.data import schema
from serving.manifest import OutputDirError
from serving.score import score_with_model

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _events_csv(prepared: Path, path: Path) -> Path:
    seq = pl.read_parquet(prepared / schema.SEQUENCES_FILE).select(schema.USER_ID, schema.ITEM_IDX, schema.TIMESTAMP)
    seq.explode(schema.ITEM_IDX, schema.TIMESTAMP).with_columns(
        (pl.col(schema.ITEM_IDX).cast(pl.Int64) + 1000).alias(schema.ITEM_ID)
    ).select(schema.USER_ID, schema.ITEM_ID, schema.TIMESTAMP).write_csv(path)
    return path


def _run(input_path, out, hook=None):
    return score_with_model(score_config(), tiny_model(), vocabulary(), input_path, out, progress=False, hook=hook)


@pytest.mark.parametrize(
    ("point", "shard"),
    [("staged", -1), ("written", 0), ("written", 2), ("recorded", 2), ("recorded", 4), ("finished", -1)],
)
def test_kill_and_resume_equals_a_clean_run(prepared, tmp_path, point, shard):
    _run(prepared, tmp_path / "clean")
    with pytest.raises(Killed):
        _run(prepared, tmp_path / "killed", hook=kill_at(point, shard))
    killed_temp(tmp_path / "killed" / "part-00003.parquet")  # killed mid-write
    resumed = _run(prepared, tmp_path / "killed")
    assert snapshot(tmp_path / "killed") == snapshot(tmp_path / "clean")
    assert resumed.rows == sum(s["rows"] for s in json.loads((tmp_path / "clean" / "_manifest.json").read_text())["shards"].values())
    if point == "written":  # the part was in place but unrecorded: scored again
        assert resumed.shards_skipped == shard
    if point == "recorded":
        assert resumed.shards_skipped == shard + 1


@pytest.mark.parametrize("point", ["staged", "recorded", "finished"])
def test_kill_and_resume_raw_events(prepared, tmp_path, point):
    events = _events_csv(prepared, tmp_path / "events.csv")
    _run(events, tmp_path / "clean")
    with pytest.raises(Killed):
        _run(events, tmp_path / "killed", hook=kill_at(point, 1 if point == "recorded" else -1))
    _run(events, tmp_path / "killed")
    clean, resumed = snapshot(tmp_path / "clean"), snapshot(tmp_path / "killed")
    for name in ("_input/stats.json", "_input/_staged.json"):  # name the input path / its own output dir
        clean.pop(name), resumed.pop(name)
    assert resumed == clean
    assert pl.read_parquet(tmp_path / "clean" / "part-*.parquet").equals(
        pl.read_parquet(tmp_path / "killed" / "part-*.parquet")
    )


def test_hard_kill_of_a_process_then_resume(prepared, tmp_path):
    """SIGKILL in a real process, right after a part file is renamed into place."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(HERE)!r})
        from serving_fixtures import Killed, kill_at, score_config, snapshot, tiny_model, vocabulary
        from serving.score import score_with_model

        def hook(point, shard):
            if (point, shard) == ("written", 1):
                os.kill(os.getpid(), signal.SIGKILL)

        score_with_model(score_config(), tiny_model(), vocabulary(), {str(prepared)!r}, {str(tmp_path / 'killed')!r},
                         progress=False, hook=hook)
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    left = sorted(p.name for p in (tmp_path / "killed").glob("part-*.parquet"))
    assert left == ["part-00000.parquet", "part-00001.parquet"]
    _run(prepared, tmp_path / "killed")
    _run(prepared, tmp_path / "clean")
    assert snapshot(tmp_path / "killed") == snapshot(tmp_path / "clean")


def test_output_dir_of_another_job_is_refused_or_replaced(prepared, tmp_path):
    _run(prepared, tmp_path / "out")
    with pytest.raises(OutputDirError, match="different k"):
        score_with_model(score_config(k=3), tiny_model(), vocabulary(), prepared, tmp_path / "out", progress=False)
    replaced = score_with_model(score_config(k=3, overwrite=True), tiny_model(), vocabulary(), prepared, tmp_path / "out",
                                progress=False)
    score_with_model(score_config(k=3), tiny_model(), vocabulary(), prepared, tmp_path / "k3", progress=False)
    assert replaced.shards_skipped == 0
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest == json.loads((tmp_path / "k3" / "_manifest.json").read_text())
    assert snapshot(tmp_path / "out") == snapshot(tmp_path / "k3")
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "part-00000.parquet").write_bytes(b"x")
    with pytest.raises(OutputDirError, match="no _manifest.json"):
        _run(prepared, tmp_path / "stray")


def test_a_complete_job_is_not_scored_again(prepared, tmp_path):
    first = _run(prepared, tmp_path / "out")
    again = _run(prepared, tmp_path / "out")
    assert (again.shards_skipped, again.users_scored, again.rows) == (first.shards, 0, first.rows)
    assert os.path.getmtime(tmp_path / "out" / "part-00000.parquet") > 0


def test_resume_sweeps_only_stale_temporaries_of_its_own_files(prepared, tmp_path):
    """A score output's sweep (issue 41, defect 7's class) takes only temporaries of the files a scoring
    job writes whose writer is gone: not another writer's file beside them, not one still held."""
    from recsys_alibi.staging import held_temp, release

    out = tmp_path / "out"
    with pytest.raises(Killed):
        _run(prepared, out, hook=kill_at("recorded", 1))
    killed = [killed_temp(out / "part-00003.parquet"), killed_temp(out / "_fingerprints" / "part-00002.parquet"),
              killed_temp(out / "_manifest.json")]  # fmt: skip
    not_ours = killed_temp(out / "notes.json")  # another program's file in the folder
    running, fd = held_temp(out / "part-00004.parquet")  # a writer still running
    _run(prepared, out)
    assert not any(p.exists() for p in killed) and not_ours.exists() and running.exists()
    release(fd)


def test_a_temporary_whose_writer_dies_during_the_rerun_is_swept_when_the_job_completes(prepared, tmp_path):
    """A writer of the killed run (a Ray actor, killed asynchronously) can still hold its temporary when the
    rerun sweeps at its start and die while the rerun goes on: the completed job sweeps again, so the
    output is byte for byte a clean run's (it left `_fingerprints/.part-00004.parquet.<token>.tmp`)."""
    from recsys_alibi.staging import held_temp, release

    out = tmp_path / "out"
    with pytest.raises(Killed):
        _run(prepared, out, hook=kill_at("recorded", 1))
    late, fd = held_temp(out / "_fingerprints" / "part-00004.parquet")

    def dies(at: str, shard: int) -> None:
        if (at, shard) == ("recorded", 3):
            release(fd)

    _run(prepared, out, hook=dies)
    _run(prepared, tmp_path / "clean")
    assert not late.exists() and snapshot(out) == snapshot(tmp_path / "clean")
