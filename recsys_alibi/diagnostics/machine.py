"""The machine a measurement ran on, for the record: times differ between CPUs (docs/benchmarks.md)."""

from __future__ import annotations

import os
import platform
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # native bfloat16 arithmetic (train.precision: auto picks bf16-mixed)


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name and its bfloat16 flags, e.g. ``"AMD EPYC (avx512_bf16)"``.

    Args:
        cpuinfo: the kernel's CPU description (Linux); elsewhere the platform's processor string is used.

    Returns:
        ``"<model name>"`` or ``"<model name> (<flags>)"`` with the flags of :data:`BF16_FLAGS` the CPU has,
        ``"... (AVX2 only)"`` for an AVX2 CPU without them.

    Example:
        >>> import tempfile, os
        >>> f = tempfile.NamedTemporaryFile("w", suffix="cpuinfo", delete=False)
        >>> _ = f.write("model name\\t: AMD EPYC\\nflags\\t\\t: fpu avx2 avx512_bf16\\n"); f.close()
        >>> cpu_name(Path(f.name)); os.unlink(f.name)
        'AMD EPYC (avx512_bf16)'
    """
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown CPU")
    flags = set(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))
    native = [f for f in BF16_FLAGS if f in flags]
    return f"{name} ({', '.join(native)})" if native else f"{name} (AVX2 only)" if "avx2" in flags else name


def machine_line(threads: int | None = None) -> str:
    """The machine a benchmark ran on, for its JSON: ``"<cpu_name()>, N cores, Python X.Y.Z"``, with
    ``", T torch threads"`` when ``threads`` is given.

    Example:
        >>> machine_line(1).endswith(", 1 torch thread") and machine_line(2).endswith(", 2 torch threads")
        True
    """
    line = f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    return line + ("" if threads is None else f", {threads} torch thread" + ("s" if threads != 1 else ""))


def command_line(script: str, argv: Sequence[str] | None = None) -> str:
    """The command a benchmark was run with, for its JSON: ``python SCRIPT ARGS`` with the arguments as given
    (``argv``, or ``sys.argv[1:]`` when None: an empty list is no arguments), shell-quoted.

    Example:
        >>> command_line("benchmarks/x.py", ["--output", "runs/a b.json"])
        "python benchmarks/x.py --output 'runs/a b.json'"
    """
    return shlex.join(["python", script, *(sys.argv[1:] if argv is None else argv)])
