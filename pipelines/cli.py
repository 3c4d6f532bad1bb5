"""The ``recsys-alibi`` command: ``main(argv)`` parses, builds a typed config and runs one job.

Every subcommand takes ``--config PATH`` and repeated ``--set dotted.key=value``; its own flags
override the config. User errors (bad config, bad input, unknown model URI) end with a one-line
``error: ...`` on stderr and exit code 2; heavy imports happen only in the subcommand that needs
them, so ``--help`` and ``prepare`` start fast.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import traceback
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from pipelines.outputs import (
    EXIT_FAILURE,
    EXIT_USER_ERROR,
    GivenPathError,
    OutputPathError,
    as_os_error,
    check_given_path,
    check_output_dir,
    check_output_file,
    describe_error_path,
    describe_os_error,
    forget_new_folders,
    remove_new_empty_folders,
)

if TYPE_CHECKING:
    from recsys_alibi.config import JobConfig

log = logging.getLogger("recsys_alibi")

EXIT_SIGINT, EXIT_SIGTERM = 128 + signal.SIGINT, 128 + signal.SIGTERM  # what a shell reports for a process they ended


RESUME_HELP = (
    "continue the newest unfinished <output>/checkpoints/<run_id>/last.ckpt and its MLflow run, on any "
    "number of processes (= --set train.resume=true); starts a new run when there is none"
)


class _StoreOnce(argparse._StoreAction):
    """A flag of one value given twice is refused: argparse keeps the last one without a word, so
    ``prepare --input A --input B`` prepared B alone."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: D102 - argparse's hook
        given = namespace.__dict__.setdefault("_given_flags", {})
        if self.dest in given:
            hint = ": to read several inputs, put their files in one folder or name them with a glob" \
                if self.dest == "input" else ""  # fmt: skip
            parser.error(f"{option_string} given twice ({given[self.dest]!r}, then {str(values)!r}); give it once{hint}")
        given[self.dest] = str(values)
        setattr(namespace, self.dest, values)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one ``error: ...`` line (exit code 2) naming ``--help`` instead of the usage
    text, and a flag of one value given twice refused (:class:`_StoreOnce`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(EXIT_USER_ERROR, f"error: {message} (see {self.prog} --help)\n")


EMPTY_PATH = "an empty path (an unset variable?); give a path"


def _path(text: str) -> Path:
    """A path flag's value; an empty one (``--output "$OUT"`` with ``OUT`` unset) is refused, not the working directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError(EMPTY_PATH)
    return Path(text)


def _path_text(text: str) -> str:
    """As :func:`_path`, kept as text (a glob, or a path read later)."""
    _path(text)
    return text


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=_path, default=None, help="YAML job config")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set model.n_layers=4 (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand (flags per CONTRACT.md)."""
    parser = _Parser(prog="recsys-alibi", description="Next-item ranking with an ALiBi transformer: prepare event logs, "
                     "train, evaluate, score top-K rankings, export vectors, run the daily pipeline.")  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    parser.command_parsers = sub.choices  # subcommand -> its parser (main names its help in a usage error)

    p = sub.add_parser("generate", help="write the synthetic behaviour log (embedded default data)")
    _common(p)
    p.add_argument("--output", type=_path, help="events Parquet path")
    p.add_argument("--users", type=int)
    p.add_argument("--items", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--days", type=int, help="write the log as N daily files day-001.parquet ... into the --output directory")

    p = sub.add_parser("prepare", help="events -> cleaned events, vocabulary, sequences, rejects")
    _common(p)
    p.add_argument("--input", type=_path_text, help="events: Parquet file/dir/glob, CSV/TSV, NDJSON, MovieLens, SASRec, S3-Rec (.gz ok)")
    p.add_argument("--format", choices=["parquet", "csv", "ndjson", "movielens", "sasrec", "s3rec"])
    p.add_argument("--output", type=_path, help="prepared directory")
    p.add_argument("--append", action="store_true", default=None,
                   help="merge --input (new events) into the existing prepared --output (data.append)")
    p.add_argument("--items", dest="item_table", metavar="PATH", type=_path_text,
                   help="item table (Parquet/CSV/NDJSON) keyed by raw item_id, columns per data.item_features (data.items)")

    p = sub.add_parser("train", help="train the ranker; logs to MLflow and prints mlflow_run_id")
    _common(p)
    p.add_argument("--prepared", type=_path, help="prepared directory")
    p.add_argument("--resume", action="store_true", help=RESUME_HELP)

    p = sub.add_parser("evaluate", help="full-catalog ranking evaluation of a model or baseline")
    _common(p)
    p.add_argument("--prepared", type=_path, help="prepared directory")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--model-uri", help="runs:/ID/model, models:/NAME/VERSION or models:/NAME@ALIAS")
    group.add_argument("--baseline", choices=["popularity"], help="evaluate a baseline instead of a model")
    p.add_argument("--output", type=_path, help="report directory")

    p = sub.add_parser("score", help="batch top-K rankings per user to Parquet")
    _common(p)
    p.add_argument("--model-uri", required=True, help="runs:/ID/model, models:/NAME/VERSION or models:/NAME@ALIAS")
    p.add_argument("--input", type=_path, help="prepared dir, sequences Parquet, or raw events (any prepare format)")
    p.add_argument("--output", type=_path, help="rankings directory")
    p.add_argument("--k", type=int, help="items per user in the rankings (default score.k)")
    p.add_argument("--engine", choices=["local", "ray"],
                   help="local: this process (or torchrun shards); ray: a Ray Data actor pool (score.ray.*)")
    p.add_argument("--changed-since", metavar="PREVIOUS_OUTPUT", type=_path_text,
                   help="rank only users whose history changed since that output (same model); carry the rest over")
    p.add_argument("--items", dest="item_table", metavar="PATH", type=_path_text,
                   help="item table or prepared dir: items the model never saw are ranked from their features (score.items)")

    p = sub.add_parser("export", help="item and user vectors (inner product) for a nearest-neighbour index")
    _common(p)
    p.add_argument("--model-uri", required=True, help="runs:/ID/model, models:/NAME/VERSION or models:/NAME@ALIAS")
    p.add_argument("--input", type=_path, help="prepared dir, sequences Parquet, or raw events (any prepare format)")
    p.add_argument("--output", type=_path, help="export directory (items.parquet, users.parquet, export.json)")
    p.add_argument("--index", choices=["none", "faiss"], help="faiss: also a FAISS index over the items (export.*)")

    p = sub.add_parser("pipeline", help="generate -> prepare -> train -> evaluate -> register -> score")
    _common(p)
    p.add_argument("--output", type=_path, help="output directory of every step")
    p.add_argument("--resume", action="store_true", help=RESUME_HELP)

    p = sub.add_parser("diagnose", help="ALiBi numerics per head, dtype and length")
    _common(p)
    p.add_argument("--heads", type=int, help="attention heads, 1..256 (one table row each)")
    p.add_argument("--max-len", type=int, help="length in items (with --model-uri: diagnose the model at this length)")
    p.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="bfloat16")
    p.add_argument("--model-uri")
    p.add_argument("--output", type=_path, help="JSON path")
    return parser


FLAG_KEYS = {
    "users": "generate.users", "items": "generate.items", "seed": "seed", "days": "generate.days",
    "format": "data.format", "append": "data.append", "k": "score.k", "engine": "score.engine",
    "changed_since": "score.changed_since", "index": "export.index",
    "heads": "model.n_heads", "max_len": "model.max_len",
}  # flag (argparse dest) -> the config key it sets


def _flag_values(args: argparse.Namespace) -> dict[str, tuple[str, object]]:
    """Flags that mirror config keys: ``{key: ("--flag", value)}``, applied after ``--set`` as given."""
    found = {key: (f"--{flag.replace('_', '-')}", getattr(args, flag))
             for flag, key in FLAG_KEYS.items() if getattr(args, flag, None) is not None}  # fmt: skip
    if args.command == "pipeline" and args.output is not None:
        found["output"] = ("--output", str(args.output))
    if args.command == "diagnose" and (getattr(args, "heads", None) or 0) > 0:  # the diagnosis reads no width: one
        found["model.d_model"] = ("--heads", 8 * args.heads)  # that any head count divides (64 refused --heads 6)
    if getattr(args, "item_table", None) is not None:  # --items: a path here, a count in generate
        found["data.items" if args.command == "prepare" else "score.items"] = ("--items", str(args.item_table))
    if getattr(args, "resume", False):
        found["train.resume"] = ("--resume", True)
    return found


PATH_FLAGS = {"config": "--config", "input": "--input", "output": "--output", "prepared": "--prepared",
              "item_table": "--items", "changed_since": "--changed-since"}  # argparse dest -> flag, of path flags


def _check_given_paths(args: argparse.Namespace) -> None:
    """Refuse a path flag's value that is a symbolic-link loop (or goes through one) before any work."""
    for dest, flag in PATH_FLAGS.items():
        check_given_path(getattr(args, dest, None), flag)


CONFIG_INPUT = ("data.input (from the config, or --input PATH; a relative path is read from the working directory, "
                "not from the config's folder)")


def _default_prepared(config: JobConfig, given: Path | None) -> Path:
    return given or Path(config.output) / "prepared"


def _cmd_generate(config: JobConfig, args) -> str:
    from pipelines.collisions import Output, check_apart
    from pipelines.data_steps import run_generate, run_generate_days

    if config.generate.days is not None:
        days = check_output_dir(args.output or Path(config.output) / "days")
        check_apart([Output("--output", days, "folder")], {})
        return run_generate_days(config, days).summary()
    output = check_output_file(args.output or Path(config.output) / "events.parquet", example="events.parquet")
    check_apart([Output("--output", output, "file")], {})
    return run_generate(config, output).summary()


def _cmd_prepare(config: JobConfig, args) -> str:
    from pipelines.data_steps import run_prepare
    from recsys_alibi.data.formats import resolve_paths

    given = config.data.input if args.input is None else None
    if given is not None and not os.path.lexists(given):  # missing (or a glob): named as the config gave it
        resolve_paths(given, "input", CONFIG_INPUT)
    return run_prepare(config, args.input, check_output_dir(_default_prepared(config, args.output))).summary()


def _cmd_train(config: JobConfig, args) -> str:
    from pipelines.collisions import Output, check_apart
    from pipelines.train import run_train

    check_output_dir(config.output, "output (checkpoints)")
    prepared = _default_prepared(config, args.prepared)
    check_apart([Output("output (checkpoints)", Path(config.output) / "checkpoints", "folder")], {"--prepared": prepared})
    result = run_train(config, prepared, progress=not args.quiet)
    if result.rank != 0:  # another training process: rank 0 prints the run
        return ""
    return f"{result.summary()}\nmlflow_run_id: {result.run_id}"


def _cmd_evaluate(config: JobConfig, args) -> str:
    from pipelines.collisions import Output, check_apart, local_model_path
    from pipelines.evaluate import run_evaluate
    from recsys_alibi.evaluation.report import format_metrics_table

    output = check_output_dir(args.output or Path(config.output) / "report")
    prepared = _default_prepared(config, args.prepared)
    check_apart([Output("--output", output, "report")], {"--prepared": prepared, "--model-uri": local_model_path(args.model_uri)})
    job = run_evaluate(config, prepared, model_uri=args.model_uri, baseline=args.baseline, output_dir=output)
    return f"{format_metrics_table({job.name: job.result}, config.evaluate.ks)}\n{job.summary()}"


def _cmd_score(config: JobConfig, args) -> str:
    from pipelines.collisions import Output, check_apart, local_model_path
    from serving.engines import run_score  # score.engine's engine; an overwrite replaces the rankings as a whole

    output = check_output_dir(args.output or Path(config.output) / "rankings")
    input_path = args.input or _default_prepared(config, None)
    score = config.score
    check_apart([Output("--output", output, "rankings")], {
        "--input": input_path, "--changed-since": score.changed_since, "score.allow": score.allow, "score.deny": score.deny,
        "score.items": score.items, "data.items": config.data.items, "--model-uri": local_model_path(args.model_uri)})  # fmt: skip
    result = run_score(config, args.model_uri, input_path, output, progress=not args.quiet)
    return result.summary()


def _cmd_export(config: JobConfig, args) -> str:
    from pipelines.collisions import Output, check_apart, local_model_path
    from serving.export import run_export

    if _rank() != 0:  # under torchrun one process exports: the others would write the same files again
        return ""
    output = check_output_dir(args.output or Path(config.output) / "export")
    input_path = args.input or _default_prepared(config, None)
    check_apart([Output("--output", output, "export")], {
        "--input": input_path, "score.items": config.score.items, "data.items": config.data.items,
        "--model-uri": local_model_path(args.model_uri)})  # fmt: skip
    return run_export(config, args.model_uri, input_path, output).summary()


def _cmd_pipeline(config: JobConfig, args) -> str:
    from pipelines.pipeline import check_pipeline_launch, run_pipeline
    from recsys_alibi.training.launch import launch_rank

    check_pipeline_launch(config)
    out = check_output_dir(config.output)
    for step in ("prepared", "report", "rankings"):  # the steps' folders: a device or FIFO there is refused now
        check_output_dir(out / step, f"output ({step})")
    if launch_rank(config.train.devices) != 0:  # a training process started by Lightning: train only
        from pipelines.train import run_train

        return run_train(config, Path(config.output) / "prepared", progress=False).summary()
    return run_pipeline(config, progress=not args.quiet).summary()


def _cmd_diagnose(config: JobConfig, args) -> str:
    from pipelines.collisions import Output, check_apart, local_model_path
    from pipelines.diagnose import run_diagnose
    from recsys_alibi.config import ConfigError

    if args.model_uri is not None and args.heads is not None:  # it was dropped without a word
        raise ConfigError(f"--heads {args.heads}: with --model-uri the heads are the model's own; drop --heads (--max-len "
                          "sets the length to diagnose the model at)")  # fmt: skip
    output = None if args.output is None else check_output_file(args.output, example="diagnosis.json")
    if output is not None:
        check_apart([Output("--output", output, "file")], {"--model-uri": local_model_path(args.model_uri)})
    return run_diagnose(config, dtype=args.dtype, model_uri=args.model_uri, output=output, length=args.max_len).summary()


COMMANDS: dict[str, Callable[[JobConfig, argparse.Namespace], str]] = {
    "generate": _cmd_generate,
    "prepare": _cmd_prepare,
    "train": _cmd_train,
    "evaluate": _cmd_evaluate,
    "score": _cmd_score,
    "export": _cmd_export,
    "pipeline": _cmd_pipeline,
    "diagnose": _cmd_diagnose,
}


def configure_logging() -> None:
    """INFO from this project's loggers on stderr; WARNING and up from everything else.

    Also silences the known, harmless warnings of the pinned dependencies (ENVIRONMENT.md).
    """
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # MLflow's "View run ... at: URL" / "View experiment at: URL" lines on stdout as each run ends against a
    # tracking server (cron logs); the run id and model URI are in the command's own summary
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    for name in ("recsys_alibi", "pipelines", "serving"):
        logging.getLogger(name).setLevel(logging.INFO)
    for pattern in (r".*noload.*", r".*distutils.*", r".*LeafSpec.*", r".*litlogger.*", r".*is_fx_tracing.*",
                    r".*smaller than the logging interval.*"):  # Lightning's tip on tiny epochs
        warnings.filterwarnings("ignore", message=pattern)
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)  # torchrec's is_fx_tracing notice
    # pytorch_lightning / lightning_fabric: the same packages under their standalone names, which
    # MLflow's model loading imports; their banners would come through from the second run of a process
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric", "pytorch_lightning.utilities.rank_zero",
                 "lightning_fabric", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("mlflow.pytorch").setLevel(logging.ERROR)  # the pickle notice: we log pickled on purpose
    # Importing lightning resets the levels of "lightning", "lightning.fabric" and "lightning.pytorch" to INFO
    # (set above when they are imported already), and "lightning" has a handler of its own ("INFO: ..."): their
    # INFO lines would come twice. These modules' loggers keep their level: "Initializing distributed:
    # GLOBAL_RANK ..." per rank, and "Received SIGTERM" (the interrupted command says so itself)
    for name in ("lightning.fabric.utilities.distributed", "lightning_fabric.utilities.distributed",
                 "lightning.pytorch.trainer.connectors.signal_connector",
                 "pytorch_lightning.trainer.connectors.signal_connector"):  # fmt: skip
        logging.getLogger(name).setLevel(logging.WARNING)
    # torchrec's planner (model.shard_embeddings), once per rank: notices about its own defaults; the plan is
    # row-wise on one table and the job goes on ("the job will fail" is its generic text)
    warnings.filterwarnings("ignore", message=r"HeuristicalStorageReservation is known to cause issues",
                            category=FutureWarning)  # fmt: skip
    for name, start in (("torchrec.distributed.planner.types", "The topology was constructed directly"),
                        ("torchrec.distributed.planner.storage_reservations",
                         "There is a known issue with TorchRec's dense tensor size")):  # fmt: skip
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropStartingWith) and f.start == start for f in logger.filters):
            logger.addFilter(_DropStartingWith(start))


