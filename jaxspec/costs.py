"""Step costs for the adaptive policy: one step with each candidate K, timed against a plain target
step in the same process, in plain steps (policy.py turns them into the choice of K).

Like an autotuning cache, a measurement is kept for the process and in a file
(paths.cache_dir()/step_costs.json) keyed by device kind, target (name, shapes, dtype), drafter, candidate Ks,
batch size, sampling kind and attention path: later runs on that machine reuse it, so a seeded
sampled run with adaptive K gives the same tokens in every process. generate(step_costs=...) pins
them instead.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from . import paths, rowwise
from .cache import rollback
from .decode.batch import live_slots
from .decode.speculative import spec_step, tree_step
from .drafters.base import Context
from .models import forward
from .policy import arm_length
from .sampling import sample_tokens
from .sharding import to_host
from .tree import Tree

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


def measure_costs(key: tuple, plain_step, spec_step, make_args, ks: tuple, rounds: tuple = (15, 60),
                  budget_s: float = 4.0, thread: tuple = (2, 3)) -> dict:
    """Cost of one step with each candidate K in plain steps, measured once per key (cached).

    make_args() builds the steps' arguments, called only for a new key. plain_step(*args) is a target
    step without a drafter; spec_step(K)(*args) a full step with K drafts (K = 0: plain plus the
    drafter's sync). Both return (the arguments numbered in `thread`, outputs): those (the KV cache
    and the drafter's state) are donated and passed on from call to call, so they are updated in
    place as in the loop. An undonated cache is copied every call: at batch 16 that made K=3 look
    20% cheaper than it ran; an undonated drafter state made EAGLE's K = 0 step cost 1.15 plain
    steps. Each is compiled, then timed in rounds that run the plain step and every K one after
    another; a K's cost is the median over rounds of its time over the same round's plain time, so
    load that drifts on a shared machine hits both. Rounds go on from rounds[0] until budget_s of
    timing or rounds[1]: at batch 1 (30 ms steps) 15 rounds put EAGLE's K = 3 anywhere in
    1.68-1.98 from one measurement to the next, 45 rounds in 1.68-1.81. K = 0, 1 and the largest K
    are measured; K in between is interpolated linearly (drafting and verifying grow about linearly
    in K), which saves a compilation per K. A Tree in ks is measured as it is.
    -> {"costs": float32[len(ks)], "errors": float32[len(ks)] (their standard errors), "plain_seconds":
    float, "seconds": time spent here}."""
    if key in _COSTS:
        return {**_COSTS[key], "seconds": 0.0}
    kept = _load(key)
    if kept is not None:
        _COSTS[key] = kept
        return {**kept, "seconds": 0.0}
    start = time.perf_counter()
    chains = [k for k in ks if not isinstance(k, Tree)]
    ends = sorted({k for k in chains if k <= 1} | ({max(chains)} if chains else set())) + [k for k in ks if isinstance(k, Tree)]
    args = list(make_args())

    def seconds(fn) -> float:
        t = time.perf_counter()
        threaded, out = fn(*args)
        for i, x in zip(thread, threaded):
            args[i] = x
        jax.block_until_ready((threaded, out))
        return time.perf_counter() - t

    plain_fn = jax.jit(plain_step, donate_argnums=thread)
    spec_fns = {k: jax.jit(spec_step(k), donate_argnums=thread) for k in ends}
    for fn in (plain_fn, *spec_fns.values()):
        seconds(fn)                                           # compile and warm up
    plains, ratios = [], {k: [] for k in ends}
    timing = time.perf_counter()
    while len(plains) < rounds[0] or (len(plains) < rounds[1] and time.perf_counter() - timing < budget_s):
        plains.append(seconds(plain_fn))
        for k, fn in spec_fns.items():
            ratios[k].append(seconds(fn) / plains[-1])
    pos = [k for k in ends if not isinstance(k, Tree) and k > 0]
    per_k = lambda timed: np.asarray([timed[k] if k in timed else np.interp(k, pos, [timed[j] for j in pos])
                                      for k in ks], np.float32)
    # standard error of a median: sqrt(pi / 2) times that of a mean
    errors = {k: 1.2533 * float(np.std(r)) / np.sqrt(len(r)) for k, r in ratios.items()}
    _COSTS[key] = {"costs": per_k({k: float(np.median(r)) for k, r in ratios.items()}), "errors": per_k(errors),
                   "plain_seconds": float(np.median(plains))}
    _store(key, _COSTS[key])
    return {**_COSTS[key], "seconds": time.perf_counter() - start}


def clear(disk: bool = False) -> None:
    """Forget every cost measured in this process; disk=True also removes the cost file."""
    _COSTS.clear()
    if disk and os.path.exists(_file()):
        os.remove(_file())


def step_costs(model, drafter, ks, tokens, lengths, cache, sampling, live_attention: bool = False) -> dict:
    """measure_costs for this model, drafter and batch size: one step with each K in ks against
    a plain target step, on a cache filled to the prompt lengths (measured at the first cache size
    seen; the ratios move little with it)."""
    cfg, params = model.config, model.params
    B, P = tokens.shape[0], max(arm_length(k) for k in ks) + 1

    def make_args():                                    # only when this key has not been measured yet
        dparams = drafter.params_for(model)
        features = jnp.zeros((len(drafter.hidden_layers), B, tokens.shape[1], cfg.hidden_size),
                             params["embed"].dtype)
        dstate = drafter.init(dparams, jnp.asarray(tokens), lengths, cache.capacity, features)
        dstate = jax.tree_util.tree_map(jnp.copy, dstate)   # the timing donates it: no buffer shared with the caller
        history = jnp.zeros((B, cache.capacity + P), jnp.int32).at[:, :tokens.shape[1]].set(tokens)
        ctx = Context(rowwise.gather(history, lengths - 1), history, lengths + 1, sampling,
                      jnp.zeros(features.shape[:2] + (P, cfg.hidden_size), features.dtype))
        timed_cache = jax.tree_util.tree_map(jnp.copy, rollback(cache, lengths))   # a copy: the timing donates it
        return params, dparams, timed_cache, dstate, ctx, jax.random.PRNGKey(0)

    # Every output is returned, caches and drafter state included: XLA drops work whose result is
    # unused, which removed the drafter's sync from K = 0 steps and the cache writes from all. The
    # cache and the drafter state (arguments 2 and 3) are donated and passed on; each call first rolls
    # the cache back to the prompts.
    def plain(params, dparams, cache, dstate, ctx, key):
        cache = rollback(cache, ctx.history_len - 1)
        live = live_slots(cache, jnp.zeros((B,), bool), 1, live_attention)
        logits, _, cache = forward(params, ctx.last[:, None], cache, cfg, live=live)
        return (cache, dstate), sample_tokens(key, logits, ctx.sampling)

    def spec(k):
        """The timed step of one arm: a tree step for a Tree, else a chain of k drafts."""
        if isinstance(k, Tree):
            step = functools.partial(tree_step, cfg=cfg, drafter=drafter, tree=k, width=P)
        else:
            live = lambda cache: live_slots(cache, jnp.zeros((B,), bool), k + 1, live_attention)
            step = lambda *args: spec_step(*args, live(args[2]), cfg=cfg, drafter=drafter, num_draft=k, width=P)

        def timed(params, dparams, cache, dstate, ctx, key):
            cache = rollback(cache, ctx.history_len - 1)
            n, emitted, cache, dstate, hidden = step(params, dparams, cache, dstate, ctx, key)
            return (cache, dstate), (n, emitted, hidden)
        return timed

    greedy = bool(np.all(to_host(sampling["temperature"]) == 0))
    device = jax.devices()[0]
    # the target by its shapes and dtype (what a step's time depends on), not a hash of its weights
    placed = getattr(cache.k, "sharding", None)
    mesh = tuple(placed.mesh.shape.items()) if isinstance(placed, jax.sharding.NamedSharding) else None
    key = (device.platform, device.device_kind, model.source, cfg, str(params["embed"].dtype), drafter.static_key(),
           ks, B, greedy, live_attention, mesh)          # one measurement serves every cache size
    return measure_costs(key, plain, spec, make_args, ks)
