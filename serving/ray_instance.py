"""The Ray instance a ``score --engine ray`` job uses: a cluster it joins, or a local one it owns.

``score.ray.address`` unset: the job starts a **local instance** of its own and ends it:

* every process of it (GCS, raylet, its agents, the workers, this driver's core worker) listens
  on 127.0.0.1 only: ``ray.init(address="local", _node_ip_address="127.0.0.1")`` with Ray's
  cluster mode off while it starts (:func:`loopback_env`; otherwise Ray 2.60 swaps 127.0.0.1 for
  the machine's interface address and its gRPC servers listen on every interface), no dashboard;
* it ignores ``RAY_ADDRESS`` and a cluster already running on the machine (``ray start``): the
  ``"local"`` address never joins one (``score.ray.address=auto`` does);
* it ends with the job: ``ray.shutdown()`` on exit, and a watchdog process (:func:`_watchdog`)
  started before Ray that, once the driver is gone (its pipe closes: normal end, exception or
  ``kill -9``), ends every process of its session still holding a file in the instance's own
  Ray directory (``ray.init(_temp_dir=...)``, :data:`TEMP_PREFIX` + a random suffix, in the temp
  folder or, when its path is too long for Ray's Unix sockets, in ``/tmp``: :func:`local_ray_dir`; each Ray
  process keeps its log files there open; an environment mark would not do, Ray's Python
  processes overwrite theirs with their process title). Ray's own fate sharing ends the GCS and
  raylet with a killed driver but left the dashboard and runtime-env agents running. Ray's logs
  stay in that directory.

``score.ray.address`` set: the job joins that cluster (``auto``: Ray's discovery, i.e.
``RAY_ADDRESS`` or the cluster ``ray start`` left on this machine; ``host:port`` or
``ray://host:port``). The address is checked first (:func:`checked_address`): no cluster for
``auto``, or nothing accepting a TCP connection at the address within
:data:`CONNECT_TIMEOUT_S`, is one line (``ConfigError``) rather than Ray's traceback or its
retries without end. Inside a running Ray job (``ray.is_initialized()``) that instance is used.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from recsys_alibi.config import ConfigError, RayConfig

log = logging.getLogger(__name__)

RAY_MISSING = (
    "score.engine=ray needs Ray: install the optional extra (pip install --no-deps -r requirements/ray.lock.txt, "
    "part of `make install`)"
)
QUIET_LOGGERS = ("ray", "ray.data", "ray.util", "ray._private", "filelock")
LOOPBACK = "127.0.0.1"
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # every Ray process takes 127.0.0.1 as its node address
TEMP_PREFIX = "recsys-alibi-ray-"  # the local instance's Ray directory (sockets, logs) in the temp folder
# Ray's Unix sockets lie at <dir>/session_<YYYY-MM-DD_HH-MM-SS_ffffff>_<pid>/sockets/plasma_store[.N]: this
# many bytes after <dir> at most (a 7-digit pid, N < 100); an AF_UNIX path has at most 107 (103 on macOS)
SOCKET_TAIL = len("/session_2000-01-01_00-00-00_000000_4194304/sockets/plasma_store.99")
SHORT_TEMP_DIRS = ("/tmp",)  # where the local Ray directory goes when the temp folder's path is too long
CONNECT_TIMEOUT_S = 5.0
RAY_CLIENT_PORT = 10001  # ray://host without a port

# The watchdog: ignores the signals a terminal or a group kill sends, waits for EOF on stdin (the
# driver closed its pipe or died), then ends the processes of its session (never the driver) holding a
# file below argv[1] (a viewer of Ray's logs started from another terminal is left alone).
_WATCHDOG = r"""
import os, signal, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
driver, session, root = os.getppid(), os.getsid(0), sys.argv[1].rstrip("/") + "/"
sys.stdin.buffer.read()
def holds(pid):
    try:
        if os.getsid(int(pid)) != session:
            return False
        fds = [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return False
    for link in [f"/proc/{pid}/cwd", *fds]:
        try:
            if (os.readlink(link) + "/").startswith(root):
                return True
        except OSError:
            pass
    return False
def marked():
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (os.getpid(), driver) and holds(p)]
for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 1.0)):
    for pid in marked():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    end = time.monotonic() + wait
    while marked() and time.monotonic() < end:
        time.sleep(0.1)