class _DropStartingWith(logging.Filter):
    """Drops the records whose message starts with ``start`` (one known third-party notice, nothing else)."""

    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


def _check_model_uri_form(uri: str | None) -> None:
    """A ``runs:/`` or ``models:/`` URI that MLflow would refuse with its own internals (``Not a proper runs:/
    URI``, ``No such artifact: 'MLmodel'``): a run without the model's path, or a trailing ``/``; named with the fix.

    Raises:
        ValueError: one line with the URI to give instead.
    """
    if uri is None or not uri.startswith(("runs:/", "models:/")):
        return
    fixed = uri.rstrip("/")
    scheme, _, rest = fixed.partition(":/")
    if scheme == "runs" and rest and "/" not in rest:  # runs:/ID: the run, not the model logged in it
        raise ValueError(f"cannot load model '{uri}': runs:/RUN_ID names a run, not a model; give {fixed}/model "
                         "(the path `recsys-alibi train` logs the model at)")  # fmt: skip
    if fixed != uri and rest:
        raise ValueError(f"cannot load model '{uri}': a model URI has no trailing '/'; give {fixed}")


REGISTERING = ("train", "pipeline")  # the commands that register tracking.registered_model


def _check_tracking_names(config: JobConfig, args: argparse.Namespace) -> None:
    """Before any work: a registered model name whose promotion lock file cannot exist beside the local store
    (:func:`pipelines.registry_lock.check_lock_name`), in the commands that register it."""
    if args.command not in REGISTERING:
        return
    from pipelines.registry_lock import check_lock_name
    from recsys_alibi.tracking import tracking_uri

    check_lock_name(tracking_uri(config.tracking), config.tracking.registered_model)


