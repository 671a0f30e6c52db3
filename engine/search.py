"""The tuner's search, blind to what the configs mean: it sees candidate dicts, a cost model to
order them, and a ``measure(config, reps)`` that returns milliseconds (inf: rejected).

Guided search (``guided``): the cost model's best per group (algorithm and kernel) first, then
around the fastest configs so far -- their schedule siblings, then configs one tunable away --
until a budget of timings is spent; ``finish`` re-times the finalists with more runs
(successive halving). Which keys are tunables, schedule knobs or block shape is the kernel
families' word (:class:`SpaceKeys`, from ``kernels.family.space_keys``).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Iterable

SEED_SHARE = 0.5            # share of the search budget spent on per-group seeds, the rest near the best
# The local phase walks around this many of the fastest configs so far. Four, not two: a second
# basin (another Winograd tile, another vector shape) a little slower after the seeds still gets
# explored. Replayed on the 66 recorded shapes (tools/recordings): 61 -> 62 within 5% at a quarter
# timed, worst 1.391 -> 1.070; at 15% timed 56 -> 60, worst 1.672 -> 1.334.
ANCHORS = 4


@dataclass(frozen=True)
class SpaceKeys:
    """What the search needs to know of config keys: ``fixed`` ones a neighbour step never turns
    (the family, and values a family derives from others), ``schedule`` knobs that change neither
    register block nor tiles, ``block`` keys that make a config's shape, and ``group`` keys."""

    fixed: tuple = ("family",)
    schedule: tuple = ()
    block: tuple = ()
    group: tuple = ("family", "algo", "kernel")


def config_key(cfg: dict) -> str:
    """A config's identity in the tuner's tables (and in tools/tune_eval.py's recordings)."""
    return repr(sorted(cfg.items()))


def new_state() -> dict:
    """A search's bookkeeping: launches checked (None: rejected), bound ahead (launches or why
    not), keys timed, best times, rejections."""
    return {"launches": {}, "bound": {}, "timed": set(), "times": {}, "rejected": 0,
            "seconds": {"compile": 0.0, "check": 0.0, "time": 0.0}}


def tunables(cfg: dict, keys: SpaceKeys) -> dict:
    """The knobs a neighbour step may turn: not the fixed ones, or a step from one work-group shape
    to the next would change three keys and never count as a neighbour."""
    return {k: v for k, v in cfg.items() if k not in keys.fixed}


def neighbours(cfg: dict, pool: list, keys: SpaceKeys) -> tuple:
    """(siblings, neighbours) of ``cfg`` in ``pool``: siblings share everything but the schedule
    knobs (k unroll, work-group, prefetch), neighbours differ in exactly one other tunable."""
    base = tunables(cfg, keys)
    sib, near = [], []
    for c in pool:
        t = tunables(c, keys)
        if t.keys() != base.keys() or t == base:
            continue
        diff = [k for k in base if t[k] != base[k]]
        if all(k in keys.schedule for k in diff):
            sib.append(c)
        elif len(diff) == 1:
            near.append(c)
    return sib, near


def diverse(ranked: list, keys: SpaceKeys) -> list:
    """``ranked`` reordered so the cheapest config of each block shape (VW x NV on a CPU, MWG x NWG
    on a GPU) comes first, in cost order, then the rest: the seeds then cover shapes the cost
    model ranks close together instead of several variants of its one favourite.
    (Replayed on the PoCL recordings: yolov4 256 from 29 to 34 of 37 shapes within 5%, network
    1.038 -> 1.024; yolov3-tiny 1.000 -> 1.007, one shape at 1.061.)"""
    seen, first, rest = set(), [], []
    for c in ranked:
        shape = tuple(c.get(k) for k in keys.block)
        (rest if shape in seen else first).append(c)
        seen.add(shape)
    return first + rest


def group(cfg: dict, keys: SpaceKeys) -> tuple:
    g = [cfg.get(k) for k in keys.group]
    if g[-1] is None:
        g[-1] = cfg.get("m")
    return tuple(g)


def round_robin(lists: list) -> Iterable:
    for row in itertools.zip_longest(*lists):
        for c in row:
            if c is not None:
                yield c


def guided(cands: list, cost: Callable[[dict], float], measure: Callable[[dict, int], float],
           prefetch: Callable[[list], None], state: dict, budget: int, reps: int, jobs: int,
           expired: Callable[[], bool], keys: SpaceKeys) -> dict:
    """Time at most ``budget`` of ``cands`` (see module doc); {config_key: (ms, config)} of those timed.

    ``prefetch(configs)`` prepares (compiles) candidates ahead into ``state["bound"]``;
    ``measure`` keeps ``state`` (see ``new_state``)."""
    # Keys, costs and neighbourhoods computed once: GPU spaces have ~4500 configs per shape,
    # and recomputing them per step cost more than the timings themselves.
    ids = {id(c): config_key(c) for c in cands}
    costs = {id(c): v for c, v in zip(cands, map(cost, cands))}
    by_cost = lambda c: costs[id(c)]         # noqa: E731
    ranked = sorted(cands, key=by_cost)
    timed: dict = {}
    hoods: dict = {}

    def around(c: dict) -> tuple:
        if ids[id(c)] not in hoods:
            hoods[ids[id(c)]] = neighbours(c, cands, keys)
        return hoods[ids[id(c)]]

    def try_(c: dict) -> None:
        k = ids[id(c)]
        if k in timed or len(state["timed"]) >= budget and k not in state["timed"] or expired():
            return
        timed[k] = (measure(c, reps), c)

    # 1. seeds: the cost model's best per (algorithm, kernel) group, round-robin.
    groups: dict = {}
    for c in ranked:
        groups.setdefault(group(c, keys), []).append(c)
    groups = {g: diverse(cs, keys) for g, cs in groups.items()}
    seeds = list(itertools.islice(round_robin(list(groups.values())), max(1, int(SEED_SHARE * budget))))
    prefetch(seeds)
    for c in seeds:
        try_(c)
    # 2. around the fastest ANCHORS so far: their schedule siblings, then one-tunable neighbours,
    #    cheapest (by cost) first, until the budget is spent.
    for _ in range(budget):
        if len(state["timed"]) >= budget or expired():
            break
        best = sorted((v for v in timed.values() if v[0] < math.inf), key=lambda v: v[0])[:ANCHORS]
        hood = [around(b[1]) for b in best]
        fresh = lambda cs: [c for c in cs if ids[id(c)] not in timed]   # noqa: E731
        nb = fresh(c for sib, _ in hood for c in sib) or fresh(c for _, near in hood for c in near)
        if not nb:
            nb = fresh(ranked)
            if not nb:
                break
        nb = sorted(nb, key=by_cost)
        if ids[id(nb[0])] not in state["bound"]:     # compile the next few ahead, in parallel
            prefetch(nb[:min(jobs, budget - len(state["timed"]))])
        try_(nb[0])
    return timed


def finish(timed: dict, measure: Callable[[dict, int], float]) -> list:
    """Successive halving over the finalists: re-time the best 4 with 3 runs, then the best 2 with
    5; the finalists fastest first ([] if none passed)."""
    ok = sorted((v for v in timed.values() if v[0] < math.inf), key=lambda v: v[0])
    finalists = [c for _, c in ok[:4]]
    for keep, reps in ((4, 3), (2, 5)):
        finalists = finalists[:keep]
        scored = [(measure(c, reps), c) for c in finalists]
        finalists = [c for _, c in sorted(scored, key=lambda v: v[0])]
    return finalists
