"""Which training process this is before Lightning starts, and where a killed run resumes.

The training job must know its global rank *before* ``trainer.fit`` (only rank 0 opens an
MLflow run), when no process group exists yet. The launchers say it in the environment:

- torchrun (and Lightning under it): ``RANK``;
- Lightning's own launcher (``train.devices > 1``): the first process runs the command, the
  others are started by Lightning with ``LOCAL_RANK`` (and ``NODE_RANK`` on several nodes);
- SLURM (``srun``): ``SLURM_PROCID``;
- none of them: a single process, rank 0 (or ``NODE_RANK * devices`` on a multi-node launch).

Resuming: a run writes ``<output>/checkpoints/<run_id>/last.ckpt`` at the end of every epoch and
a ``COMPLETE`` marker beside it when training finished; ``resumable_checkpoint`` finds the newest
checkpoint without the marker.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from recsys_alibi.atomic import atomic_path
from recsys_alibi.config import ConfigError, TrainConfig

COMPLETE_MARKER = "COMPLETE"
LAST_CHECKPOINT = "last.ckpt"


def launch_rank(devices_per_node: int | str = 1, env: dict[str, str] | None = None) -> int:
    """The global rank of this process from the launcher's environment (0 when launched alone).

    Args:
        devices_per_node: ``train.devices`` (an int; anything else counts as 1).
        env: the environment (default ``os.environ``).
    """
    env = os.environ if env is None else env
    if "RANK" in env:
        return int(env["RANK"])
    per_node = devices_per_node if isinstance(devices_per_node, int) and devices_per_node > 0 else 1
    node = int(env.get("NODE_RANK", env.get("GROUP_RANK", 0)))
    if "LOCAL_RANK" in env:
        return node * per_node + int(env["LOCAL_RANK"])
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        return int(env["SLURM_PROCID"])
    return node * per_node


def check_accelerator(train: TrainConfig) -> None:
    """Refuse ``train.accelerator`` / ``train.devices`` that this machine cannot run, before training starts.

    The config already holds only values Lightning accepts; this checks the hardware:
    ``gpu``/``cuda`` need CUDA devices (at least ``train.devices`` of them), ``mps`` Apple's
    Metal backend.

    Raises:
        ConfigError: naming the setting and the fix (``train.accelerator=auto`` or ``cpu``).
    """
    import torch

    if train.accelerator in ("gpu", "cuda"):
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        wanted = train.devices if isinstance(train.devices, int) else 1
        if visible < wanted:
            raise ConfigError(
                f"train.accelerator={train.accelerator} with train.devices={train.devices} needs {wanted} CUDA "
                f"device(s), this machine has {visible}; use train.accelerator=auto or cpu"
            )
    if train.accelerator == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("train.accelerator=mps needs Apple's Metal backend, not available here; use auto or cpu")


BF16_NAMES = ("bf16-mixed", "bf16")
# Lightning's older names of its precisions: handed over under the new names, or Lightning warns about each
PRECISION_ALIASES: dict[str | int, str] = {"16": "16-mixed", 16: "16-mixed", "bf16": "bf16-mixed", "32": "32-true",
                                           32: "32-true"}  # fmt: skip


def on_cpu(accelerator: str) -> bool:
    """Whether training runs on the CPU: ``train.accelerator=cpu``, or ``auto`` with neither CUDA nor MPS."""
    import torch

    if accelerator == "cpu":
        return True
    return accelerator == "auto" and not torch.cuda.is_available() and not torch.backends.mps.is_available()


def native_bf16(accelerator: str) -> bool:
    """Whether the device training runs on multiplies bfloat16 natively.

    CUDA: ``torch.cuda.is_bf16_supported()`` (Ampere and later). CPU: AVX512-BF16 or AMX tiles;
    on AVX2-only CPUs oneDNN emulates bfloat16 products: a (4096, 64) x (64, 3417) product took
    1,065 ms in bfloat16 against 127 ms in float32 on one AVX2 core (docs/benchmarks.md).
    """
    import torch

    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if accelerator in ("cpu", "auto"):
        from recsys_alibi.diagnostics.paths import native_cpu_bf16

        return native_cpu_bf16()
    return False


def resolve_precision(train: TrainConfig) -> str:
    """``train.precision`` as handed to Lightning: ``auto`` is ``bf16-mixed`` where
    :func:`native_bf16`, else ``32-true``; Lightning's older names (``16``, ``bf16``, ``32``) under
    their new ones; any other value as given.

    A bfloat16 precision asked for explicitly on a device without native bfloat16 is kept, with
    one warning line (its products are emulated, several times slower than float32).
    ``16-mixed`` on a CPU run (float16 autocast needs a GPU) is ``bf16-mixed``, said in one warning
    line (instead of Lightning's).
    """
    import logging

    native = native_bf16(train.accelerator)
    log = logging.getLogger(__name__)
    precision = PRECISION_ALIASES.get(train.precision, train.precision)
    emulated = "several times slower than float32; train.precision=auto picks 32-true here"
    if precision == "auto":
        chosen = "bf16-mixed" if native else "32-true"
        log.info("train.precision=auto: %s (%s bfloat16 on this device)", chosen, "native" if native else "no native")
        return chosen
    if precision == "16-mixed" and on_cpu(train.accelerator):
        log.warning(
            "train.precision=%s: float16 mixed precision needs a GPU; this CPU run uses bf16-mixed%s", train.precision,
            "" if native else f" (emulated on this CPU: {emulated})",
        )  # fmt: skip
        return "bf16-mixed"
    if train.precision in BF16_NAMES and not native:
        log.warning(
            "train.precision=%s on a device without native bfloat16 (a CPU without AVX512-BF16 or AMX, or a GPU "
            "before Ampere): its matrix products are emulated, %s", train.precision, emulated,
        )  # fmt: skip
    return precision


def resumable_checkpoint(checkpoints_root: str | Path, keep: Callable[[Path], bool] | None = None) -> Path | None:
    """The newest ``<root>/<run_id>/last.ckpt`` whose directory has no ``COMPLETE`` marker, or None.

    ``keep`` (optional): only checkpoints for which it returns True are candidates. Every rank
    gets the same answer from the same (shared) filesystem.
    """
    root = Path(checkpoints_root)
    if not root.is_dir():
        return None
    found = [
        p for p in root.glob(f"*/{LAST_CHECKPOINT}")
        if not (p.parent / COMPLETE_MARKER).exists() and (keep is None or keep(p))
    ]  # fmt: skip
    return max(found, key=lambda p: (p.stat().st_mtime_ns, str(p))) if found else None


def mark_complete(checkpoint_dir: str | Path) -> None:
    """Write the ``COMPLETE`` marker: this run's checkpoints are not to be resumed."""
    path = Path(checkpoint_dir)
    path.mkdir(parents=True, exist_ok=True)
    with atomic_path(path / COMPLETE_MARKER) as tmp:  # never replaces a non-file there (OutputKindError)
        tmp.write_text("training finished\n")