def _changed(section) -> list[str]:
    """The keys of a config section that are away from their defaults."""
    default = type(section)()
    return [key for key in type(section).model_fields if getattr(section, key) != getattr(default, key)]


def _say_unused(config: JobConfig, args: argparse.Namespace) -> None:
    """One warning line for each setting this command will not use, so that no run logs a value it never used
    without saying so: ``tracking.uri`` under ``MLFLOW_TRACKING_URI``, ``score.ray.*`` with the local engine,
    ``generate.*`` in a pipeline that reads ``data.input``."""
    command = args.command
    env_uri = os.environ.get("MLFLOW_TRACKING_URI")
    tracked = command not in ("generate", "prepare") and (command != "diagnose" or args.model_uri is not None)
    if tracked and env_uri and config.tracking.uri is not None and env_uri != config.tracking.uri:
        log.warning("MLFLOW_TRACKING_URI=%s overrides tracking.uri=%s: the runs go to %s; unset MLFLOW_TRACKING_URI "
                    "to use tracking.uri", env_uri, config.tracking.uri, env_uri)  # fmt: skip
    ray = _changed(config.score.ray)
    if command in ("score", "pipeline") and config.score.engine == "local" and ray:
        log.warning("%s: not used with score.engine=local (they set up --engine ray)",
                    ", ".join(f"score.ray.{key}" for key in ray))  # fmt: skip
    generate = [key for key in _changed(config.generate) if key != "enabled"]
    if command == "pipeline" and not config.generate.enabled and generate:
        log.warning("%s: not used with generate.enabled=false (the pipeline reads data.input)",
                    ", ".join(f"generate.{key}" for key in generate))  # fmt: skip


