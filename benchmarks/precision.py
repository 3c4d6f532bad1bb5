"""bfloat16 vs float32 matrix products on this machine: what ``train.precision=auto`` decides from.

Run (one heavy job at a time): ``.venv/bin/python benchmarks/precision.py [--threads 1]``

Times the product that dominates full-softmax training, (T, D) x (D, N + 1) with T = 4,096
positions, D = 64 and N + 1 = 3,417 items (ML-1M), in float32 and in bfloat16, and prints
milliseconds and GFLOP/s (2 T D N floating-point operations per product) with the CPU's
capability (``torch.backends.cpu.get_cpu_capability()``) and what
:func:`recsys_alibi.training.launch.resolve_precision` picks for ``auto``.
"""

from __future__ import annotations

import argparse
import time


def gemm_seconds(dtype, rows: int = 4096, width: int = 64, items: int = 3417, repeats: int = 5) -> float:
    """Mean seconds of one (rows, width) x (width, items) product in ``dtype`` (after one warm-up)."""
    import torch

    a = torch.randn(rows, width).to(dtype)
    b = torch.randn(items, width).to(dtype)
    a @ b.T
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b.T
    return (time.perf_counter() - start) / repeats


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import torch

    from recsys_alibi.config import load_config
    from recsys_alibi.training.launch import resolve_precision

    torch.set_num_threads(args.threads)
    flops = 2 * 4096 * 64 * 3417
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, {args.threads} thread(s)")
    for dtype in (torch.float32, torch.bfloat16):
        seconds = gemm_seconds(dtype)
        print(f"{str(dtype):>15}: {seconds * 1000:8.1f} ms  {flops / seconds / 1e9:6.1f} GFLOP/s")
    train = load_config(None, ["train.accelerator=cpu", "train.precision=auto"]).train
    print(f"train.precision=auto -> {resolve_precision(train)}")


if __name__ == "__main__":
    main()
