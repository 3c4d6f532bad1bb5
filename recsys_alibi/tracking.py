"""MLflow helpers: where runs go, flattened params, logging and loading the ranker.

The default store is embedded: ``sqlite:///<cwd>/mlflow.db`` with artifacts under
``<cwd>/mlruns``. ``MLFLOW_TRACKING_URI`` overrides ``tracking.uri``. The ranker is logged with
``mlflow.pytorch`` with explicit pip requirements (inferring them takes ~15 s and drops the
``+cpu`` torch build) and with the item vocabulary beside it, so a model URI alone is enough to
score: ``runs:/RUN_ID/model``, ``models:/NAME/VERSION`` or ``models:/NAME@ALIAS``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import polars as pl

from recsys_alibi.config import ConfigError, JobConfig, TrackingConfig
from recsys_alibi.tracking_store import ready_locked_store, sqlite_store_path, store_setup_lock

log = logging.getLogger(__name__)

ITEMS_ARTIFACT = "items.parquet"
CONFIG_ARTIFACT = "job_config.json"
_PIP_REQUIREMENTS = [
    "torch==2.13.0",
    "torchrec==1.8.0",
    "fbgemm-gpu-cpu==1.8.0",
    "lightning==2.6.6",
    "polars==2.1.0",
    "pyarrow==25.0.1",
]


class ModelUriError(ValueError):
    """A model URI that MLflow cannot resolve; the message names the URI and the fix."""


def tracking_uri(cfg: TrackingConfig) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else ``cfg.uri``, else the embedded SQLite store under the cwd."""
    return os.environ.get("MLFLOW_TRACKING_URI") or cfg.uri or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


_DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")  # MLflow's SQLAlchemy stores besides SQLite


def tracking_uri_origin() -> str:
    """Where :func:`tracking_uri` took its value: ``MLFLOW_TRACKING_URI`` or ``tracking.uri``."""
    return "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "tracking.uri"


def check_tracking_uri(uri: str, origin: str = "tracking.uri") -> None:
    """Refuse a tracking URI MLflow would fail on with a traceback, before any work.

    Accepted: ``sqlite:///PATH`` (relative) or ``sqlite:////PATH``; ``http(s)://HOST[:PORT]``;
    ``postgresql://``, ``mysql://``, ``mssql://`` (with ``+driver``) when their driver imports; Databricks.
    A folder (``./mlruns``, ``file:///...``) only with ``MLFLOW_ALLOW_FILE_STORE=true`` (MLflow keeps the
    file store in maintenance mode and refuses it otherwise).

    Raises:
        ConfigError: one line naming the URI, ``origin`` and the forms that work.
    """
    shown = f"tracking URI '{uri}' ({origin})"
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    base = scheme.split("+", 1)[0]
    if uri.split(":", 1)[0].lower() in ("databricks", "databricks-uc", "uc"):  # "databricks", "databricks://PROFILE"
        _check_databricks_credentials(shown)
        return
    if scheme in ("", "file") or (len(scheme) == 1 and uri[1:2] == ":"):  # a path (a Windows drive letter too)
        if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() in ("true", "1"):
            return
        raise ConfigError(f"{shown} is a folder store, which MLflow keeps in maintenance mode and refuses: use a "
                          "SQLite store (sqlite:///mlflow.db, the default when no URI is set) or a tracking server "
                          "(http://HOST:PORT); MLFLOW_ALLOW_FILE_STORE=true makes MLflow use the folder anyway")  # fmt: skip
    if base == "sqlite":
        if not uri.lower().startswith("sqlite:///") or not uri[len("sqlite:///"):].split("?", 1)[0]:
            raise ConfigError(f"{shown} is not a SQLite store MLflow reads: write sqlite:///RELATIVE/PATH.db or "
                              "sqlite:////ABSOLUTE/PATH.db (three or four slashes)")  # fmt: skip
        return
    if scheme in ("http", "https") and not parsed.hostname:
        raise ConfigError(f"{shown} names no host: write {scheme}://HOST:PORT")
    if scheme in ("http", "https"):
        _check_reachable(shown, parsed)
        return
    if base in _DATABASE_SCHEMES:
        from sqlalchemy import create_engine  # imports the dialect's driver; connects to nothing yet

        try:
            create_engine(uri)
        except ImportError as err:
            raise ConfigError(f"{shown} needs a database driver that is not installed ({err}); install it in "
                              "this environment or use another store") from None  # fmt: skip
        except Exception as err:  # noqa: BLE001 - SQLAlchemy's URL parser: one line
            raise ConfigError(f"{shown} is not a database URL SQLAlchemy reads ({str(err).splitlines()[0]})") from None
        return
    raise ConfigError(f"{shown}: MLflow has no store for '{parsed.scheme}://'; use sqlite:///PATH.db, "
                      "http(s)://HOST:PORT, postgresql://, mysql://, mssql:// or databricks")  # fmt: skip