"""


def import_ray():
    """``ray`` with ``ray.data``; ``ConfigError`` (:data:`RAY_MISSING`) when the extra is not installed."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray


@contextmanager
def _loopback_kept() -> Iterator[None]:
    """Ray's cluster mode off in this process (``ray_constants.ENABLE_RAY_CLUSTER``, read from
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once at import), so that Ray keeps a loopback address
    as given instead of replacing it by the machine's interface address; restored after."""
    from ray._private import ray_constants

    cluster_mode = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = cluster_mode


@contextmanager
def loopback_env() -> Iterator[None]:
    """Ray's settings for a loopback local instance while it starts; the caller's restored after.

    Sets :data:`LOOPBACK_ENV` (the processes Ray starts inherit it and name 127.0.0.1 as their node
    address), removes ``RAY_ADDRESS`` (a local instance joins nothing) and turns Ray's cluster
    mode off in this process too (:func:`_loopback_kept`): without that the driver resolves
    127.0.0.1 to the machine's interface address and the GCS, raylet and workers listen on every
    interface.
    """
    env = {**LOOPBACK_ENV, "RAY_ADDRESS": None}
    before = {key: os.environ.get(key) for key in env}
    _set_env(env)
    try:
        with _loopback_kept():
            yield
    finally:
        _set_env(before)


def _set_env(values: dict[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def checked_address(address: str) -> str:
    """The cluster address ``ray.init`` should join, checked to answer first.

    Args:
        address: ``score.ray.address``: ``auto``, ``host:port`` or ``ray://host[:port]``.

    Returns:
        ``auto`` resolved by Ray's own discovery (``host:port``); other addresses as given. A
        loopback address stays loopback (Ray would swap it for the interface address, where a
        cluster started on 127.0.0.1 does not listen: :func:`_loopback_kept`).

    Raises:
        ConfigError: ``auto`` finds no cluster; the address has no host or port; nothing accepts
            a TCP connection there within :data:`CONNECT_TIMEOUT_S` (refused, unreachable, unknown host).
    """
    from ray._private import services

    fix = "start it (ray start --head) or leave score.ray.address unset for a local loopback instance"
    resolved = address
    if address == "auto":
        try:
            with _loopback_kept():
                resolved = services.canonicalize_bootstrap_address("auto")
        except ConnectionError:
            raise ConfigError(
                "score.ray.address=auto: no running Ray cluster found (no RAY_ADDRESS, no `ray start` on this "
                f"machine); {fix}"
            ) from None
    host, _, port = resolved.removeprefix("ray://").rpartition(":")
    if resolved.startswith("ray://") and not port.isdigit():
        host, port = resolved.removeprefix("ray://"), str(RAY_CLIENT_PORT)
    if not host or not port.isdigit():
        raise ConfigError(f"score.ray.address={address}: give auto, host:port or ray://host:port")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        reason = "timed out" if isinstance(err, TimeoutError) else (err.strerror or type(err).__name__)
        raise ConfigError(
            f"score.ray.address={address}: cannot connect to {host}:{port} ({reason}, {CONNECT_TIMEOUT_S:.0f} s); {fix}"
        ) from None
    return resolved


def _is_loopback(address: str) -> bool:
    host = address.removeprefix("ray://").rpartition(":")[0].strip("[]") or address.removeprefix("ray://")
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def check_ray(cfg: RayConfig) -> None:
    """Before any work: Ray is installed and, unless Ray runs in this process, ``cfg.address`` answers
    or, without one, a local instance has a folder for its sockets.

    Raises:
        ConfigError: as :func:`import_ray`, :func:`checked_address` and :func:`local_ray_base`.
    """
    ray = import_ray()
    if cfg.address and not ray.is_initialized():
        checked_address(cfg.address)
    elif not ray.is_initialized():
        local_ray_base()


def local_ray_dir() -> Path:
    """A new directory for a local instance's files (:data:`TEMP_PREFIX` + a random suffix) in
    :func:`local_ray_base`.

    Raises:
        ConfigError: as :func:`local_ray_base`.
    """
    return Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=local_ray_base()))


