"""Attention backends: time, TFLOP/s and peak memory per sequence length at a fixed token budget.

Dense case: B = budget // L rows of L tokens (T = B * L tokens per batch, the same at every L),
causal ALiBi, no padding, H heads of width D (``--dims``, default 64 and 128).
Packed case (``--packed``): MovieLens-1M's per-user history lengths (the SASRec-format file
``../shared/data/ml-1m/ml-1m.txt.gz`` beside the checkout, ``user item`` per line), packed first-fit decreasing
into rows of ``--packed-len`` (4,096) tokens; the batch is ``budget // packed_len`` of those
rows taken evenly spaced over the packing (a mix of long and short users), attention only
within each user (``seq_ids``). Where the file is absent: a synthetic distribution of 6,040
users, lengths ``round(exp(N(ln 96, 1.0)))`` clipped to [20, 2314] (seed 0; ML-1M's median,
spread and range), said in the output.

Modes (``--modes``):
- ``flex-alibi``: compiled FlexAttention, specialised ALiBi ``score_mod``, fixed slopes, the
  batch's BlockMask (built once, outside the timed call: its build time is ``mask_ms``);
- ``flex-alibi-learnable``: the same with slopes that require a gradient (the cost of the slope
  gradient alone);
- ``flex-nobias``: the same kernel and block mask without a ``score_mod`` (the cost of the bias);
- ``sdpa-mask``: ``scaled_dot_product_attention`` with a materialised additive ALiBi mask
  ((1, H, L, L), or (B, H, L, L) for packed rows; built inside the timed call);
- ``sdpa-nobias``: ``scaled_dot_product_attention(is_causal=True)`` without any bias (the flash
  kernel: the hardware reference; dense case only);
- ``sdpa-chunked``: forward only, query chunks, never a full mask; ``eager``: the reference;
- ``auto``: ``alibi_attention(backend="auto")`` with a per-batch mask, as the model runs it
  (``backend`` says what it picked).

FLOPs (useful work; the same count for every mode, so TFLOP/s compare like time): causal
attention forward ``2 * T * L * H * D`` (half of the ``4 * T * L * H * D`` of a full L x L
product pair), forward+backward ``3.5 * 2 * T * L * H * D`` (backward = 2.5 x forward); packed
rows ``T * L`` becomes the sum over users of ``n_s ** 2``.

Time: the fastest of ``--repeats`` calls after one warm-up (compiles flex), each ending with
``torch.cuda.synchronize()`` on GPU; the median is kept too. Peak memory:
- CUDA: ``torch.cuda.max_memory_allocated()`` over one call minus memory in use before it; all
  cases run in this process (``--isolate`` runs each in a subprocess).
- CPU: each case in a subprocess with ``MALLOC_MMAP_THRESHOLD_=65536``; after the warm-up the
  RSS high-water mark is reset (``echo 5 > /proc/self/clear_refs``) and ``VmHWM - VmRSS`` over
  one call is reported: the memory the call adds, inputs excluded.

Usage:
    python benchmarks/attention.py --device cpu                                # CPU table, fp32
    python benchmarks/attention.py --device cuda --dtype bfloat16 --budget 65536 \\
        --lengths 1024 4096 16384 --packed --json runs/gpu-attention.json
    python benchmarks/attention.py --density                 # block-mask density of packed ML-1M
    python benchmarks/attention.py --waste /path/to/ml-1m.txt.gz    # padding waste figure
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

MODES = (
    "flex-alibi", "flex-alibi-learnable", "flex-nobias", "sdpa-mask", "sdpa-nobias", "sdpa-chunked", "eager", "auto",
)  # fmt: skip
FORWARD_ONLY_ON_CPU = ("flex-alibi", "flex-alibi-learnable", "flex-nobias", "sdpa-chunked")
DENSE_ONLY = ("sdpa-nobias", "sdpa-chunked", "eager")
ML1M = str(Path(__file__).resolve().parents[2] / "shared" / "data" / "ml-1m" / "ml-1m.txt.gz")  # beside the checkout
FLOP_FORMULA = (
    "FLOPs: causal forward 2*T*L*H*D, forward+backward 3.5*2*T*L*H*D (T tokens per batch; "
    "packed rows: T*L -> sum over users of n_s^2)"
)


@dataclass(frozen=True)
class Case:
    mode: str
    passes: str  # "fwd" | "fwd+bwd"
    length: int  # L: row length
    batch: int
    heads: int
    dim: int
    dtype: str
    device: str
    repeats: int
    seq_lens: tuple[tuple[int, ...], ...] = ()  # packed: per row, the users' lengths
    kernel_options: dict = field(default_factory=dict)

    @property
    def layout(self) -> str:
        return "packed" if self.seq_lens else "dense"

    def flops(self) -> float:
        """Useful causal FLOPs of one call (see the module docstring)."""
        pairs = sum(n * n for row in self.seq_lens for n in row) if self.seq_lens else self.batch * self.length**2
        fwd = 2.0 * pairs * self.heads * self.dim
        return fwd * (3.5 if self.passes == "fwd+bwd" else 1.0)


def _status_kib(name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise KeyError(name)


def _seq_ids(case: Case, device):
    import torch

    seq = torch.zeros(case.batch, case.length, dtype=torch.int64)
    sid = 1
    for r, row in enumerate(case.seq_lens):
        c = 0
        for n in row:
            seq[r, c : c + n] = sid
            sid, c = sid + 1, c + n
    return seq.to(device)


def _attention_fn(case: Case, dev, slope_mod):
    """(fn(q, k, v) -> out, backend name, mask build ms) for the case's mode; the slopes come from
    ``slope_mod()`` on every call, as in training (learnable slopes then get their gradient)."""
    import torch
    import torch.nn.functional as F

    from recsys_alibi.model.attention import alibi_attention, batch_mask, eager_attention, sdpa_attention
    from recsys_alibi.model.flex import flex_alibi_attention
    from recsys_alibi.model.masks import MaskSpec

    seq = _seq_ids(case, dev) if case.seq_lens else None
    if case.mode == "sdpa-nobias":
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), "sdpa", None
    if case.mode in ("sdpa-mask", "sdpa-chunked", "eager"):
        kw = dict(seq_ids=seq, query_chunk=0) if case.mode == "sdpa-mask" else dict(seq_ids=seq)
        fn = eager_attention if case.mode == "eager" else sdpa_attention
        return (lambda q, k, v: fn(q, k, v, slope_mod(), **kw)), case.mode.split("-")[0], None
    spec = MaskSpec.build(case.batch, case.length, case.length, dev, causal=True, seq_ids=seq)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    mask = batch_mask(spec, case.batch, dev, backend="auto" if case.mode == "auto" else "flex",
                      grad=case.passes == "fwd+bwd")  # fmt: skip
    if dev.type == "cuda":
        torch.cuda.synchronize()
    mask_ms = (time.perf_counter() - t0) * 1e3 if mask.flex is not None else None
    if case.mode == "auto":
        return (lambda q, k, v: alibi_attention(q, k, v, slope_mod(), mask=mask)), mask.backend, mask_ms
    opts, with_bias = case.kernel_options or None, case.mode != "flex-nobias"

    def flex(q, k, v):
        return flex_alibi_attention(q, k, v, slope_mod(), mask=mask.flex, with_bias=with_bias, kernel_options=opts)

    return flex, "flex", mask_ms


def run_case(case: Case) -> dict:
    """Time, TFLOP/s and peak memory of one case, in this process."""
    import torch

    from recsys_alibi.model.alibi import AlibiSlopes

    torch.manual_seed(0)
    dev = torch.device(case.device)
    dtype = getattr(torch, case.dtype)
    shape = (case.batch, case.heads, case.length, case.dim)  # (B, H, L, D)
    grad = case.passes == "fwd+bwd"
    q, k, v = (torch.randn(shape, device=dev, dtype=dtype, requires_grad=grad) for _ in range(3))
    g = torch.randn(shape, device=dev, dtype=dtype)
    slope_mod = AlibiSlopes(case.heads, learnable=case.mode == "flex-alibi-learnable").to(dev)
    fn, backend, mask_ms = _attention_fn(case, dev, slope_mod)

    def once() -> None:
        if grad:
            fn(q, k, v).backward(g)
            q.grad = k.grad = v.grad = None
            slope_mod.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                fn(q, k, v)
        if dev.type == "cuda":
            torch.cuda.synchronize()

    once()  # warm-up: compiles flex
    if backend == "flex":
        from recsys_alibi.model.flex import flex_runner

        if flex_runner().failed:  # it ran sdpa instead (the warning says why): not a flex row
            raise RuntimeError(f"flex fell back to sdpa for {sorted(flex_runner().failed, key=str)}")
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
    ms = min(times) * 1e3
    return {
        "L": case.length, "mode": case.mode, "backend": backend, "ms": round(ms, 4),
        "tflops": round(case.flops() / (ms * 1e-3) / 1e12, 4), "peak_mib": round(peak / 2**20, 1),
        "passes": case.passes, "layout": case.layout, "B": case.batch, "H": case.heads, "D": case.dim,
        "T": sum(map(sum, case.seq_lens)) if case.seq_lens else case.batch * case.length,
        "dtype": case.dtype, "device": case.device, "median_ms": round(statistics.median(times) * 1e3, 4),
        "mask_ms": None if mask_ms is None else round(mask_ms, 3), "flops": case.flops(),
        "kernel_options": case.kernel_options,
    }  # fmt: skip


def _subprocess(case: Case, timeout: float) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [sys.executable, os.path.abspath(__file__), "--case", json.dumps(asdict(case))]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return _error(case, f"timeout {timeout:.0f}s")
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        tail = (res.stderr.strip().splitlines() or ["?"])[-1]
        return _error(case, f"rc={res.returncode}: {tail[:160]}")
    return json.loads(lines[-1])


def _error(case: Case, msg: str) -> dict:
    return {"L": case.length, "mode": case.mode, "passes": case.passes, "layout": case.layout, "D": case.dim,
            "B": case.batch, "error": msg}  # fmt: skip


def _in_process(case: Case) -> dict:
    try:
        return run_case(case)
    except Exception as err:  # a case that fails (OOM, compile error) is a row, not the end of the table
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return _error(case, f"{type(err).__name__}: {str(err).splitlines()[0][:160]}")


def user_lengths(path: str | None, cap: int = 0) -> tuple[list[int], str]:
    """Events per user of a SASRec-format file (``user item`` per line), or the documented
    synthetic distribution when ``path`` is None or absent, each cut to ``cap`` when > 0 (the
    training window); with a description of the source."""
    lens, source = _user_lengths(path)
    if cap > 0:
        return [min(n, cap) for n in lens], f"{source}, each cut to its last {cap} events"
    return lens, source


def _user_lengths(path: str | None) -> tuple[list[int], str]:
    if path and os.path.exists(path):
        counts: dict[str, int] = {}
        with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
            for line in f:
                user = line.split(maxsplit=1)[0]
                counts[user] = counts.get(user, 0) + 1
        return list(counts.values()), f"{path}: {len(counts)} users"
    import numpy as np

    rng = np.random.default_rng(0)
    lens = np.clip(np.round(np.exp(rng.normal(math.log(96), 1.0, 6040))), 20, 2314).astype(int)
    return lens.tolist(), "synthetic: 6040 users, round(exp(N(ln 96, 1))) clipped to [20, 2314], seed 0"


def packed_rows(lengths: Sequence[int], row_len: int, n_rows: int) -> tuple[tuple[int, ...], ...]:
    """``n_rows`` rows of a first-fit-decreasing packing into rows of ``row_len``, evenly spaced
    over all rows but the part-filled last one (a mix of the rows holding long and short users);
    each row: the users' lengths."""
    from recsys_alibi.model.packing import pack_sequences

    plan = pack_sequences(lengths, row_len)
    rows = plan.rows()
    rows = rows[:-1] if len(rows) > n_rows else rows  # the last row is the part-filled remainder
    pick = [rows[round(i * (len(rows) - 1) / max(1, n_rows - 1))] for i in range(n_rows)]
    return tuple(tuple(plan.lengths[s] for s in row) for row in pick)