def _check_databricks_credentials(shown: str) -> None:
    """Refuse Databricks without credentials: MLflow fails there only at the first call, after the day is prepared,
    with a traceback and its own tips (environment variables ``DATABRICKS_*`` or a ``~/.databrickscfg``)."""
    config_file = Path(os.environ.get("DATABRICKS_CONFIG_FILE", "~/.databrickscfg")).expanduser()
    if any(key.startswith("DATABRICKS_") for key in os.environ) or config_file.is_file():
        return
    raise ConfigError(f"{shown} needs Databricks credentials and none are set: set DATABRICKS_HOST and "
                      "DATABRICKS_TOKEN, or write ~/.databrickscfg, or use another store")  # fmt: skip


REACH_SECONDS = 5.0  # how long a tracking server may take to accept a connection before a job starts


def _check_reachable(shown: str, parsed) -> None:
    """Refuse a tracking server nobody answers at (refused, no such host, no answer in :data:`REACH_SECONDS`), or one
    that answers but is no MLflow server (its ``/health`` not 200, 401 or 403): MLflow would retry each call for
    minutes, or fail on the first, and end in a traceback after the day's prepare."""
    import urllib.error
    import urllib.request

    port = parsed.port or (443 if parsed.scheme.lower() == "https" else 80)
    health = parsed.geturl().rstrip("/") + "/health"  # every MLflow server answers it, without credentials
    try:
        with urllib.request.urlopen(health, timeout=REACH_SECONDS):  # noqa: S310 - the configured server's own URL
            return
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):  # a gateway that wants credentials: MLflow sends them (MLFLOW_TRACKING_TOKEN ...)
            return
        why = f"GET /health answered {err.code}"
    except urllib.error.URLError as err:  # no connection: refused, no such host, no answer in REACH_SECONDS
        reason = err.reason
        why = getattr(reason, "strerror", None) or str(reason)  # "Connection refused", "Name or service not known"
        raise ConfigError(f"{shown}: no tracking server answers at {parsed.hostname}:{port} ({why}); start it, "
                          "or point tracking.uri / MLFLOW_TRACKING_URI at one that runs") from None  # fmt: skip
    except (OSError, ValueError) as err:  # connected, but no HTTP answer
        why = f"GET /health failed: {type(err).__name__}"
    raise ConfigError(f"{shown}: the server at {parsed.hostname}:{port} is no MLflow tracking server ({why}); point "
                      "tracking.uri / MLFLOW_TRACKING_URI at one (mlflow server --host HOST --port PORT)")  # fmt: skip


