"""Issue 41, defect 17: every command documented in README.md and docs/*.md runs from a fresh clone.

Each command found there (fenced shell blocks, and inline code spans that start like a command) is
checked without running it: no path that exists on one machine only (a wrapper in ``/work/notes``,
``/work/shared``, ``<checkout>``); a ``recsys-alibi`` command parses with the real parser, flags
included; a ``benchmarks/`` script or module and a ``configs/`` file exist, and every ``--flag`` given to
a script is one it defines; a ``make`` target is in the Makefile. Data beside the checkout
(``../shared/data/...``) is the documented place of the public data sets, not part of the clone.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
START = re.compile(
    r"^(?:[A-Z_]+=\S+\s+)*(?:srun\s+|torchrun\s+)?(?:\.venv/bin/python|python3?(?:\.11)?|\.venv/bin/recsys-alibi|recsys-alibi"
    r"|make|bash|\.ci/run)\b"
)
MACHINE_ONLY = ("/work/", "/notes/", "<checkout>")


def documented_commands() -> list[tuple[str, str]]:
    """``(where, command)`` for every command in the docs (continued lines joined)."""
    found = []
    for doc in DOCS:
        lines, in_block, lang = doc.read_text().splitlines(), False, ""
        pending = ""
        for n, line in enumerate(lines, 1):
            if line.startswith("```"):
                in_block, lang = not in_block, line[3:].strip()
                continue
            where = f"{doc.relative_to(REPO)}:{n}"
            if in_block and lang in ("", "bash", "sh", "shell"):
                text = pending + line.strip()
                if text.endswith("\\"):
                    pending = text[:-1] + " "
                    continue
                pending = ""
                if START.match(text):
                    found.append((where, text))
            elif not in_block:
                found += [(where, span.strip()) for span in re.findall(r"`([^`]+)`", line)
                          if START.match(span.strip()) and " " in span.strip()]  # fmt: skip
    return found


def _words(command: str) -> list[str]:
    """The command's words, without a trailing comment, environment assignments and launchers."""
    words = shlex.split(command.split(" #")[0].replace("$", "DOLLAR_"), posix=True)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words = words[1:]
    while words and words[0] in ("srun", "torchrun"):
        words = words[1:]
        while words and words[0].startswith("--"):  # torchrun's own flags, each with its value
            words = words[2:] if "=" not in words[0] else words[1:]
    return words


def _script_flags(script: Path) -> set[str]:
    return set(re.findall(r"""["'](--[a-z][a-z0-9-]*)["']""", script.read_text()))


def _check(command: str) -> str | None:
    """None when the command can run from a fresh clone, else why not."""
    if any(marker in command for marker in MACHINE_ONLY):
        return "names a path of one machine only"
    words = _words(command)
    if not words or "..." in command or "[" in command.split(" #")[0]:
        return None  # a placeholder synopsis (``[--packed-cap 200]``, ``...``): read, not run as it is
    head, rest = words[0], words[1:]
    for word in words:
        if word.startswith("configs/") and not (REPO / word).is_file():
            return f"{word} is not in the repository"
    if head.endswith("recsys-alibi"):
        return _check_cli(rest)
    if head == "make":
        targets = re.findall(r"^([a-z][a-z-]*):", (REPO / "Makefile").read_text(), re.M)
        unknown = [w for w in rest if "=" not in w and not w.startswith("-") and w not in targets]
        return f"no make target {unknown}" if unknown else None
    if head in ("bash",) or head.startswith((".venv/bin/python", "python")):
        if head == "bash" or rest[:1] != ["-m"]:
            script = REPO / (rest[0] if rest else "")
            args = rest[1:]
        else:
            module = rest[1]
            if module.split(".")[0] not in ("benchmarks", "pipelines", "serving", "recsys_alibi"):
                return None  # the standard library's or a tool's (venv, pytest)
            script = REPO / (module.replace(".", "/") + ".py")
            args = rest[2:]
        if not script.is_file():
            return f"{script.relative_to(REPO)} is not in the repository"
        flags = _script_flags(script)
        unknown = [w.split("=")[0] for w in args if w.startswith("--") and w.split("=")[0] not in flags]
        return f"{script.name} defines no {unknown}" if unknown else None
    return None


def _check_cli(words: list[str]) -> str | None:
    """A ``recsys-alibi`` command: the subcommand and each flag exist; a whole command (with its
    required flags) parses. A prose mention (``recsys-alibi score --engine ray``) is not whole."""
    from pipelines.cli import build_parser

    subcommands = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse keeps them there
    if not words or words[0] not in subcommands:
        return f"no subcommand {words[:1]}"
    if len(words) == 1:  # a subcommand named in prose: `recsys-alibi evaluate`
        return None
    options = {flag for action in subcommands[words[0]]._actions for flag in action.option_strings}  # noqa: SLF001
    unknown = [w for w in words if w.startswith("--") and w.split("=")[0] not in options]
    if unknown:
        return f"recsys-alibi {words[0]} has no {unknown}"
    required = [a for a in subcommands[words[0]]._actions if a.required and not set(a.option_strings) & set(words)]  # noqa: SLF001
    if required:
        return None
    try:
        build_parser().parse_args([w.replace("DOLLAR_DAILY", "--quiet") for w in words])
    except SystemExit:
        return "does not parse"
    return None


def code_texts() -> list[tuple[str, str]]:
    """``(where, text)`` of every code span and code-block line of the docs."""
    found = []
    for doc in DOCS:
        in_block = False
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if line.startswith("```"):
                in_block = not in_block
                continue
            where = f"{doc.relative_to(REPO)}:{n}"
            found += [(where, line)] if in_block else [(where, span) for span in re.findall(r"`([^`]+)`", line)]
    return found


COMMANDS = documented_commands()


def test_no_documented_code_names_a_path_of_one_machine():
    """A wrapper such as /work/notes/heavy, or the data folder by its absolute path on one machine."""
    found = [f"{where}: {text}" for where, text in code_texts() if any(marker in text for marker in MACHINE_ONLY)]
    assert found == []


def test_the_docs_hold_the_commands_this_test_reads():
    assert len(COMMANDS) > 80
    assert any("benchmarks/serving_outputs.py" in command for _, command in COMMANDS)


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_every_documented_command_runs_from_a_fresh_clone(where, command):
    assert _check(command) is None, f"{where}: `{command}`: {_check(command)}"
