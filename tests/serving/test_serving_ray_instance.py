"""The Ray instance of ``score --engine ray``: a local one listens on loopback only, ignores RAY_ADDRESS
and ends with its driver (even killed); an address without a cluster is one line, fast.

No module-wide Ray instance here (``test_serving_ray.py`` has one): these tests start their own.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proc_sockets import alive, inet_sockets, is_loopback

from pipelines.cli import main
from recsys_alibi.config import ConfigError, with_overrides

ray = pytest.importorskip("ray", reason="ray is not installed (optional extra: requirements/ray.lock.txt)")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# A driver that scores with a local instance, RAY_ADDRESS set and a `ray start` cluster recorded on
# the machine (both dead addresses); when the first part file is written it records the sockets of
# every process it started, then kills itself (SIGKILL: no cleanup of its own).
DRIVER = """
import json, os, signal, sys
from pathlib import Path
sys.path[:0] = [{here!r}, {repo!r}]
from proc_sockets import descendants, inet_sockets
from serving_fixtures import score_config, tiny_model, vocabulary, write_prepared
from serving.ray_job import score_with_ray
import ray._private.services as services
services.find_bootstrap_address = lambda temp_dir=None: {recorded!r}  # as if `ray start` had left a cluster

def hook(point, shard):
    if point == "written":
        started = descendants(os.getpid())
        with open({report!r}, "w") as f:
            json.dump({{"started": started, "sockets": inet_sockets(list(started)) + inet_sockets([os.getpid()])}}, f)
        os.kill(os.getpid(), signal.SIGKILL)