def setup_tracking(cfg: TrackingConfig, reading: str | None = None) -> str:
    """Point MLflow at the store and make sure the experiment exists; returns the experiment id.

    A new experiment on a local store keeps its artifacts under ``<cwd>/mlruns``. A ``sqlite:///`` store that does
    not exist yet is created complete or not at all (:func:`recsys_alibi.tracking_store.ready_store`).

    Args:
        cfg: the tracking section.
        reading: the model URI the job is about to load (``score``, ``evaluate``, ``export``): a ``runs:/`` or
            ``models:/`` URI on a SQLite store whose file does not exist cannot resolve, and a local path with no
            ``MLmodel`` file is no model: both are refused before the store is created (no stray ``mlflow.db`` in
            the working directory of a mistaken run).

    Raises:
        ModelUriError: ``reading`` names a run or registered model and the SQLite store does not exist, or a
            local folder that holds no ``MLmodel``.
        ConfigError: a tracking URI MLflow cannot use (:func:`check_tracking_uri`).
        StoreError: the SQLite store is half-made or no SQLite database
            (:func:`recsys_alibi.tracking_store.ready_store`).
    """
    import mlflow

    uri = tracking_uri(cfg)
    check_tracking_uri(uri, tracking_uri_origin())
    store = sqlite_store_path(uri)
    if reading is not None and urlparse(reading).scheme in ("runs", "models") and store is not None and not store.exists():
        raise ModelUriError(
            f"cannot load model '{reading}': there is no tracking store at {uri} (none was created here); run "
            "from the folder where the model was trained, or set MLFLOW_TRACKING_URI / tracking.uri to its store"
        )
    scheme = urlparse(reading).scheme if reading is not None else None
    if scheme in ("", "file") and not (Path(urlparse(reading).path if scheme else reading) / "MLmodel").is_file():
        raise ModelUriError(f"cannot load model '{reading}': it is no MLflow model folder (no MLmodel file in it); "
                            "give runs:/RUN_ID/model or models:/NAME/VERSION from `recsys-alibi train`, or the folder "
                            "that holds MLmodel")  # fmt: skip
    mlflow.set_tracking_uri(uri)
    with store_setup_lock(uri):  # jobs started together on a new SQLite store would both create its tables
        if store is not None:
            ready_locked_store(store)  # a new store appears complete or not at all; a half-made one is refused
        experiment = mlflow.get_experiment_by_name(cfg.experiment)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            artifacts = (Path.cwd() / "mlruns").as_uri() if uri.startswith("sqlite:") else None
            experiment_id = mlflow.create_experiment(cfg.experiment, artifact_location=artifacts)
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists kept as their string form)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def metric_key(name: str) -> str:
    """An MLflow-safe metric name: ``"NDCG@10"`` -> ``"NDCG_at_10"``."""
    return re.sub(r"[^\w./\- :]", "_", name.replace("@", "_at_"))


def param_values(tree: dict[str, Any]) -> dict[str, str]:
    """A config tree as MLflow run params: flattened keys, values as strings of <= 500 characters."""
    return {k: str(v)[:500] for k, v in flatten(tree).items()}


def log_config(config: JobConfig) -> None:
    """Log the resolved job config as run params and as a JSON artifact."""
    import mlflow

    tree = config.model_dump()
    mlflow.log_params(param_values(tree))
    mlflow.log_dict(tree, CONFIG_ARTIFACT)


@dataclass(frozen=True)
class PyfuncFlavour:
    """The ``python_function`` flavour logged beside ``pytorch`` (built by ``serving.pyfunc``).

    Attributes:
        loader_module: module whose ``_load_pyfunc(data_path)`` MLflow calls (``serving.pyfunc``).
        signature: ``mlflow.models.ModelSignature`` (inputs, rankings output, params).
        input_example: a pandas frame MLflow stores and predicts on once when logging.
        model_config: the keys ``mlflow.pyfunc.load_model(URI, model_config=...)`` may set, with
            their defaults (MLflow passes only keys logged here to ``_load_pyfunc``).
    """

    loader_module: str
    signature: Any
    input_example: Any
    model_config: dict[str, Any] | None = None


def _save_with_pyfunc(path, mlflow_model, pyfunc_loader: str | None = None, pyfunc_config: dict | None = None,
                      **kwargs) -> None:  # fmt: skip
    """``mlflow.pytorch.save_model``, then its ``python_function`` flavour pointed at ``pyfunc_loader``
    (with ``pyfunc_config`` as its ``model_config``)."""
    import mlflow
    from mlflow.models.model import MLMODEL_FILE_NAME

    mlflow.pytorch.save_model(path=path, mlflow_model=mlflow_model, **kwargs)
    if pyfunc_loader is not None:
        flavour = dict(mlflow_model.flavors[mlflow.pyfunc.FLAVOR_NAME])
        flavour.update(loader_module=pyfunc_loader)
        flavour.pop("model_config", None)
        if pyfunc_config is not None:  # the keys load_model(model_config=...) may set (MLflow's "config")
            flavour[mlflow.pyfunc.MODEL_CONFIG] = {**flavour.get(mlflow.pyfunc.MODEL_CONFIG, {}), **pyfunc_config}
        mlflow_model.flavors[mlflow.pyfunc.FLAVOR_NAME] = flavour
        mlflow_model.save(os.path.join(path, MLMODEL_FILE_NAME))


