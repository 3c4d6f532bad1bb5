"""Attention backends: time and peak memory per sequence length at a fixed token budget.

Every case (backend, mode, L) runs in its own subprocess so that peak memory is that case's
alone. Batch size is ``budget // L`` (same tokens per batch at every L), causal ALiBi, no
padding, H heads of width D.

Peak memory:
- CPU: the subprocess sets ``MALLOC_MMAP_THRESHOLD_=65536`` so that every large buffer is an
  mmap returned to the OS on free, runs the case once to warm up (flex compiles here), resets
  the kernel's high-water mark (``echo 5 > /proc/self/clear_refs``), runs the case once more,
  and reports ``VmHWM - VmRSS`` (before that run) from ``/proc/self/status``: the resident
  memory the case added at its peak, inputs excluded, outputs and gradients included.
- CUDA: ``torch.cuda.max_memory_allocated()`` over the measured run minus memory in use before.

Time: the fastest of ``--repeats`` runs after the warm-up (``torch.cuda.synchronize`` on GPU);
the minimum is the figure least disturbed by other work on a shared machine. The median is
kept in the JSON output.

Modes: ``fwd`` (no autograd) and ``fwd+bwd`` (inputs require grad; ``out.backward(g)``).
Backends: ``eager``, ``sdpa`` (one materialised (1, H, L, L) mask), ``sdpa-chunked`` (forward,
query chunks, never a full mask), ``flex`` (forward only on CPU), ``flex-nobias`` (flex without
the ALiBi score_mod: the cost of the bias itself).

Usage:
    python benchmarks/attention.py                                  # CPU table, fp32
    python benchmarks/attention.py --device cuda --dtype bfloat16   # GPU
    python benchmarks/attention.py --waste /path/to/ml-1m.txt.gz    # padding waste figure
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

BACKENDS = ("eager", "sdpa", "sdpa-chunked", "flex", "flex-nobias")
FORWARD_ONLY_ON_CPU = ("sdpa-chunked", "flex", "flex-nobias")


@dataclass(frozen=True)
class Case:
    backend: str
    mode: str  # "fwd" | "fwd+bwd"
    length: int
    batch: int
    heads: int
    dim: int
    dtype: str
    device: str
    repeats: int


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def run_case(case: Case) -> dict:
    """Time and peak memory of one case, in this process (called in a fresh subprocess)."""
    import torch

    from recsys_alibi.model.alibi import alibi_slopes
    from recsys_alibi.model.attention import eager_attention, sdpa_attention
    from recsys_alibi.model.flex import flex_alibi_attention

    torch.manual_seed(0)
    dev = torch.device(case.device)
    dtype = getattr(torch, case.dtype)
    shape = (case.batch, case.heads, case.length, case.dim)  # (B, H, L, D)
    grad = case.mode == "fwd+bwd"
    q, k, v = (torch.randn(shape, device=dev, dtype=dtype, requires_grad=grad) for _ in range(3))
    g = torch.randn(shape, device=dev, dtype=dtype)
    slopes = alibi_slopes(case.heads).to(dev)
    fn = {
        "eager": eager_attention,
        "sdpa": lambda *a: sdpa_attention(*a, query_chunk=0),
        "sdpa-chunked": sdpa_attention,
        "flex": flex_alibi_attention,
        "flex-nobias": lambda *a: flex_alibi_attention(*a, with_bias=False),
    }[case.backend]

    def once() -> None:
        if grad:
            fn(q, k, v, slopes).backward(g)
            q.grad = k.grad = v.grad = None
        else:
            with torch.no_grad():
                fn(q, k, v, slopes)
        if dev.type == "cuda":
            torch.cuda.synchronize()

    once()  # warm-up: compiles flex, builds and caches block masks
    if dev.type == "cuda":
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        once()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        import gc

        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        base = _status_kib("VmRSS")
        once()
        peak = (_status_kib("VmHWM") - base) * 1024
    times = []
    for _ in range(case.repeats):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    return {**asdict(case), "seconds": min(times), "median_seconds": statistics.median(times), "peak_bytes": peak}


def _subprocess(case: Case, timeout: float) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [sys.executable, os.path.abspath(__file__), "--case", json.dumps(asdict(case))]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {**asdict(case), "error": f"timeout {timeout:.0f}s"}
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        tail = (res.stderr.strip().splitlines() or ["?"])[-1]
        return {**asdict(case), "error": f"rc={res.returncode}: {tail[:120]}"}
    return json.loads(lines[-1])


def cases(args: argparse.Namespace) -> list[Case]:
    out = []
    for length in args.lengths:
        batch = max(1, args.budget // length)
        for backend in args.backends:
            for mode in ("fwd", "fwd+bwd"):
                if mode == "fwd+bwd" and (backend in FORWARD_ONLY_ON_CPU and args.device == "cpu"):
                    continue
                if mode == "fwd+bwd" and backend == "sdpa-chunked":
                    continue
                if backend == "eager" and length > args.eager_max_len:
                    continue
                out.append(Case(backend, mode, length, batch, args.heads, args.dim, args.dtype, args.device, args.repeats))
    return out


def markdown(results: Sequence[dict]) -> str:
    """One row per (L, B, mode), one column pair (time, peak) per backend."""
    backends = [b for b in BACKENDS if any(r["backend"] == b for r in results)]
    head = "| L | B | mode | " + " | ".join(f"{b} s | {b} MiB" for b in backends) + " |"
    rule = "|---|---|---|" + "---:|---:|" * len(backends)
    rows = [head, rule]
    keys = sorted({(r["length"], r["batch"], r["mode"]) for r in results}, key=lambda t: (t[0], t[2]))
    for length, batch, mode in keys:
        cells = []
        for b in backends:
            r = next((r for r in results if (r["length"], r["mode"], r["backend"]) == (length, mode, b)), None)
            if r is None:
                cells += ["-", "-"]
            elif "error" in r:
                cells += ["err", "err"]
            else:
                cells += [f"{r['seconds']:.3f}", f"{r['peak_bytes'] / 2**20:.0f}"]
        rows.append(f"| {length} | {batch} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def waste_figure(path: str, max_len: int = 200, batch_size: int = 128) -> str:
    """Padding waste on a SASRec-format file (``user item`` per line), histories cut to max_len."""
    from recsys_alibi.model.packing import batch_padding_waste, pack_sequences, padding_waste

    counts: dict[str, int] = {}
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        for line in f:
            user = line.split(maxsplit=1)[0]
            counts[user] = counts.get(user, 0) + 1
    lengths = [min(n, max_len) for n in counts.values()]  # users in file order
    tokens = sum(lengths)
    rows = [
        "| layout | rows x width | padding waste |",
        "|---|---|---:|",
        f"| padded, one user per row of {max_len} | {len(lengths)} x {max_len} | {padding_waste(lengths, max_len):.1%} |",
        f"| padded to each batch's longest ({batch_size} users per batch, file order) | - "
        f"| {batch_padding_waste(lengths, batch_size):.1%} |",
    ]
    for budget in (max_len, 1024, 4096):
        plan = pack_sequences(lengths, budget)
        rows.append(f"| packed, first-fit decreasing, rows of {budget} | {plan.n_rows} x {budget} | {plan.padding_waste:.1%} |")
    per_batch = [pack_sequences(lengths[i : i + batch_size], max_len) for i in range(0, len(lengths), batch_size)]
    cells = sum(p.n_rows * max_len for p in per_batch)
    rows.append(
        f"| packed per batch of {batch_size} users, rows of {max_len} | {sum(p.n_rows for p in per_batch)} x {max_len} "
        f"| {1 - tokens / cells:.1%} |"
    )
    summary = f"{len(lengths)} users, {tokens} events after the cap of {max_len}, mean {tokens / len(lengths):.1f} per user"
    return summary + "\n\n" + "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--budget", type=int, default=16384, help="tokens per batch; B = budget // L")
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=64, help="head width D")
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--eager-max-len", type=int, default=4096, help="skip eager above this L (B*H*L*L scores)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per case")
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--waste", metavar="PATH", help="print the padding-waste figure for this SASRec file and exit")
    p.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case, print JSON
    args = p.parse_args(argv)
    if args.case:
        import torch

        torch.set_num_threads(int(os.environ.get("BENCH_THREADS", torch.get_num_threads())))
        print(json.dumps(run_case(Case(**json.loads(args.case)))))
        return 0
    if args.waste:
        print(waste_figure(args.waste))
        return 0
    results = []
    for case in cases(args):
        r = _subprocess(case, args.timeout)
        results.append(r)
        msg = r.get("error") or f"{r['seconds']:.3f} s, {r['peak_bytes'] / 2**20:.0f} MiB"
        print(f"{case.backend:>13} {case.mode:>7} L={case.length:<5} B={case.batch:<3} {msg}", file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