config = score_config(ray={{"actors": 1, "cpus_per_actor": 1}})
prepared = write_prepared(Path({tmp!r}) / "prepared", n_users=6)
score_with_ray(config, tiny_model(), vocabulary(), prepared, Path({tmp!r}) / "out", progress=False, hook=hook)
"""


def _free_port() -> int:
    """A loopback port where nothing listens (bound once, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_local_ray_instance_listens_on_loopback_only_ignores_ray_address_and_ends_with_a_killed_driver(tmp_path):
    report = tmp_path / "report.json"
    script = DRIVER.format(here=str(HERE), repo=str(REPO), report=str(report), tmp=str(tmp_path),
                           recorded=f"127.0.0.1:{_free_port()}")  # fmt: skip
    env = {**__import__("os").environ, "RAY_ADDRESS": f"127.0.0.1:{_free_port()}", "OMP_NUM_THREADS": "1"}
    driver = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert driver.returncode == -9 and report.is_file(), driver.stderr[-2000:]  # killed in the hook, as planned
    found = json.loads(report.read_text())
    started = {int(pid): t for pid, t in found["started"].items()}
    listening = [s for s in found["sockets"] if s[1].startswith("tcp") and s[3] == "0A"]
    assert len({s[0] for s in listening}) >= 3, found  # GCS, raylet, a worker (and this driver) listen
    exposed = [s for s in found["sockets"] if not is_loopback(s[2])]
    assert not exposed, exposed  # no socket on 0.0.0.0, ::, or the machine's interface address
    deadline = time.monotonic() + 30
    while alive(started) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(started)  # GCS, raylet, agents, workers and the watchdog: all gone


def test_ray_address_auto_without_a_cluster_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from ray._private import services, utils

    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # no cluster on this machine, whatever else runs here
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: set())
    monkeypatch.setattr(utils, "read_ray_address", lambda temp_dir=None: None)
    code = main(["score", "--engine", "ray", "--model-uri", "runs:/x/model", "--input", str(tmp_path / "in"),
                 "--output", str(tmp_path / "out"), "--set", "score.ray.address=auto"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: score.ray.address=auto: no running Ray cluster")


def test_ray_address_where_nothing_listens_is_one_line_and_exit_2_within_the_connect_timeout(tmp_path, capsys):
    for address in (f"127.0.0.1:{_free_port()}", f"ray://127.0.0.1:{_free_port()}", "localhost"):
        started = time.monotonic()
        code = main(["score", "--engine", "ray", "--model-uri", "runs:/x/model", "--input", str(tmp_path / "in"),
                     "--output", str(tmp_path / "out"), "--set", f"score.ray.address={address}"])  # fmt: skip
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith(f"error: score.ray.address={address}: "), err
        assert time.monotonic() - started < 10
    assert "cannot connect to 127.0.0.1:" in err[0] or "give auto, host:port" in err[0]


def test_pipeline_with_score_engine_ray_checks_ray_before_training(tmp_path):
    from pipelines.pipeline import run_pipeline
    from recsys_alibi.config import JobConfig

    address = f"127.0.0.1:{_free_port()}"
    config = with_overrides(JobConfig(), output=str(tmp_path / "run"), score={"engine": "ray", "ray": {"address": address}})
    with pytest.raises(ConfigError, match=f"score.ray.address={address}: cannot connect"):
        run_pipeline(config, progress=False)
    assert not (tmp_path / "run").exists()  # refused before generate, prepare and training


def test_ray_address_on_loopback_stays_loopback_for_auto_and_host_port(monkeypatch):
    """Ray swaps 127.0.0.1 for the machine's interface address; a cluster listening on loopback only
    (as the local instances here do) must still be found and checked there."""
    from serving.ray_instance import checked_address

    with socket.socket() as listener:  # stands for a GCS on 127.0.0.1
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        monkeypatch.setenv("RAY_ADDRESS", address)
        assert checked_address("auto") == address
        assert checked_address(address) == address


def test_auto_joins_by_rays_own_discovery_not_by_the_resolved_address(monkeypatch):
    """break-dist-s66 finding 1: a cluster from `ray start --head --node-ip-address 127.0.0.1` (token auth on by
    default) refused ``ray.init(address=<resolved host:port>)`` while ``ray.init(address="auto")`` joined it:
    ``score.ray.address=auto`` is checked to answer, then joined as ``auto``; a host:port is joined as given."""
    import ray

    from recsys_alibi.config import RayConfig
    from serving.ray_instance import ray_instance

    joined: list[str] = []
    monkeypatch.setattr(ray, "init", lambda address, **kwargs: joined.append(address))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with socket.socket() as listener:  # stands for a GCS on 127.0.0.1
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        monkeypatch.setenv("RAY_ADDRESS", address)
        for given in ("auto", address):
            with ray_instance(RayConfig(address=given)):
                pass
    assert joined == ["auto", address]


LONG_TMPDIR_DRIVER = """
import sys
from pathlib import Path
sys.path[:0] = [{here!r}, {repo!r}]
from serving_fixtures import read_rankings, score_config, tiny_model, vocabulary, write_prepared
from serving.ray_job import score_with_ray
from serving.score import score_with_model
config = score_config(ray={{"actors": 1, "cpus_per_actor": 1}})
prepared = write_prepared(Path({tmp!r}) / "prepared", n_users=6)
result = score_with_ray(config, tiny_model(), vocabulary(), prepared, Path({tmp!r}) / "out", progress=False)
score_with_model(config, tiny_model(), vocabulary(), prepared, Path({tmp!r}) / "local", progress=False)
same = read_rankings(Path({tmp!r}) / "out").equals(read_rankings(Path({tmp!r}) / "local"))
print("ranked", result.users_ranked, "same as local:", same)
"""


def test_local_instance_with_a_long_temp_folder_puts_its_sockets_under_a_short_one(tmp_path):
    """Issue 41, defect 8: with TMPDIR as macOS and CI runners set it, Ray failed with `AF_UNIX path
    length cannot exceed 107 bytes` (a traceback, exit 1)."""
    long_tmp = tmp_path / ("a-long-temp-folder-" + "x" * 60)
    long_tmp.mkdir()
    script = LONG_TMPDIR_DRIVER.format(here=str(HERE), repo=str(REPO), tmp=str(tmp_path))
    env = {**__import__("os").environ, "TMPDIR": str(long_tmp), "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    driver = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert driver.returncode == 0, driver.stderr[-2000:]
    assert driver.stdout.strip().splitlines()[-1] == "ranked 6 same as local: True"


def test_no_folder_short_enough_for_the_sockets_is_one_line_and_exit_2_before_any_work(tmp_path, monkeypatch, capsys):
    import tempfile

    from serving import ray_instance

    long_tmp = tmp_path / ("a-long-temp-folder-" + "x" * 60)
    long_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(long_tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    monkeypatch.setattr(ray_instance, "SHORT_TEMP_DIRS", (str(tmp_path / "missing"),))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    code = main(["score", "--engine", "ray", "--model-uri", "runs:/x/model", "--input", str(tmp_path / "in"),
                 "--output", str(tmp_path / "out")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: score.engine=ray: the temp folder {long_tmp} is too long a path for the local Ray")
    assert err[0].endswith("set TMPDIR to a writable folder of at most 14 characters")
    assert not (tmp_path / "out").exists()