class _Terminated(BaseException):
    """SIGTERM outside a fit: ends the command as Ctrl-C does (a BaseException, so no ``except Exception`` keeps it)."""


def _on_sigterm(signum, frame) -> None:  # noqa: ARG001 - the signal module's signature
    if signal.getsignal(signal.SIGTERM) is not _on_sigterm:  # called by a handler set over it: Lightning's, which
        return  # stops a fit at the end of its batch (recsys_alibi.training.fit says so)
    raise _Terminated


@contextlib.contextmanager
def _sigterm_ends_the_command() -> Iterator[None]:
    """SIGTERM raises :class:`_Terminated` in the block (it ended the process without a word: exit 143, no line);
    a SIGTERM the process ignores stays ignored."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _user_errors() -> tuple[type[BaseException], ...]:
    from recsys_alibi.config import ConfigError
    from recsys_alibi.data.ingest import DataError
    from recsys_alibi.tracking import ModelUriError

    return (ConfigError, DataError, ModelUriError, OutputPathError, GivenPathError, FileNotFoundError, ValueError)


def _one_line(err: BaseException) -> str:
    if isinstance(err, OSError) and err.filename is not None:  # its path as given, never a temporary beside it
        return describe_error_path(err)
    from recsys_alibi.data.errors import first_line

    return first_line(err)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the process exit code (0 ok, 2 user error, 1 failure).

    Every command: a user error (bad config, input, model URI or output path; a permission or
    read-only error on a path) is one ``error: ...`` line and code 2, and the output folders the
    run would have created are removed again when empty; a full disk is one line and
    code 1 (:func:`pipelines.outputs.describe_os_error`). ``pipeline`` is a scheduled job: 0 when the
    new model was promoted or the champion kept, 2 on a user error, 1 on any other failure (logged
    with its traceback) instead of raising. Ctrl-C and SIGTERM, at any step, are one line and codes 130 / 143
    (in training, :func:`recsys_alibi.training.fit.fit_ranker` says so with the checkpoint to resume from).
    """
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named against the subcommand's --help, as its other usage errors are
        parser.command_parsers[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    configure_logging()
    forget_new_folders()
    try:
        with _sigterm_ends_the_command():
            return _run(args)
    except (KeyboardInterrupt, _Terminated) as stop:  # anywhere: imports, prepare, evaluate, score, ...
        remove_new_empty_folders()
        name, code = ("SIGTERM", EXIT_SIGTERM) if isinstance(stop, _Terminated) else ("Ctrl-C (SIGINT)", EXIT_SIGINT)
        print(f"error: {args.command} stopped by {name} before it finished", file=sys.stderr)
        return code


def _run(args: argparse.Namespace) -> int:
    """:func:`main` after parsing: load the config, run the command, turn errors into one line and a code."""
    from recsys_alibi.config import load_config  # here, not at import: Ctrl-C while pydantic loads is one line too

    try:
        _check_given_paths(args)
        _check_model_uri_form(getattr(args, "model_uri", None))
        config = load_config(args.config, args.overrides, _flag_values(args))  # says which setting replaced which
        _check_tracking_names(config, args)
        _say_unused(config, args)
        summary = COMMANDS[args.command](config, args)
    except _user_errors() as err:
        remove_new_empty_folders()  # a refused run leaves no empty output folder behind
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as err:  # noqa: BLE001 - a path problem is one line; a pipeline reports any failure by its code
        found = as_os_error(err)
        described = None if found is None else describe_os_error(found, getattr(args, "output", None))
        if described is None:
            return _failure(args.command, err)
        code, line = described
        if code == EXIT_USER_ERROR:
            remove_new_empty_folders()
        if code == EXIT_FAILURE and args.command == "pipeline":
            log.error("pipeline failed: %s", line)
            line = f"pipeline failed: {line}"
        print(f"error: {line}", file=sys.stderr)
        return code
    if summary and _rank() == 0:  # training, score and export processes other than rank 0 have nothing to say
        print(summary)
    return 0


def _rank() -> int:
    """This process's global rank under a launcher (torchrun, srun), 0 alone."""
    from recsys_alibi.training.launch import launch_rank

    return launch_rank()


def _failure(command: str, err: BaseException) -> int:
    """Any other error: its traceback (``pipeline``: through its log), then one ``error: COMMAND failed: ...``
    line that a scheduler's log scraper finds, and code 1 (a process of a distributed run that died left the
    others a gloo traceback and no such line)."""
    if command == "pipeline":
        log.exception("pipeline failed")
    else:
        traceback.print_exception(err, file=sys.stderr)
    line = _one_line(err).encode("utf-8", "replace").decode("utf-8")  # a library's message may hold stray bytes
    print(f"error: {command} failed: {type(err).__name__}: {line}", file=sys.stderr)
    return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
