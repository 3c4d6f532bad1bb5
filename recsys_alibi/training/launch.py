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