class _PytorchWithPyfunc:
    """An MLflow flavour module for ``Model.log``: the PyTorch flavour plus the project's pyfunc."""

    save_model = staticmethod(_save_with_pyfunc)


def log_ranker(
    model, items: pl.DataFrame, registered_name: str | None, workdir: Path, *, pyfunc: PyfuncFlavour | None = None
) -> "LoggedModel":
    """Log the ranker (a torch ``nn.Module``) with its item vocabulary into the active run.

    With ``pyfunc`` the same logged model (and so the same registry version) also loads with
    ``mlflow.pyfunc.load_model``: its ``python_function`` flavour is ``pyfunc.loader_module``,
    with the signature and input example given (MLflow predicts on the example once).

    Returns the logged model's URI and, when ``registered_name`` is given, the new registry version.
    """
    import mlflow
    from mlflow.models import Model

    workdir.mkdir(parents=True, exist_ok=True)
    items_path = workdir / ITEMS_ARTIFACT
    items.write_parquet(items_path)
    extra = {} if pyfunc is None else {"pyfunc_loader": pyfunc.loader_module, "signature": pyfunc.signature,
                                       "input_example": pyfunc.input_example, "pyfunc_config": pyfunc.model_config}  # fmt: skip
    # the registry's "Registered model ... / Created version ..." lines; the input example's download bars
    with _mlflow_prints_muted(), quiet_artifacts():
        info = Model.log(
            artifact_path=None,
            name="model",
            flavor=_PytorchWithPyfunc,
            flavor_name="pytorch",
            pytorch_model=model.cpu(),
            pickle_module=mlflow.pytorch.pickle_module,
            pip_requirements=_PIP_REQUIREMENTS,
            extra_files=[str(items_path)],
            registered_model_name=registered_name,
            serialization_format="pickle",  # the whole module; code is importable where it loads
            **extra,
        )
    version = getattr(info, "registered_model_version", None)
    uri = f"runs:/{info.run_id}/model"  # resolves to the logged model in MLflow 3 too
    return LoggedModel(uri=uri, run_id=info.run_id, version=None if version is None else str(version))


REGISTRY_CHATTER = re.compile(r"^(Successfully registered model|Registered model .* already exists|Created version)\b")


@contextlib.contextmanager
def _mlflow_prints_muted() -> Iterator[None]:
    """Drop MLflow's registry chatter from stderr for the block; every other line passes through.

    MLflow prints those lines through its own stream (``eprint``), which writes to ``sys.stderr``
    and is re-enabled inside ``Model.log``, so neither ``logging`` levels nor its switch hold.
    """
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            yield
    finally:
        kept = [ln for ln in captured.getvalue().splitlines(keepends=True) if not REGISTRY_CHATTER.match(ln)]
        sys.stderr.write("".join(kept))


@dataclass(frozen=True)
class LoggedModel:
    """Where a logged ranker lives: its URI, its run, and its registry version (if registered)."""

    uri: str
    run_id: str
    version: str | None


@dataclass(frozen=True)
class LoadedRanker:
    """A ranker loaded from a model URI, its vocabulary and the run it was logged in."""

    model: Any  # AlibiRanker
    items: pl.DataFrame  # item_idx int32, item_id raw, count int64
    run_id: str | None


