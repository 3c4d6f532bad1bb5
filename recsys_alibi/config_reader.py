"""Reading config text: plain YAML under strict rules, and the one error every config problem raises.

YAML is read with a subclass of PyYAML's safe loader (tags such as ``!!python/object`` are
refused, never run); a key given twice in one mapping is an error; numbers follow YAML 1.2
(``1e-3`` is a float, ``010`` is ten). Errors are one :class:`ConfigError` line with the file
(or override), line and column. The typed sections live in :mod:`recsys_alibi.config`.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


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
