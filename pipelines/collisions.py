"""Outputs that would replace, mix with or be read back as an input or another output: refused first.

Every command names its outputs (:class:`Output`: the directory or file it writes, and what kind
of output it is) and its inputs (events, a prepared directory, rule files, a previous scoring
output, a model given as a local path) before any work, and :func:`check_apart` refuses, with one
line (:class:`~pipelines.outputs.OutputPathError`, exit code 2):

* an output that **is** an input, or a directory output that **holds** one of them at a name it
  writes (``export --output PREPARED`` would replace the prepared ``items.parquet`` with item
  vectors);
* an output **inside** an input folder (or a glob's folder): its files would be read back as
  input by the next run (a rule folder, an events folder, a previous scoring output);
* an output directory that already holds **another kind of output** (a prepared directory, a
  scoring output, an export, an evaluation report: :data:`MARKERS`): the two sets of files would
  mix and each one's readers would fail on the other's (``export --output RANKINGS``);
* two outputs of one command that are the same path or one inside the other.

Paths are compared after resolving symbolic links.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

from pipelines.outputs import OutputPathError
from recsys_alibi.data.formats import is_glob

EXPORT_FILES = ("items.parquet", "users.parquet", "items.faiss", "export.json")  # serving.export (held equal by a test)
REPORT_FILES = ("report.json", "report.md", "context_length.png", "history_length.png")  # evaluation.report (same)
MARKERS = {"prepared": "manifest.json", "rankings": "_manifest.json", "export": "export.json", "report": "report.json"}
"""The file each kind of output directory is recognised by (the one its writer writes last)."""
KIND_NAMES = {"prepared": "a prepared directory", "rankings": "a scoring output", "export": "an export",
              "report": "an evaluation report"}  # fmt: skip


@dataclass(frozen=True)
class Output:
    """One path a command writes.

    Attributes:
        flag: the flag or config key that named it (for the message).
        path: the directory (or, for ``kind="file"``, the file) written.
        kind: ``prepared``, ``rankings``, ``export``, ``report`` (directories with the files of
            that kind), ``folder`` (a directory of its own files: checkpoints, daily files),
            ``pipeline`` (the pipeline's output folder, which holds one folder of each) or ``file``.
    """

    flag: str
    path: Path
    kind: str


def owned(kind: str, target: Path | None = None) -> tuple[str, ...]:
    """The names (glob patterns) a directory output of ``kind`` at ``target`` writes or replaces inside it while
    its input may still be read. For a prepared directory, the files ``prepare`` writes, except when ``target``
    is one already: ``prepare`` reads its whole input before it replaces a file, so re-preparing a prepared
    directory's own file works (``prepare --input PREPARED/events.parquet --output PREPARED``), while a raw
    ``DIR/events.parquet`` prepared into ``DIR`` would be replaced by the cleaned events and lost."""
    if kind == "prepared":
        from recsys_alibi.data.prepared import OUTPUTS
        from recsys_alibi.data.schema import MANIFEST_FILE

        return () if target is not None and held_kind(target) == "prepared" else (*OUTPUTS, MANIFEST_FILE)
    if kind == "rankings":
        from serving.manifest import FINGERPRINTS_DIR, SKIPPED_DIR, STAGED_INPUT

        return ("part-*.parquet", "_manifest*.json", SKIPPED_DIR, FINGERPRINTS_DIR, STAGED_INPUT)
    return {"export": EXPORT_FILES, "report": REPORT_FILES}.get(kind, ("*",))


def held_kind(directory: Path) -> str | None:
    """The kind of output ``directory`` holds (by :data:`MARKERS`), or None."""
    return next((kind for kind, marker in MARKERS.items() if (directory / marker).is_file()), None)


READ_BY_NAME = ("manifest.json", "sequences.parquet", "MLmodel")
"""A folder input holding one of these (a prepared directory, an MLflow model) is read by its file
names, not as a whole: a folder inside it is never read back, so an output may go there."""


def _input_paths(given: str | Path) -> tuple[Path, bool]:
    """``(path, read_whole)`` of an input: a glob's folder before its first wildcard (read whole; a glob only when
    nothing has that exact name: :func:`recsys_alibi.data.formats.is_glob`),
    a directory (read whole unless :data:`READ_BY_NAME`), or a file."""
    text = str(given)
    if is_glob(text):  # a path that exists is taken literally, whatever its characters (as the readers take it)
        parts = Path(text).parts
        first = next(i for i, part in enumerate(parts) if any(ch in part for ch in "*?["))
        return (Path(*parts[:first]) if first else Path(".")).resolve(), True
    path = Path(text).resolve()
    return path, path.is_dir() and not any((path / name).is_file() for name in READ_BY_NAME)


def _inside(path: Path, folder: Path) -> bool:
    return folder in path.parents


def local_model_path(model_uri: str | None) -> str | None:
    """The local path a model URI names (``file:///...`` or a plain path that exists), else None
    (``runs:/``, ``models:/`` and other schemes)."""
    if not model_uri:
        return None
    path = model_uri.removeprefix("file://")
    if path == model_uri and re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", model_uri):
        return None
    return path if Path(path).exists() else None


def check_apart(outputs: list[Output], inputs: dict[str, str | Path | None]) -> None:
    """Refuse outputs that collide with an input, with another output, or with another kind of output.

    Args:
        outputs: what the command writes.
        inputs: flag or config key -> path, directory or glob the command reads (None: not given).

    Raises:
        OutputPathError: the first collision (module docstring), naming both paths and the fix.
    """
    given = {flag: _input_paths(path) for flag, path in inputs.items() if path is not None and str(path) != ""}
    for out in outputs:
        target = out.path.resolve()
        for flag, (source, whole) in given.items():
            what = f"{out.flag} {out.path} "
            if target == source and not whole:
                raise OutputPathError(f"{what}is the input {flag} {inputs[flag]}: writing it would replace what is read; "
                                      f"choose another {out.flag}")  # fmt: skip
            if whole and (target == source or _inside(target, source)):
                raise OutputPathError(f"{what}is inside the input {flag} {inputs[flag]}: its files would be read back as "
                                      f"input by the next run; write it outside that folder")  # fmt: skip
            if out.kind != "file" and _inside(source, target):
                name = source.relative_to(target).parts[0]
                if any(fnmatch.fnmatch(name, pattern) for pattern in owned(out.kind, target)):
                    raise OutputPathError(f"{what}holds the input {flag} {inputs[flag]} at {name}, which it writes; "
                                          f"choose another {out.flag}")  # fmt: skip
        _check_kind(out, target)
        if out.kind == "export":
            _check_foreign_vectors(out, target)
    for i, a in enumerate(outputs):
        for b in outputs[i + 1 :]:
            pa, pb = a.path.resolve(), b.path.resolve()
            if pa == pb or _inside(pa, pb) or _inside(pb, pa):
                raise OutputPathError(f"{a.flag} {a.path} and {b.flag} {b.path} overlap; give them separate paths")


def _check_kind(out: Output, target: Path) -> None:
    """Refuse writing ``out`` into a directory that holds another kind of output (a file: its folder)."""
    folder = target.parent if out.kind == "file" else target
    held = held_kind(folder) if folder.is_dir() else None
    if held is not None and held != out.kind:
        where = f"is in {folder}, which" if out.kind == "file" else "already"
        raise OutputPathError(
            f"{out.flag} {out.path} {where} holds {KIND_NAMES[held]} ({MARKERS[held]}): the two would mix and "
            f"the readers of each would fail on the other's files; choose another {out.flag}"
        )


def _check_foreign_vectors(out: Output, target: Path) -> None:
    """Refuse an export into a directory whose ``items.parquet`` / ``users.parquet`` is not an export's vector file
    (columns other than the id and ``vector``: an item table, ``generate``'s or the user's): it would be replaced.
    An earlier export's files, even without their ``export.json`` (a killed export), are replaced as usual."""
    import pyarrow.parquet as pq

    for name, key in (("items.parquet", "item_id"), ("users.parquet", "user_id")):
        path = target / name
        if not path.is_file():
            continue
        try:
            columns = pq.read_schema(path).names
        except Exception:  # not Parquet at all: not an export's either
            columns = None
        if columns != [key, "vector"]:
            raise OutputPathError(f"{out.flag} {out.path} holds {name}, which is not an export's vector file "
                                  f"(columns {columns or 'unreadable'}): the export would replace it; choose another "
                                  f"{out.flag}")  # fmt: skip


def check_pipeline_paths(config) -> None:
    """The pipeline's outputs (``prepared/``, ``report/``, ``rankings/``, ``checkpoints/`` under
    ``output``, and ``events.parquet`` when it generates) apart from its inputs (``data.input``,
    ``data.items``, ``score.allow`` / ``deny`` / ``changed_since`` / ``items``, a local ``train.init_from``).

    Raises:
        OutputPathError: as :func:`check_apart`, before anything is generated, prepared or trained.
    """
    out = Path(config.output)
    _check_kind(Output("output", out, "pipeline"), out.resolve())  # its folders would mix with that output's files
    outputs = [Output("output (prepared)", out / "prepared", "prepared"), Output("output (report)", out / "report", "report"),
               Output("output (rankings)", out / "rankings", "rankings"),
               Output("output (checkpoints)", out / "checkpoints", "folder")]  # fmt: skip
    if config.generate.enabled:
        outputs.append(Output("output (events)", out / "events.parquet", "file"))
    score = config.score
    # its own earlier rankings are read while this run scores into a staging folder, replaced only at the end
    own = score.changed_since is not None and Path(score.changed_since).resolve() == (out / "rankings").resolve()
    check_apart(outputs, {"data.input": config.data.input, "data.items": config.data.items, "score.allow": score.allow,
                          "score.deny": score.deny, "score.changed_since": None if own else score.changed_since,
                          "score.items": getattr(score, "items", None),
                          "train.init_from": local_model_path(config.train.init_from)})  # fmt: skip
