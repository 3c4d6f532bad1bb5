"""What one training epoch (and one validation) costs against ``model.max_len``, on CPU, one thread.

For each ``--max-lens`` value (``whole`` = the longest history of the prepared data) and each
``--precisions`` value, the recipe of ``--config`` (with the ``--set`` overrides) builds its
datamodule and module exactly as ``train`` does (``SequenceDataModule``, ``RankerModule``), then

- loads the epoch's batches (``train_dataloader()`` of epoch 0: collating is timed as ``load``),
- runs every batch of the epoch once as Lightning's step does (autocast under ``bf16-mixed``,
  the loss, backward, gradient clipping at ``train.grad_clip``, AdamW, zero grad), after one
  untimed warm-up step on the first batch,
- runs the validation loop (``val_dataloader()``, ``validation_step`` under ``no_grad`` and the
  same autocast) and reports its NDCG@10 (a batching change must leave it unchanged),
- times what the ``AttentionHealth`` callback adds to each validation (``health``),

and reports CPU seconds (``time.process_time``) and wall seconds of each part, supervised tokens
per CPU second, the epoch's padded tokens and the attention score pairs its batches compute
(``rows x L_max^2``) beside the causal pairs its windows need (``sum L^2 / 2``).
``--batches N`` times every k-th batch of the epoch (N of them, spread over the lengths) and
scales the step time up to the epoch by supervised tokens (stated in the output as
``extrapolated``). The max_len values run back to back in one process, in the order given,
so that the ratio whole / 200 is measured under one load (state ``uptime`` beside it).

Usage (from the repository root, after ``make install`` and ``recsys-alibi prepare``):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/epoch_cost.py --config configs/movielens-1m.yaml \\
        --prepared runs/movielens-1m/prepared --max-lens 200 whole 1000 --precisions 32-true bf16-mixed \\
        --set train.packing=false --set train.batch_tokens=32768 --set evaluate.batch_size=32 \\
        --json runs/epoch-cost.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from recsys_alibi.diagnostics.machine import command_line, cpu_name


def _whole(prepared: Path) -> int:
    from recsys_alibi.data.prepare import read_sequences

    return int(read_sequences(prepared).get_column("length").max())


def epoch_shape(batches: list[dict]) -> dict:
    """Supervised tokens, padded tokens and attention pairs of an epoch's (B, L) batches."""
    tokens = padded = computed = causal = 0
    for b in batches:
        n = b["lengths"].numpy().astype(np.int64)  # (B,) inputs per row
        rows, width = b["inputs"].shape
        tokens += int((b["targets"] > 0).sum())
        padded += rows * width
        computed += rows * width * width
        causal += int((n * (n + 1) // 2).sum())
    return {"batches": len(batches), "tokens": tokens, "padded_tokens": padded,
            "padding_waste": 1 - tokens / max(padded, 1), "pairs_full": computed, "pairs_causal": causal}  # fmt: skip


def run_case(config, prepared: Path, precision: str, batches_timed: int | None, profile: int = 0) -> dict:
    """Train one epoch and validate once; see the module doc."""
    from recsys_alibi.training.datamodule import SequenceDataModule
    from recsys_alibi.training.module import RankerModule, metrics_from_sums, validation_sums

    bf16 = precision == "bf16-mixed"
    torch.manual_seed(config.seed)
    dm = SequenceDataModule(prepared, config.model, config.train, config.seed, protocol=config.evaluate.protocol)
    dm.load()
    started, cpu0 = time.perf_counter(), time.process_time()
    batches = list(dm.train_dataloader())
    load = {"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - started}
    module = RankerModule(config.model, config.train, dm.n_items, dm.item_counts(), config.evaluate.exclude_seen,
                          seed=config.seed)  # fmt: skip
    module.log = lambda *args, **kwargs: None  # no trainer attached
    optimizer = torch.optim.AdamW(module.parameters(), lr=config.train.lr, betas=(0.9, 0.98))
    clip = config.train.grad_clip

    def step(batch: dict) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = module.training_step(batch, 0)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    shape = epoch_shape(batches)
    timed = list(range(len(batches)))
    if batches_timed and batches_timed < len(batches):  # spread over the lengths: every k-th by width
        by_width = sorted(timed, key=lambda i: batches[i]["inputs"].shape[1])
        timed = [by_width[int(j)] for j in np.linspace(0, len(by_width) - 1, batches_timed).round()]
    module.train()
    step(batches[0])  # warm-up, untimed
    timed_tokens = sum(int((batches[i]["targets"] > 0).sum()) for i in timed)
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profile else None
    started, cpu0 = time.perf_counter(), time.process_time()
    with profiler or contextlib.nullcontext():
        for i in timed:
            step(batches[i])
    train = {"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - started}
    if len(timed) < len(batches):
        scale = shape["tokens"] / timed_tokens
        train = {k: v * scale for k, v in train.items()} | {"extrapolated": f"{len(timed)} of {len(batches)} batches"}
    train["tokens_per_cpu_s"] = shape["tokens"] / train["cpu_s"]
    if profiler is not None:
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=profile), flush=True)

    module.eval()
    ranks = []
    started, cpu0 = time.perf_counter(), time.process_time()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loader = dm.val_dataloader()
        val_batches = 0
        for batch in loader:
            module.validation_step(batch, val_batches)
            val_batches += 1
    valid = {"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - started, "batches": val_batches}
    ranks = torch.cat(module._val_ranks).numpy()
    module._val_ranks.clear()
    valid["users"] = int(ranks.size)
    valid["ndcg_at_10"] = metrics_from_sums(validation_sums(ranks)).get("val/ndcg_at_10")
    return {"max_len": config.model.max_len, "precision": precision, "epoch": shape, "load": load,
            "train": train, "validation": valid, "health": health_cost(module, loader, bf16)}  # fmt: skip


def health_cost(module, loader, bf16: bool) -> dict:
    """CPU and wall seconds of what ``AttentionHealth`` adds to each validation (its defaults):
    the eager attention weights of its rows of the first validation batch, and their metrics."""
    from recsys_alibi.training.attention_health import AttentionHealth, first_rows, health_batch, health_metrics

    callback, model = AttentionHealth(), module.model
    batch = health_batch(first_rows(loader, callback.max_rows), model.cfg.n_heads, callback.max_rows, callback.max_bytes)
    started, cpu0 = time.perf_counter(), time.process_time()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        weights = model.attention_weights(batch["history"], batch["lengths"], batch.get("history_gaps"))
    health_metrics(weights, batch["lengths"], model.cfg.window, model.cfg.sinks)
    return {"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - started,
            "rows": int(batch["lengths"].shape[0]), "width": int(batch["history"].shape[1])}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--prepared", type=Path, required=True)
    parser.add_argument("--max-lens", nargs="+", default=["200", "whole"], help="ints or 'whole'")
    parser.add_argument("--precisions", nargs="+", default=["32-true"], choices=["32-true", "bf16-mixed"])
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="dotted.key=value")
    parser.add_argument("--batches", type=int, default=None, help="time only this many batches, scaled to the epoch")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", type=int, default=0, help="print the top N ops of the timed steps (torch.profiler)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from recsys_alibi.config import load_config

    torch.set_num_threads(args.threads)
    torch.set_float32_matmul_precision("high")  # as fit_ranker
    whole = _whole(args.prepared)
    cases = []
    for precision in args.precisions:
        for text in args.max_lens:
            max_len = whole if text == "whole" else int(text)
            config = load_config(args.config, [*args.overrides, f"model.max_len={max_len}"])
            case = run_case(config, args.prepared, precision, args.batches, args.profile)
            case["load_average"] = list(__import__("os").getloadavg())
            cases.append(case)
            print(json.dumps(case), flush=True)
    for precision in args.precisions:
        rows = [c for c in cases if c["precision"] == precision]
        base = rows[0]["train"]["cpu_s"]
        for c in rows:
            print(f"{precision} max_len {c['max_len']}: train {c['train']['cpu_s']:.1f} CPU s "
                  f"({c['train']['tokens_per_cpu_s']:.0f} tokens/s, {c['train']['cpu_s'] / base:.2f}x), "
                  f"validation {c['validation']['cpu_s']:.1f} CPU s, health {c['health']['cpu_s']:.1f} s, "
                  f"load {c['load']['cpu_s']:.1f} s")  # fmt: skip
    result = {"machine": {"cpu": cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                          "python": platform.python_version()},
              "command": command_line("benchmarks/epoch_cost.py", argv),
              "cases": cases}  # fmt: skip
    if args.json:
        from recsys_alibi.atomic import write_text_atomic

        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.json, json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
