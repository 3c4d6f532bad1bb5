"""Reading config text: plain YAML under strict rules, and the one error every config problem raises.

YAML is read with a subclass of PyYAML's safe loader (tags such as ``!!python/object`` are
refused, never run); a key given twice in one mapping is an error; numbers follow YAML 1.2
(``1e-3`` is a float, ``010`` is ten). Errors are one :class:`ConfigError` line with the file
(or override), line and column. A config file is read by :func:`read_config_file`, a ``--set`` by
:func:`parse_override`; :class:`OverrideGivers` says when a later setting replaces an earlier one. The
typed sections live in :mod:`recsys_alibi.config`.
"""

from __future__ import annotations

import errno
import logging
import re
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key and the fix."""


class _StrictLoader(yaml.SafeLoader):
    """The safe loader, refusing a key given twice in one mapping (the safe loader keeps the last).

    Also reads ``1e-3`` as a float, as YAML 1.2 does (PyYAML's YAML 1.1 rules want ``1.0e-3`` and
    would give the string ``"1e-3"``, which the strict config then refuses), and integers as YAML
    1.2 does (``010`` is 10, not octal 8; ``1:30`` is text, not 90).

    Anchors, aliases and merge keys (``<<: *base``) are plain YAML and read as the safe loader
    reads them: a key written beside a merge overrides the merged one; only keys written twice
    in the mapping itself are refused.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # flattened by the safe loader's own construct_mapping
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (list, dict)):  # `? [a]` / `? {a: 1}`: a key YAML allows, no config key can be
                kind = "list" if isinstance(key, list) else "mapping"
                raise yaml.constructor.ConstructorError(
                    None, None, f"a mapping key must be a plain value (a name), not a {kind}", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in ("tag:yaml.org,2002:float", "tag:yaml.org,2002:int")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}  # a copy: the safe loader's own table is left as it is
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?[0-9][0-9_]*|0o[0-7_]+|0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)  # YAML 1.2 integers: 010 is ten (YAML 1.1 read it as octal 8) and 1:30 is text (1.1: 90)


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """A YAML 1.2 integer: decimal (leading zeros allowed), ``0o`` octal or ``0x`` hex; ``_`` ignored."""
    text = str(loader.construct_scalar(node)).replace("_", "")
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                    |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def _yaml_error(where: str, err: yaml.YAMLError) -> ConfigError:
    """One line: where, the line/column of the problem and what it is (no YAML traceback)."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    if "block" in problem:
        problem += " (check the indentation)"
    if "could not determine a constructor for the tag" in problem:
        problem += " (only plain YAML is read: tags that build Python objects are refused, never run)"
    return ConfigError(f"{where}: invalid YAML{at}: {problem}")


def read_yaml(text: str, where: str) -> Any:
    """Parse ``text`` as plain YAML (safe loader, duplicate keys refused).

    Raises:
        ConfigError: the text is not valid YAML (``where`` names the file or the override).
    """
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        raise _yaml_error(where, err) from None


def read_config_file(path: Path) -> dict[str, Any]:
    """The YAML mapping of a config file; a pipe (``--config <(envsubst < job.yaml)``) is read too (once).

    Raises:
        ConfigError: a directory, nothing there, unreadable, not UTF-8, not YAML or not a mapping.
    """
    try:
        path.stat()
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ConfigError(f"config {path} is a symbolic-link loop; remove the link or give another path") from None
    if path.is_dir() or not path.exists():
        raise ConfigError(f"config {path} is a directory, not a YAML file" if path.is_dir() else f"config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start}); save the config as UTF-8") from None
    except OSError as err:
        raise ConfigError(f"cannot read config {path}: {err.strerror or err}") from None
    loaded = read_yaml(text, str(path))
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a YAML mapping at the top level")
    return loaded or {}


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``"a.b=value"`` into ``("a.b", parsed value)``; the value is read as YAML.

    Raises:
        ConfigError: when there is no ``=``, the key is empty, or the value is not valid YAML.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects dotted.key=value, got '{text}'")
    return key.strip(), read_yaml(raw, f"--set {text}") if raw.strip() else None


def _leaves(value: Any, key: str = "") -> list[str]:
    """The dotted keys a value gives: a mapping's keys at any depth (none for an empty one), else ``key`` itself."""
    if isinstance(value, dict):
        return [leaf for sub, v in value.items() for leaf in _leaves(v, f"{key}.{sub}" if key else str(sub))]
    return [key] if key else []


class OverrideGivers:
    """Who gave each dotted key (the config file, a ``--set``, a flag), so that a later one that replaces it says so
    in one warning line: a ``--set`` or flag over an earlier ``--set`` of the key (also a section's mapping over
    ``--set section.key``, or the reverse), and a mapping that replaces a section as a whole, sending the keys
    the file or an earlier ``--set`` gave it back to their defaults (``{}`` or null clears it: said only for
    ``--set`` keys). A flag over the file's value is what flags are for: not said."""

    def __init__(self, tree: dict[str, Any], path: Path | None) -> None:
        self.by: dict[str, tuple[str, str]] = {leaf: ("file", str(path)) for leaf in _leaves(tree)}

    def give(self, key: str, value: Any, giver: tuple[str, str]) -> None:
        """Record that ``giver`` (``("set", TEXT)`` or ``("flag", TEXT)``) set ``key`` to ``value``; warn as above."""
        under = {leaf: by for leaf, by in self.by.items() if leaf == key or leaf.startswith(key + ".")}
        new = set(_leaves(value, key))
        for leaf in under:
            del self.by[leaf]
        self.by.update(dict.fromkeys(new, giver))
        clears = value is None or value == {}
        replaced: dict[str, list[str]] = {}
        dropped: dict[tuple[str, str], list[str]] = {}
        for leaf, by in under.items():
            if leaf in new or leaf == key:
                if by[0] == "set" and by != giver:
                    replaced.setdefault(by[1], []).append(leaf)
            elif by[0] == "set" or not clears:
                dropped.setdefault(by, []).append(leaf)
        kind, text = giver
        for old, leaves in replaced.items():
            if kind == "flag":
                log.warning("%s over --set %s: a flag wins over a --set of its key; give one of them", text, old)
            else:
                log.warning("--set %s given twice: %r replaces %r", ", ".join(leaves), text, old)
        if dropped:
            named = " and ".join(f"{', '.join(leaves)} (from {'--set ' if by[0] == 'set' else ''}{by[1]})"
                                 for by, leaves in dropped.items())  # fmt: skip
            one = sum(map(len, dropped.values())) == 1
            log.warning("--set %s gives %s as a whole: %s %s back to %s; give %s in the mapping too, or set single "
                        "keys with --set %s.KEY=VALUE", text, key, named, "goes" if one else "go",
                        "its default" if one else "their defaults", "it" if one else "them", key)  # fmt: skip
