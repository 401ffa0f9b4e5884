"""Step costs for the adaptive policy: steps with each arm (a K, or a tree), timed against plain
target steps in the same process, in plain steps (policy.py turns them into the choice of K). The
timing runs the program the generation itself runs (generation.py: the speculative loop with its arm
forced and a step limit; plain steps are its K = 0 arm with the drafter's sync off, or the plain loop
when a fixed K has no K = 0 arm), so it compiles nothing of its own, and
a step's cost includes what the loop does around it (the policy's choice, the drafter's bookkeeping).

Like an autotuning cache, a measurement is kept for the process and in a file
(paths.cache_dir()/step_costs.json) keyed by device kind, target (name, shapes, dtype), drafter, candidate Ks,
batch size, sampling kind and attention path: later runs on that machine reuse it, so a seeded
sampled run with adaptive K gives the same tokens in every process. generate(step_costs=...) pins
them instead.
"""
from __future__ import annotations

import hashlib
import json
import os
import time

import jax
import numpy as np

from . import paths
from .status import working

_COSTS: dict = {}     # key -> measured costs, for the life of the process
COSTS_FILE = "step_costs.json"


def _file() -> str:
    return os.path.join(paths.cache_dir(), COSTS_FILE)


def _read_file() -> dict:
    try:
        with open(_file()) as f:
            return json.load(f)
    except (OSError, ValueError):       # none yet, or unreadable: measure again
        return {}


def _disk_key(key: tuple) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()[:20]


def _load(key: tuple) -> dict | None:
    entry = _read_file().get(_disk_key(key))
    if entry is None:
        return None
    return {"costs": np.asarray(entry["costs"], np.float32), "errors": np.asarray(entry["errors"], np.float32),
            "plain_seconds": float(entry["plain_seconds"])}


def _store(key: tuple, value: dict) -> None:
    """Add one measurement to the cost file (written whole to a temporary file, then renamed)."""
    table = _read_file()
    table[_disk_key(key)] = {"key": repr(key)[:500], "costs": [float(c) for c in value["costs"]],
                             "errors": [float(e) for e in value["errors"]], "plain_seconds": value["plain_seconds"]}
    try:
        os.makedirs(paths.cache_dir(), exist_ok=True)
        tmp = f"{_file()}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(table, f, indent=1)
        os.replace(tmp, _file())
    except OSError as e:                # a read-only home: the process cache still serves
        import warnings
        warnings.warn(f"could not keep step costs in {_file()}: {e}", stacklevel=3)


def measure_costs(key: tuple, make_timers, ks: tuple, rounds: tuple = (3, 12), budget_s: float = 2.0,
                  what: str = "timing step costs") -> dict:
    """Cost of a step of each arm in ks in plain steps, measured once per key (cached).

    make_timers() -> (plain, arm), called only for a new key: plain() runs plain steps and returns the
    seconds one took; arm(i) the same for the arm ks[i]. Both run programs already compiled, and give
    up (donate) the KV cache they write, as the loop does: an undonated cache was copied every call
    (at batch 16 that made K = 3 look 20% cheaper than it ran). They are timed in rounds that run the
    plain steps and every arm one after another; an arm's cost is the median over rounds of its time
    over the same round's plain time, so load that drifts on a shared machine hits both. Rounds go on
    from rounds[0] until budget_s of timing or rounds[1].
    -> {"costs": float32[len(ks)], "errors": float32[len(ks)] (their standard errors), "plain_seconds":
    float, "seconds": time spent timing (make_timers' compiles not included)}."""
    if key in _COSTS:
        return {**_COSTS[key], "seconds": 0.0}
    kept = _load(key)
    if kept is not None:
        _COSTS[key] = kept
        return {**kept, "seconds": 0.0}
    plain, arm = make_timers()
    start = time.perf_counter()
    plains, ratios = [], [[] for _ in ks]
    with working(what, f"kept in {_file()}"):
        while len(plains) < rounds[0] or (len(plains) < rounds[1] and time.perf_counter() - start < budget_s):
            plains.append(plain())
            for i, r in enumerate(ratios):
                r.append(arm(i) / plains[-1])
    # standard error of a median: sqrt(pi / 2) times that of a mean
    _COSTS[key] = {"costs": np.asarray([np.median(r) for r in ratios], np.float32),
                   "errors": np.asarray([1.2533 * np.std(r) / np.sqrt(len(r)) for r in ratios], np.float32),
                   "plain_seconds": float(np.median(plains))}
    _store(key, _COSTS[key])
    return {**_COSTS[key], "seconds": time.perf_counter() - start}


def per_step(prepare, steps: int):
    """A timer for measure_costs: prepare(n) -> a call that runs a compiled loop for n steps (its
    arguments, a fresh cache among them, made before the clock starts). -> a function that times one
    call of `steps` steps and returns the seconds per step. The loop's entry and exit are counted in
    (a drafter's set-up over the prompt: not measured apart, one pass of a head against 4 target
    steps)."""
    def seconds() -> float:
        call = prepare(steps)
        t = time.perf_counter()
        jax.block_until_ready(call())
        return (time.perf_counter() - t) / steps
    return seconds


def clear(disk: bool = False) -> None:
    """Forget every cost measured in this process; disk=True also removes the cost file."""
    _COSTS.clear()
    if disk and os.path.exists(_file()):
        os.remove(_file())


def cost_key(model, drafter, ks, batch: int, greedy: bool, live_attention: bool, cache) -> tuple:
    """What a step's cost depends on: device, the target by its shapes and dtype (not a hash of its
    weights), drafter, arms, batch size, sampling kind, attention path and mesh; one measurement
    serves every cache size."""
    device = jax.devices()[0]
    placed = getattr(cache.k, "sharding", None)
    mesh = tuple(placed.mesh.shape.items()) if isinstance(placed, jax.sharding.NamedSharding) else None
    return ("loop-timed", device.platform, device.device_kind, model.source, model.config, str(model.params["embed"].dtype),
            drafter.static_key(), tuple(ks), batch, greedy, live_attention, mesh)