def local_ray_base() -> str:
    """The folder of a local instance's directory, one whose path leaves room for Ray's Unix sockets
    (:data:`SOCKET_TAIL` bytes below the directory; ``AF_UNIX`` paths have at most 107 bytes, 103 on
    macOS): the temp folder (``TMPDIR``), or, when that path is too long (macOS and CI runners set
    long ones), the first of :data:`SHORT_TEMP_DIRS` that is a writable folder (logged).

    Raises:
        ConfigError: no such folder has a path short enough; names ``TMPDIR`` as the fix.
    """
    limit = (103 if sys.platform == "darwin" else 107) - SOCKET_TAIL
    temp = tempfile.gettempdir()
    for base in (temp, *SHORT_TEMP_DIRS):
        fits = len(os.path.join(base, TEMP_PREFIX + "x" * 8).encode()) <= limit
        if fits and os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK):
            if base != temp:
                log.info("the temp folder %s is too long a path for Ray's sockets; the local Ray instance uses %s", temp, base)
            return base
    raise ConfigError(
        f"score.engine=ray: the temp folder {temp} is too long a path for the local Ray instance's sockets "
        f"(Unix socket paths have at most {limit + SOCKET_TAIL} bytes, Ray's lie {SOCKET_TAIL} below it) and "
        f"{' and '.join(SHORT_TEMP_DIRS)} cannot be used; set TMPDIR to a writable folder of at most "
        f"{limit - len(TEMP_PREFIX) - 9} characters"
    )


def _watchdog(ray_dir: Path) -> subprocess.Popen:
    """Start the watchdog of a local instance: once this process closes the pipe or dies, it ends
    every process holding a file below ``ray_dir`` (Linux ``/proc``; elsewhere it ends nothing)."""
    return subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(ray_dir)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


@contextmanager
def ray_instance(cfg: RayConfig) -> Iterator[None]:
    """Ray for one job: the running instance if there is one, else ``cfg.address``, else a local one.

    A local instance (``address`` None, the module docstring): loopback only, no dashboard, holds
    ``ceil(actors * cpus_per_actor)`` CPUs (and the GPUs the actors ask for); it and every process
    it started end when this exits or the process dies. Ray's log lines below ERROR and its
    workers' output are not passed to this process.

    Raises:
        ConfigError: Ray is not installed; ``cfg.address`` finds no cluster, does not answer, or
            ``ray.init`` cannot join it (Ray's own retries, then its ``ConnectionError``); no
            folder for a local instance has a path short enough for its sockets (:func:`local_ray_dir`).
    """
    ray = import_ray()
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    if ray.is_initialized():
        yield
        return
    quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    watchdog = None
    try:
        if cfg.address:
            address = checked_address(cfg.address)
            # auto joins by Ray's own discovery: it reads what `ray start` left (its node address, its auth token),
            # which the resolved host:port alone loses (a cluster started with --node-ip-address refused it)
            target = "auto" if cfg.address == "auto" else address
            try:
                with _loopback_kept() if target != "auto" and _is_loopback(address) else nullcontext():
                    ray.init(address=target, **quiet)
            except (ConnectionError, RuntimeError) as err:  # e.g. not a Ray GCS, or another auth token
                raise ConfigError(f"score.ray.address={cfg.address}: Ray could not join the cluster at {address} "
                                  f"({str(err).strip().splitlines()[0]})") from None  # fmt: skip
        else:
            ray_dir = local_ray_dir()
            watchdog = _watchdog(ray_dir)  # first: a driver killed while Ray starts leaves nothing either
            gpus = math.ceil(cfg.actors * cfg.gpus_per_actor) if cfg.gpus_per_actor else 0
            with loopback_env():
                ray.init(address="local", num_cpus=max(1, math.ceil(cfg.actors * cfg.cpus_per_actor)), num_gpus=gpus,
                         _node_ip_address=LOOPBACK, _temp_dir=str(ray_dir), **quiet)  # fmt: skip
        for name in QUIET_LOGGERS:  # ray.init configures its loggers again
            logging.getLogger(name).setLevel(logging.ERROR)
        yield
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if watchdog is not None:
            watchdog.stdin.close()  # EOF: it ends what is left of the instance
            try:
                watchdog.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log.warning("the Ray watchdog (pid %d) is still ending the local instance", watchdog.pid)