def load_ranker(model_uri: str) -> LoadedRanker:
    """Load a logged ranker and its item vocabulary from any MLflow model URI.

    MLflow's download progress bars are off while it loads (:func:`quiet_artifacts`).

    Raises:
        ModelUriError: the URI does not resolve to a model logged by recsys-alibi, or names a deleted
            run (:func:`check_live_run`).
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        check_live_run(model_uri)
        with quiet_artifacts():
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri))
        loaded = load_ranker_dir(local)
        run_id = model_run_id(model_uri)
    except ModelUriError as err:
        raise ModelUriError(f"model '{model_uri}': {err}") from None
    # ImportError: a scheme whose client is not installed (s3:// needs boto3); ValueError: a URI MLflow cannot
    # split (http://host/path: "not enough values to unpack")
    except (MlflowException, OSError, ImportError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        scheme = urlparse(model_uri).scheme
        if isinstance(err, ImportError):
            first = f"reading {scheme}:// needs the module {err.name}, which is not installed"
        elif scheme in ("http", "https") and not isinstance(err, (MlflowException, OSError)):
            first = "MLflow reads no model from a web address"
        raise ModelUriError(
            f"cannot load model '{model_uri}' ({first}) from the tracking store {mlflow.get_tracking_uri()}; use "
            "runs:/RUN_ID/model or models:/NAME/VERSION from `recsys-alibi train` and check MLFLOW_TRACKING_URI / "
            "tracking.uri"
        ) from None
    return LoadedRanker(model=loaded.model, items=loaded.items, run_id=run_id)


def load_ranker_dir(local: Path) -> LoadedRanker:
    """Load a ranker and its vocabulary from a local MLflow model directory (``run_id`` None).

    Raises:
        ModelUriError: no item vocabulary beside the model (not a recsys-alibi model).
        MlflowException, OSError: MLflow cannot load the PyTorch flavour.
    """
    import mlflow

    model = mlflow.pytorch.load_model(str(local), map_location="cpu")
    found = list(Path(local).rglob(ITEMS_ARTIFACT))
    if not found:
        raise ModelUriError(f"no item vocabulary ({ITEMS_ARTIFACT}) beside the model: not a recsys-alibi model")
    model.eval()
    return LoadedRanker(model=model, items=pl.read_parquet(found[0]), run_id=None)


def check_live_run(model_uri: str) -> None:
    """Refuse a model URI whose MLflow run is deleted in the tracking store: ``runs:/ID/...``, and the registry's
    ``models:/NAME/VERSION`` and ``models:/NAME@ALIAS`` (the run of that version).

    MLflow deletes runs softly: the model still loads until ``mlflow gc`` removes it, but the run is
    gone from the UI and from searches, so a job (a warm start, a scoring, the gate's champion) that used it
    would build on a model nobody can inspect any more. A registered version outlives its run in the
    registry, so a ``models:/`` URI is refused the same way as the ``runs:/`` form (one line, the same fix).

    Raises:
        ModelUriError: the run is deleted (one line naming it and how to restore it).
        MlflowException: a ``runs:/`` run that is not in the store. A ``models:/`` URI that does not
            resolve is left to the loader (its own message names what is missing).
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    if model_uri.startswith("runs:/"):
        run_id = model_uri[len("runs:/") :].split("/")[0]
        stage = mlflow.MlflowClient().get_run(run_id).info.lifecycle_stage
    elif model_uri.startswith("models:/"):
        try:
            run_id = model_run_id(model_uri)
            stage = mlflow.MlflowClient().get_run(run_id).info.lifecycle_stage if run_id else None
        except MlflowException:  # no such name, version or alias (or a run gone for good): the loader says which
            return
    else:
        return
    if stage == "deleted":
        raise ModelUriError(deleted_run_message(run_id))


def deleted_run_message(run_id: str) -> str:
    """The one line that refuses a model of a deleted MLflow run (every URI form, the gate's champion too)."""
    return f"MLflow run {run_id} is deleted; restore it (`mlflow runs restore --run-id {run_id}`) or use another model"


@contextlib.contextmanager
def quiet_artifacts() -> Iterator[None]:
    """MLflow's "Downloading artifacts" progress bars off for the block (they would land in a job's log)."""
    name = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    before = os.environ.get(name)
    os.environ[name] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def model_run_id(model_uri: str) -> str | None:
    """The run that logged the model behind ``runs:/``, ``models:/NAME/VERSION`` or ``models:/NAME@ALIAS``."""
    import mlflow

    if model_uri.startswith("runs:/"):
        return model_uri[len("runs:/") :].split("/")[0]
    if model_uri.startswith("models:/"):
        client = mlflow.MlflowClient()
        spec = model_uri[len("models:/") :]
        if "@" in spec:
            name, alias = spec.split("@", 1)
            return client.get_model_version_by_alias(name, alias).run_id
        name, _, version = spec.partition("/")
        if version.isdigit():
            return client.get_model_version(name, version).run_id
        try:
            return mlflow.get_logged_model(spec).source_run_id
        except Exception:  # noqa: BLE001 - a logged-model id that is not a registry name
            return None
    return None
