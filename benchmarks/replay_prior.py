"""A recency-weighted popularity prior added to a replay chain's scores, chosen walk-forward, on the next periods.

Run from the repository root on a finished ``benchmarks/replay.py`` JSON whose models are still in its tracking
store (``--store``, else ``MLFLOW_TRACKING_URI``, else its ``--workdir``'s ``mlflow.db``, as the replay chose;
minutes on a CPU):

    .venv/bin/python benchmarks/replay_prior.py docs/results/replay-ml100k.json --arm warm

Each model ``m_k`` of the chain (``step0``, then the arm's model of step ``k``, trained on the events before the
boundary ``b_k``) ranks its next period ``[b_k, b_k+1)`` (``replay.next_period_examples``: each test user's first
next-period event on a catalog item not in the history, full catalog, seen items excluded) with

    score_i = logit_i + beta * log(1 + c_i),   c_i = sum over the events of item i before b_k of 0.5 ** (age / h)

(``recsys_alibi.evaluation.popularity_prior``; age in days, ``h`` the half-life, None: plain counts; ``beta``
``inf``: the recent counts first, the model breaks ties). A logit and a log-softmax differ by a constant per user,
so the order is that of ``p_model * (1 + c) ** beta`` (a product of experts; the recent-popularity baseline of
Ji et al., SIGIR 2020, arXiv 2005.13829, with the model as the other expert).

**The choice is walk-forward, never on the figure it is read on:** for step ``k`` the point ``(beta, h)`` of
:data:`GRID` with the best mean NDCG@10 over the next periods of ``m_0 .. m_k-1`` (this seed's chain), all of
which end by ``b_k``, so a daily job can make the same choice with what it holds at ``b_k``. ``recent`` is the
same choice restricted to ``beta = inf`` (recent popularity alone). Writes ``--output`` (default
``REPLAY.prior.json``; ``runs/`` for a replay under docs/results/): the command, the machine, per step and seed the chosen points; pooled over (seed, step, user) the means of the arm,
``prior`` (the arm with the chosen prior) and ``recent``, the paired differences ``prior_minus_arm``,
``prior_minus_recent``, ``recent_minus_arm``, and ``prior_minus_<other>`` for the replay's other arms
(unchanged, as the replay scored them), each with a percentile-bootstrap 95 % interval (``replay._difference``);
and every grid point's mean over steps 1.. (``grid_means``, for reading only). ``--uris FILE.json``
(``{seed: {step: model URI}}``) takes the chain's models from elsewhere (an arm trained again with its models
kept); ``--seeds`` scores only some of the replay's seeds (the others' models gone; ``replay_prior_pool.py`` pools
outputs of disjoint seeds). Refused with one line (exit 2): a file that is not a finished replay, an arm it did not run, a model not
in the tracking store, an ``--output`` that is a folder or one of the replay's files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from recsys_alibi.evaluation.popularity_prior import BETAS, GRID, HALF_LIVES


def grid_values(loaded, examples, logprior: np.ndarray) -> dict[str, np.ndarray]:
    """{str(user_id): (len(GRID), 2) [NDCG@10, HR@10]} of one model on ``examples`` under every grid point
    (``pipelines.prior_choice.example_grid_metrics``, what the daily pipeline scores with).

    Args:
        loaded: a ``LoadedRanker`` whose numbering is the examples' (the step's catalog).
        examples: ``history`` and one-item ``targets`` (``replay.next_period_examples``).
        logprior: (len(HALF_LIVES), N + 1) float64 ``log(1 + c)`` per half-life (column 0 padding).
    """
    from pipelines.prior_choice import example_grid_metrics

    values = example_grid_metrics(loaded, examples, logprior)
    return {str(u): v for u, v in zip(examples["user_id"].to_list(), values)}


def in_model_view(loaded, prepared: Path, examples, logprior: np.ndarray) -> tuple:
    """``(examples, logprior)`` of the step's data in the numbering of ``loaded`` (a model of this step's catalog or
    an earlier one), mapped by raw ``item_id``: history events and targets it does not know dropped, an example
    left with none removed (``pipelines.promotion.examples_in_vocabulary``); unchanged in the same numbering."""
    from pipelines.prior_choice import in_model_numbering
    from pipelines.promotion import examples_in_vocabulary
    from recsys_alibi.data.sequences import read_items
    from serving.inputs import vocabulary_remap

    remap, _ = vocabulary_remap(read_items(prepared), loaded.items)
    if remap is None:
        return examples, logprior
    return examples_in_vocabulary(examples, remap)[0], in_model_numbering(logprior, remap, loaded.items.height)


def model_values(loaded, prepared: Path, examples, logprior: np.ndarray) -> dict[str, np.ndarray]:
    """:func:`grid_values` of a model of this step or an earlier one (``stale``; a gated chain's champion kept,
    ``replay.py --gate``) in its own numbering (:func:`in_model_view`); a user whose target or whole history it
    does not know counts a miss (zeros)."""
    values = grid_values(loaded, *in_model_view(loaded, prepared, examples, logprior))
    return {str(u): values.get(str(u), np.zeros((len(GRID), 2))) for u in examples["user_id"].to_list()}


def walk_forward(chain: list[dict[str, np.ndarray]], allowed: list[int]) -> list[int]:
    """The grid index chosen for each step 1..len(chain)-1: the best of ``allowed`` in mean NDCG@10 over every
    user of ``chain[0 .. k-1]`` (ties: the first, so the smaller beta); ``chain[k]`` holds model k's values on
    its next period."""
    chosen = []
    for k in range(1, len(chain)):
        past = np.concatenate([np.stack(list(c.values()))[:, :, 0] for c in chain[:k] if c])  # (users, G)
        means = past.mean(0)
        chosen.append(max(allowed, key=lambda g: (means[g], -g)))
    return chosen


def _read_prior(path: Path, parser) -> dict[str, list]:
    """The per-user file beside an earlier output of this script: {"seed/step/user": [arm, prior, recent,
    stale_prior]}, each [NDCG@10, HR@10]; refused with one line when it is not one."""
    try:
        values = json.loads(path.with_suffix(".per_user.json").read_text())
        json.loads(path.read_text())["arm"]
        return {key: [[float(x) for x in v] for v in rows] for key, rows in values.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        parser.error(f"--against {path}: not an output of replay_prior.py with its .per_user.json ({err})")


def _label(g: int) -> dict:
    beta, half_life = GRID[g]
    return {"beta": "inf" if math.isinf(beta) else beta, "half_life_days": half_life}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="replay_prior.py", description=__doc__.splitlines()[0])
    parser.add_argument("replay", type=Path, help="a finished benchmarks/replay.py JSON")
    parser.add_argument("--arm", default="warm", help="the chain whose models get the prior (default warm)")
    parser.add_argument("--uris", type=Path, help="JSON {seed: {step: model URI}}: the chain's models from elsewhere")
    parser.add_argument("--store", help="MLflow tracking URI of the models (default: MLFLOW_TRACKING_URI, else the "
                        "replay's workdir store)")
    parser.add_argument("--output", type=Path, help="JSON path (default: REPLAY.prior.json beside it, runs/REPLAY.prior.json for a replay in docs/results/)")
    parser.add_argument("--seeds", nargs="+", help="score only these seeds of the replay (default: every seed with a "
                        "finished step): the others' models may be gone; pool outputs with replay_prior_pool.py")
    parser.add_argument("--against", type=Path, help="an earlier output of this script (another chain of the same "
                        "replay): its prior paired with this one's")
    args = parser.parse_args(argv)

    import replay as replay_script
    from pipelines.cli import configure_logging
    from recsys_alibi.atomic import write_json_atomic
    from recsys_alibi.diagnostics.machine import command_line, machine_line
    from recsys_alibi.evaluation.popularity_prior import recency_counts

    configure_logging()
    doc, r, runs, output = replay_script.read_for_output(args.replay, args.output, ".prior.json", parser)
    if args.arm not in doc.get("arms", []) or args.arm == "stale":
        parser.error(f"--arm {args.arm}: not a trained arm of {args.replay} (its arms: {doc.get('arms')})")
    try:
        uris = json.loads(args.uris.read_text()) if args.uris else None
        if uris is not None:  # {seed: {step: URI}}
            uris = {str(seed): {int(k): str(v) for k, v in steps.items()} for seed, steps in uris.items()}
    except (OSError, ValueError, TypeError, AttributeError, RecursionError) as err:
        parser.error(f"--uris {args.uris}: not a JSON {{seed: {{step: model URI}}}} ({err})")
    if args.against is not None:
        _read_prior(args.against, parser)  # refused before minutes of scoring
    # as the replay chose its store: MLFLOW_TRACKING_URI when set, else its workdir's
    os.environ["MLFLOW_TRACKING_URI"] = args.store or os.environ.get("MLFLOW_TRACKING_URI") or \
        f"sqlite:///{Path(r.workdir).resolve() / 'mlflow.db'}"  # fmt: skip
    from recsys_alibi.tracking import ModelUriError, load_ranker

    config, events, bounds = replay_script.replayed_log(r, [o for o in r.overrides if o.startswith("data.")])
    seeds = [s for s in runs if runs[s].get("steps")]
    if args.seeds is not None:
        absent = sorted(set(args.seeds) - set(seeds))
        if absent:
            parser.error(f"--seeds: {args.replay} has no finished step of seed(s) {', '.join(absent)} (its seeds: "
                         f"{', '.join(seeds) or 'none'})")  # fmt: skip
        seeds = [s for s in seeds if s in args.seeds]
    last = min(max(st["step"] for st in runs[s]["steps"]) for s in seeds) if seeds else 0
    if uris is not None:
        seeds = [s for s in seeds if s in uris]
        for s in seeds:
            missing = sorted(set(range(1, last + 1)) - set(uris[s]))
            if missing:
                parser.error(f"--uris {args.uris}: seed {s} has no model for step(s) {missing} of the replay")
    if not seeds or last < 1:
        parser.error(f"{args.replay}: no seed with a finished step (and a model in --uris)")

    def uri_of(seed: str, k: int) -> str:
        if k == 0:
            return runs[seed]["step0"]["uri"]
        if uris is not None:
            return uris[seed][k]
        return next(st for st in runs[seed]["steps"] if st["step"] == k)["arms"][args.arm]["uri"]

    chains: dict[str, list] = {s: [] for s in seeds}
    stale: dict[str, list] = {s: [{}] for s in seeds}  # stale[seed][k]: model k-1 on step k's next period
    with tempfile.TemporaryDirectory(prefix="replay-prior-") as tmp:
        previous: dict[str, object] = {}
        for k, prepared in replay_script.prepared_steps(config, events, bounds, last, Path(tmp)):
            logprior, examples = None, None
            for seed in seeds:
                try:
                    loaded = load_ranker(uri_of(seed, k))
                except (ModelUriError, KeyError) as err:
                    parser.error(f"seed {seed} step {k}: its model is not in the tracking store ({err}); "
                                 "run where the replay ran, or give --store")  # fmt: skip
                if examples is None:
                    examples = replay_script.next_period_examples(prepared, events, bounds[k], bounds[k + 1], loaded.model)
                    logprior = np.log1p(recency_counts(prepared, bounds[k], HALF_LIVES))
                chains[seed].append(model_values(loaded, prepared, examples, logprior))
                if k:
                    stale[seed].append(model_values(previous[seed], prepared, examples, logprior))
                previous[seed] = loaded
            print(f"step {k}: {examples.height} test users scored under {len(GRID)} grid points", flush=True)

    everything = list(range(len(GRID)))
    recent_only = [g for g, (b, _) in enumerate(GRID) if math.isinf(b)]
    pairs: dict[str, list] = {"arm": [], "prior": [], "recent": [], "stale_prior": []}
    keys: list[tuple[str, int, str]] = []  # (seed, step, user) of every pair, in order
    others = [a for a in doc["arms"] if a != args.arm]
    other_pairs: dict[str, tuple[list, list]] = {a: ([], []) for a in others}
    chosen_out: dict[str, dict] = {}
    for seed in seeds:
        chain = chains[seed]
        prior_pick, recent_pick = walk_forward(chain, everything), walk_forward(chain, recent_only)
        chosen_out[seed] = {str(k): {"prior": _label(prior_pick[k - 1]), "recent": _label(recent_pick[k - 1])}
                            for k in range(1, last + 1)}  # fmt: skip
        for k in range(1, last + 1):
            step = next(st for st in runs[seed]["steps"] if st["step"] == k)
            g = prior_pick[k - 1]
            for user in sorted(chain[k]):
                v = chain[k][user]
                keys.append((seed, k, user))
                pairs["arm"].append(v[0])
                pairs["prior"].append(v[g])
                pairs["recent"].append(v[recent_pick[k - 1]])
                pairs["stale_prior"].append(stale[seed][k][user][g])  # the previous model, the chain's choice
                for a in others:
                    scored = step["per_user"].get(a, {}).get(user)
                    if scored is not None:
                        other_pairs[a][0].append(v[g])
                        other_pairs[a][1].append(scored)
    users = [user for _, _, user in keys]
    all_steps = np.concatenate([np.stack(list(chains[s][k].values())) for s in seeds for k in range(1, last + 1)])
    out = {
        "replay": str(args.replay), "command": command_line("benchmarks/replay_prior.py", argv), "machine": machine_line(),
        "arm": args.arm, "models": str(args.uris) if args.uris else "the replay's",
        "grid": {"beta": ["inf" if math.isinf(b) else b for b in BETAS], "half_life_days": list(HALF_LIVES)},
        "rule": "step k: the grid point with the best mean NDCG@10 over the next periods of the chain's models "
                "0..k-1 (this seed), all ending by b_k; recent: the same among beta = inf",
        "seeds": seeds, "steps": last, "chosen": chosen_out,
        "mean_NDCG@10": {name: float(np.mean([v[0] for v in values])) for name, values in pairs.items()},
        "prior_minus_arm": replay_script._difference(pairs["prior"], pairs["arm"], users=users),
        "prior_minus_recent": replay_script._difference(pairs["prior"], pairs["recent"], users=users),
        "recent_minus_arm": replay_script._difference(pairs["recent"], pairs["arm"], users=users),
        "prior_minus_stale_with_prior": replay_script._difference(pairs["prior"], pairs["stale_prior"], users=users),
        "grid_means": [{**_label(g), "NDCG@10": float(all_steps[:, g, 0].mean())} for g in range(len(GRID))],
    }  # fmt: skip
    for a, (mine, theirs) in other_pairs.items():
        if mine:
            out[f"prior_minus_{a}"] = replay_script._difference(mine, theirs)
    per_user = {f"{s}/{k}/{u}": [list(map(float, pairs[name][i])) for name in ("arm", "prior", "recent", "stale_prior")]
                for i, (s, k, u) in enumerate(keys)}  # fmt: skip
    if args.against is not None:  # this chain with its prior against another chain with its own
        theirs = _read_prior(args.against, parser)
        common = [key for key in per_user if key in theirs]
        if not common:
            parser.error(f"--against {args.against}: no (seed, step, user) in common with this replay")
        out["against"] = {"file": str(args.against), "arm": json.loads(args.against.read_text())["arm"],
                          "prior_minus_their_prior": replay_script._difference(
                              [per_user[c][1] for c in common], [theirs[c][1] for c in common],
                              users=[c.split("/")[2] for c in common]),
                          "arm_minus_their_arm": replay_script._difference(
                              [per_user[c][0] for c in common], [theirs[c][0] for c in common],
                              users=[c.split("/")[2] for c in common])}  # fmt: skip
        out["prior_minus_their_prior"] = out["against"]["prior_minus_their_prior"]
    for name in ("prior_minus_arm", "prior_minus_recent", "recent_minus_arm", "prior_minus_stale_with_prior",
                 *(f"prior_minus_{a}" for a in others), "prior_minus_their_prior"):  # fmt: skip
        if name in out:
            d = out[name]["NDCG@10"]
            by_user = f" (resampling users [{d['ci95_by_user'][0]:+.4f}, {d['ci95_by_user'][1]:+.4f}])" if "ci95_by_user" in d else ""
            print(f"{name}: NDCG@10 {d['difference']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]{by_user} over {d['pairs']} pairs")
    write_json_atomic(output.with_suffix(".per_user.json"), per_user)
    write_json_atomic(output, out)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