def cases(args: argparse.Namespace) -> list[Case]:
    out = []
    opts = json.loads(args.kernel_options) if args.kernel_options else {}
    common = dict(heads=args.heads, dtype=args.dtype, device=args.device, repeats=args.repeats, kernel_options=opts)
    layouts = [(length, max(1, args.budget // length), ()) for length in args.lengths]
    if args.packed:
        lens, _ = user_lengths(args.packed_file, args.packed_cap)
        n_rows = max(1, args.budget // args.packed_len)
        layouts.append((args.packed_len, n_rows, packed_rows(lens, args.packed_len, n_rows)))
    for dim in args.dims:
        for length, batch, seq_lens in layouts:
            for mode in args.modes:
                if seq_lens and mode in DENSE_ONLY:
                    continue
                if mode == "eager" and length > args.eager_max_len:
                    continue
                for passes in args.passes:
                    if passes == "fwd+bwd" and (mode == "sdpa-chunked" or
                                                (args.device == "cpu" and mode in FORWARD_ONLY_ON_CPU)):
                        continue  # fmt: skip
                    if passes == "fwd+bwd" and args.device == "cpu" and mode == "auto":
                        continue  # auto trains through sdpa on CPU: the sdpa-mask row
                    out.append(Case(mode, passes, length, batch, dim=dim, seq_lens=seq_lens, **common))
    return out


def markdown(results: Sequence[dict]) -> str:
    """One row per case: L, layout, D, pass, mode, backend, ms, TFLOP/s, peak MiB, mask build ms."""
    rows = [
        "| L | layout | B | D | pass | mode | backend | ms | TFLOP/s | peak MiB | mask build ms |",
        "|---:|---|---:|---:|---|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            cells = [r["L"], r["layout"], r["B"], r["D"], r["passes"], r["mode"], "-", "error: " + r["error"], "", "", ""]
        else:
            mask = "-" if r["mask_ms"] is None else f"{r['mask_ms']:.2f}"
            cells = [r["L"], r["layout"], r["B"], r["D"], r["passes"], r["mode"], r["backend"], f"{r['ms']:.2f}",
                     f"{r['tflops']:.3g}", f"{r['peak_mib']:,.0f}", mask]  # fmt: skip
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(rows)


def density_figure(path: str | None, row_len: int = 4096, budget: int = 65536, cap: int = 0) -> str:
    """Share of the causal blocks that the packed rows' BlockMask keeps, and its build time (CPU)."""
    import torch

    from recsys_alibi.model.block_mask import BLOCK, build_flex_mask
    from recsys_alibi.model.masks import MaskSpec

    lens, source = user_lengths(path, cap)
    n_rows = max(1, budget // row_len)
    case = Case("flex-alibi", "fwd", row_len, n_rows, 4, 64, "float32", "cpu", 1, packed_rows(lens, row_len, n_rows))
    dev = torch.device("cpu")
    spec = MaskSpec.build(n_rows, row_len, row_len, dev, causal=True, seq_ids=_seq_ids(case, dev))
    build_flex_mask(spec, n_rows, dev)  # warm-up
    t0 = time.perf_counter()
    fm = build_flex_mask(spec, n_rows, dev)
    build_ms = (time.perf_counter() - t0) * 1e3
    nb = row_len // BLOCK
    causal_blocks = n_rows * nb * (nb + 1) // 2
    partial = int(fm.block_mask.kv_num_blocks[:n_rows].sum())
    full = int(fm.block_mask.full_kv_num_blocks[:n_rows].sum())
    tokens = sum(map(sum, case.seq_lens))
    return (
        f"{source}; {n_rows} rows of {row_len} (evenly spaced over the first-fit-decreasing packing), "
        f"{tokens} tokens, {sum(map(len, case.seq_lens))} users\n"
        f"blocks kept: {partial + full} of {causal_blocks} causal blocks ({(partial + full) / causal_blocks:.1%}); "
        f"full (no mask_mod) {full}, partial {partial}; packed FLOPs / dense causal FLOPs at the same T "
        f"{case.flops() / (2.0 * n_rows * row_len**2 * 4 * 64):.1%}; BlockMask build {build_ms:.1f} ms on this CPU"
    )


def waste_figure(path: str, max_len: int = 200, batch_size: int = 128) -> str:
    """Padding waste on a SASRec-format file (``user item`` per line), histories cut to max_len."""
    from recsys_alibi.model.packing import batch_padding_waste, pack_sequences, padding_waste

    counts, _ = _user_lengths(path)
    lengths = [min(n, max_len) for n in counts]  # users in file order
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


def _atomic_json(path: str, payload) -> None:
    from recsys_alibi.atomic import atomic_path  # refuses a device or FIFO at path

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(payload, f, indent=1)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--budget", type=int, default=16384, help="tokens per batch T; B = T // L")
    p.add_argument("--lengths", type=int, nargs="*", default=[256, 1024, 4096], help="dense row lengths (may be none)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128], help="head widths D")
    p.add_argument("--modes", nargs="+", default=["flex-alibi", "flex-nobias", "sdpa-mask", "sdpa-nobias", "auto"],
                   choices=MODES)  # fmt: skip
    p.add_argument("--passes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    p.add_argument("--packed", action="store_true", help="add the packed ML-1M case")
    p.add_argument("--packed-file", default=ML1M, help="SASRec-format file for --packed (synthetic if absent)")
    p.add_argument("--packed-len", type=int, default=4096, help="packed row length")
    p.add_argument("--packed-cap", type=int, default=0, help="cut each user to the last N events (0: whole histories)")
    p.add_argument("--kernel-options", help='flex kernel options as JSON, e.g. \'{"BLOCK_M": 64, "BLOCK_N": 64}\'')
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--eager-max-len", type=int, default=4096, help="skip eager above this L (B*H*L*L scores)")
    p.add_argument("--isolate", action="store_true", help="each case in a subprocess (default on CPU)")
    p.add_argument("--in-process", action="store_true", help="CPU: all cases in this process, as on CUDA")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per isolated case")
    p.add_argument("--json", help="write the rows here (keys per row: L, mode, backend, ms, tflops, peak_mib, ...)")
    p.add_argument("--density", action="store_true", help="print the packed case's block-mask density and exit")
    p.add_argument("--waste", metavar="PATH", help="print the padding-waste figure for this SASRec file and exit")
    p.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case, print JSON
    args = p.parse_args(argv)
    if args.case:
        import torch

        torch.set_num_threads(int(os.environ.get("BENCH_THREADS", torch.get_num_threads())))
        raw = json.loads(args.case)
        raw["seq_lens"] = tuple(tuple(r) for r in raw["seq_lens"])
        print(json.dumps(run_case(Case(**raw))))
        return 0
    if args.waste:
        print(waste_figure(args.waste))
        return 0
    if args.density:
        print(density_figure(args.packed_file, args.packed_len, args.budget, args.packed_cap))
        return 0
    print(FLOP_FORMULA, file=sys.stderr)
    if args.packed:
        print("packed case: " + user_lengths(args.packed_file, args.packed_cap)[1], file=sys.stderr)
    isolate = args.isolate or (args.device == "cpu" and not args.in_process)
    from recsys_alibi.diagnostics.machine import command_line, machine_line

    command, machine = command_line("benchmarks/attention.py", argv), machine_line()
    if args.device == "cuda":
        import torch

        if torch.cuda.is_available():
            machine += f", {torch.cuda.get_device_name()}"
    results = []
    for case in cases(args):
        r = _subprocess(case, args.timeout) if isolate else _in_process(case)
        results.append(r)
        msg = r.get("error") or f"{r['ms']:.2f} ms, {r['tflops']:.3g} TFLOP/s, {r['peak_mib']:.0f} MiB ({r['backend']})"
        print(f"{case.mode:>20} {case.passes:>7} {case.layout:>6} L={case.length:<5} B={case.batch:<3} D={case.dim:<3} {msg}",
              file=sys.stderr, flush=True)  # fmt: skip
        if args.json:  # rewritten after every case: a run cut short keeps what it measured
            _atomic_json(args.json, {"command": command, "machine": machine, "formula": FLOP_FORMULA, "rows": results})
    print(FLOP_FORMULA)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
