"""jaxspec.generate: checks, then per shape bucket a compiled prefill program and one compiled
lax.while_loop (decode/plain.py or decode/speculative.py), then the outputs and statistics.

Prompts are right-padded to a power-of-two bucket; padded slots lie beyond each row's length,
so they are masked and later overwritten. Rows stop independently at EOS or their own limit.
"""
from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from typing import NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from . import policy, rowwise, sharding, streaming
from .cache import KVCache
from .config import ModelConfig
from .costs import cost_key, measure_costs, per_step
from .decode.batch import (check_capacity, check_drafter, check_limits, check_prompts,
                           check_tree, padded_batch, tree_slots, use_live_attention)
from .decode.plain import autoregressive
from .decode.prefill import prefill
from .decode.programs import compiled
from .decode.speculative import speculative
from .drafters.base import Drafter
from .model import Model
from .sampling import Sampling, SamplingArg, row_params
from .streaming import NO_STREAM, OnTokens
from .tree import Tree


NO_LIMIT = 1 << 30          # max_steps of a loop that runs until every row is done
TIMED_STEPS = 4             # steps per timed call of the plain loop or the speculative loop forced to one arm


@dataclasses.dataclass
class Stats:
    wall_seconds: float                    # prefill_seconds + decode_seconds
    tokens_per_second: float               # new_tokens / wall_seconds
    compile_seconds: float                 # compiling the programs this call ran first (0 once compiled)
    new_tokens: int
    target_steps: int                      # target forward passes after prefill, summed over the loop
    mean_accepted_length: float = 1.0      # 1 + accepted / steps (counts the bonus token)
    acceptance_rate: Optional[float] = None
    per_position_acceptance: list = dataclasses.field(default_factory=list)  # kept / drafted, per position
    steps_per_k: dict = dataclasses.field(default_factory=dict)  # adaptive: loop steps that used each K ("tree": the tree)
    step_costs: dict = dataclasses.field(default_factory=dict)   # adaptive: K or "tree" -> measured cost, plain steps
    prefill_seconds: float = 0.0           # the prompts' pass, up to the first token of every row
    decode_seconds: float = 0.0            # the loop after it
    decode_tokens: int = 0                 # the tokens it made: new_tokens less each row's first
    decode_tokens_per_second: float = float("nan")   # decode_tokens / decode_seconds
    decoded_plainly: bool = False          # adaptive: a drafter was given but no K was expected to pay
    tree: Optional[dict] = None            # generate(tree=...): the shape offered (budget, depth, top_k)
    cost_timing_seconds: float = 0.0       # adaptive: timing the arms' step costs (0 once kept, costs.py)
    first_token_seconds: float = 0.0       # from the call to the first token on the host, compiling included
    note: str = ""                         # adaptive: why it never drafted, when it did not


@dataclasses.dataclass
class GenerateOutput:
    tokens: list          # list[list[int]]: new tokens per row, EOS kept when produced
    texts: list           # decoded, special tokens skipped
    stats: Stats


def arms_text(ks) -> str:
    """The arms in words: "K=0,2,5", "K=5", "K=0,2,5 and a 32-node tree"."""
    chains = [str(k) for k in ks if not isinstance(k, Tree)]
    trees = [f"a {t.budget}-node tree" for t in ks if isinstance(t, Tree)]
    return " and ".join(([f"K={','.join(chains)}"] if chains else []) + trees)


def arm_key(arm):
    """How stats and step_costs name an arm: its K, or "tree"."""
    return "tree" if isinstance(arm, Tree) else int(arm)


def _pinned(pinned: dict, ks: tuple) -> dict:
    """generate(step_costs=...) as measure_costs' result; ValueError unless it gives every arm in ks."""
    pinned = {(k if k == "tree" else int(k)): v for k, v in pinned.items()}   # keys may be strings (JSON)
    ks = [arm_key(arm) for arm in ks]
    missing = [k for k in ks if k not in pinned]
    if missing:
        raise ValueError(f"step_costs must give the cost of every candidate K {list(ks)} (in plain steps); "
                         f"missing {missing}")
    if any(not float(pinned[k]) > 0 for k in ks):
        raise ValueError(f"step_costs must be positive, got {pinned}")
    costs = np.asarray([float(pinned[k]) for k in ks], np.float32)
    return {"costs": costs, "errors": np.zeros_like(costs), "seconds": 0.0}


class Batch(NamedTuple):
    """One call's inputs on the device(s), and the shapes its programs are compiled for."""

    tokens: jax.Array       # int32[B, T]: prompts, right-padded
    lengths: jax.Array      # int32[B]
    limits: jax.Array       # int32[B]: max new tokens per row
    cache: KVCache          # empty, T + N + extra slots
    sampling: dict          # per-row sampling arrays [B]
    eos_ids: jax.Array      # int32[*]
    N: int                  # the output bucket
    live_attention: bool


def step_costs(model, drafter, ks, batch: Batch, make_timers) -> dict:
    """costs.measure_costs for this model, drafter, arms and batch (make_timers: see _timers)."""
    greedy = bool(np.all(sharding.to_host(batch.sampling["temperature"]) == 0))
    key = cost_key(model, drafter, ks, batch.tokens.shape[0], greedy, batch.live_attention, batch.cache)
    return measure_costs(key, make_timers, ks, what=f"timing {type(drafter).__name__}'s steps {arms_text(ks)} "
                         f"against plain steps")


def _plan(model, drafter, ks, batch: Batch, pinned, make_timers):
    """Adaptive: the step costs (pinned, kept, or timed now) and the gate. -> (drafter or None, costs
    float32[len(ks)], seconds spent timing, {K: cost} for the stats)."""
    measured = _pinned(pinned, ks) if pinned is not None else step_costs(model, drafter, ks, batch, make_timers)
    costs = sharding.agreed(measured["costs"])
    if not policy.speculation_can_pay(ks, costs, drafter.prior_acceptance, sharding.agreed(measured["errors"])):
        warnings.warn(f"{type(drafter).__name__}: no draft length is expected to pay: "
                      f"{policy.why_plain(ks, costs, drafter.prior_acceptance)}; decoding plainly "
                      "(out.stats.decoded_plainly)", stacklevel=5)
        drafter = None
    return drafter, costs, measured["seconds"], {arm_key(k): float(c) for k, c in zip(ks, costs)}


def _placed(model, mesh):
    """The model with its weights placed on the mesh (sharding.shard_params), kept while it lives."""
    if mesh is None:
        return model
    key = (id(model), mesh)
    if key not in _PLACED or _PLACED[key][0] is not model:
        _PLACED.clear()                                  # one placed model at a time: its weights are big
        _PLACED[key] = (model, dataclasses.replace(model, params=sharding.shard_params(model.params, mesh)))
    return _PLACED[key][1]


_PLACED: dict = {}


def _drafter_params(drafter, model, mesh):
    params = drafter.params_for(model)
    return params if mesh is None else sharding.shard_params(params, mesh)


class Programs:
    """The compiled programs of one call, each compiled when first wanted (programs.compiled keeps
    them for later calls): the prompts' pass, the plain loop, the speculative loop of the arms ks."""

    def __init__(self, model, drafter, ks, batch: Batch, mesh, stream_id: int = NO_STREAM):
        self.model, self.drafter, self.ks, self.batch, self.mesh = model, drafter, ks, batch, mesh
        self.stream_id, self.compile_s = stream_id, 0.0

    def _compiled(self, tag, fn, static, args, donate, what):
        exe, seconds = compiled(tag, fn, static, args, donate, f"{what} for batch {self.batch.tokens.shape[0]}")
        self.compile_s += seconds
        return exe

    def prefill(self, key):
        """-> (first int32[B], cache, features, key, seconds): the prompts' pass, run."""
        cfg, b = self.model.config, self.batch
        hidden_layers = self.drafter.hidden_layers if self.drafter is not None else ()
        args = (self.model.params, b.tokens, b.lengths, b.cache, b.sampling, key)
        run = self._compiled(("prefill", cfg, hidden_layers), prefill, {"cfg": cfg, "hidden_layers": hidden_layers},
                             args, (3,), f"the prompts' pass ({b.tokens.shape[1]} tokens)")
        start = time.perf_counter()
        first, cache, features, key = jax.block_until_ready(run(*args))
        return first, cache, features, key, time.perf_counter() - start

    def _ends(self, endless: bool):
        """(limits, eos_ids): the call's, or (endless: cost timing) ones no row reaches."""
        b = self.batch
        return (jnp.maximum(b.limits, NO_LIMIT), jnp.full_like(b.eos_ids, -1)) if endless else (b.limits, b.eos_ids)

    @property
    def streams(self) -> bool:
        return self.stream_id != NO_STREAM

    def plain_args(self, first, cache, key, max_steps=NO_LIMIT, endless=False):
        limits, eos_ids = self._ends(endless)
        return (self.model.params, first, limits, cache, self.batch.sampling, eos_ids, key, jnp.int32(max_steps),
                jnp.int32(NO_STREAM if endless else self.stream_id))

    def plain(self, args):
        cfg, b = self.model.config, self.batch
        return self._compiled(("autoregressive", cfg, b.N, b.live_attention, self.streams), autoregressive,
                              {"cfg": cfg, "capacity_out": b.N, "live_attention": b.live_attention,
                               "stream": self.streams}, args, (3,), "plain decoding")

    def spec_args(self, first, cache, features, key, costs, force=-1, max_steps=NO_LIMIT, endless=False, sync=True):
        b, d = self.batch, self.drafter
        limits, eos_ids = self._ends(endless)
        return (self.model.params, _drafter_params(d, self.model, self.mesh), b.tokens, b.lengths, limits, cache,
                b.sampling, eos_ids, key, first, features, jnp.asarray(costs, jnp.float32),
                jnp.asarray(d.prior_acceptance, jnp.float32), jnp.int32(force), jnp.bool_(sync), jnp.int32(max_steps),
                jnp.int32(NO_STREAM if endless else self.stream_id))

    def spec(self, args):
        cfg, b, d = self.model.config, self.batch, self.drafter
        return self._compiled(("speculative", cfg, d.static_key(), self.ks, b.N, b.live_attention, self.streams),
                              speculative, {"cfg": cfg, "drafter": d, "ks": self.ks, "capacity_out": b.N,
                                            "live_attention": b.live_attention, "stream": self.streams},
                              args, (5,), f"{type(d).__name__} {arms_text(self.ks)}")


def _timers(progs: Programs, first, cache, features, key):
    """make_timers for costs.measure_costs, on the programs the call runs: the speculative loop forced
    to each arm, against plain steps: its K = 0 arm without the drafter's sync where ks has one (the
    loop around the step differs from the plain loop's by under 1%, docs/usage.md), else the plain
    loop. From the prompts' pass, on copies of its cache (each call donates one), with no row
    finishing early (no EOS, no limit) and no more steps than the cache holds."""
    ks, width = progs.ks, max(policy.arm_length(arm) for arm in progs.ks) + 1
    ones, copy = np.ones(len(ks)), lambda: jax.tree_util.tree_map(jnp.copy, cache)

    def make_timers():
        spec = progs.spec(progs.spec_args(first, cache, features, key, ones, endless=True))
        arm = lambda i, sync=True: lambda n: functools.partial(
            spec, *progs.spec_args(first, copy(), features, key, ones, i, n, True, sync))
        if 0 in ks:
            plain_call = arm(ks.index(0), sync=False)
        else:
            plain = progs.plain(progs.plain_args(first, cache, key, endless=True))
            plain_call = lambda n: functools.partial(plain, *progs.plain_args(first, copy(), key, n, True))
        steps = max(1, min(TIMED_STEPS, progs.batch.N // width))
        timers = [per_step(plain_call, steps)] + [per_step(arm(i), steps) for i in range(len(ks))]
        for timer in timers:                               # warm up
            timer()
        return timers[0], lambda i: timers[i + 1]()
    return make_timers


class Ran(NamedTuple):
    """What _loop did."""

    result: tuple             # the loop's outputs
    prefill_s: float
    decode_s: float
    cost_s: float             # timing step costs
    first_s: float            # from the call to the first token on the host
    costs: np.ndarray         # float32[len(ks)]: the step costs the policy used
    measured: dict            # {K: cost}, for the stats
    plainly: bool             # adaptive, decoded plainly: no K was expected to pay


def _loop(progs: Programs, adaptive: bool, pinned, key, started: float) -> Ran:
    """Prefill, the step costs (adaptive), then the plain or the speculative loop run to the end."""
    drafter, ks = progs.drafter, progs.ks
    first, cache, features, key, prefill_s = progs.prefill(key)
    first_s = time.perf_counter() - started
    if progs.streams:
        streaming.deliver(progs.stream_id, [[t] for t in sharding.to_host(first).tolist()])
    costs, cost_s, measured = np.ones((len(ks),), np.float32), 0.0, {}
    if drafter is not None and adaptive:
        drafter, costs, cost_s, measured = _plan(progs.model, drafter, ks, progs.batch, pinned,
                                                 _timers(progs, first, cache, features, key))
    if drafter is None:
        args = progs.plain_args(first, cache, key)
        loop = progs.plain(args)
    else:
        args = progs.spec_args(first, cache, features, key, costs)
        loop = progs.spec(args)
    start = time.perf_counter()
    result = jax.block_until_ready(loop(*args))
    return Ran(result, prefill_s, time.perf_counter() - start, cost_s, first_s, costs, measured,
               progs.drafter is not None and drafter is None)


def _acceptance(stats: Stats, acc, ks, adaptive: bool) -> None:
    """Fill the acceptance statistics from the loop's AcceptCounts."""
    acc = jax.tree_util.tree_map(sharding.to_host, acc)
    stats.mean_accepted_length = 1.0 + int(acc.accepted) / max(int(acc.steps), 1)
    stats.acceptance_rate = int(acc.accepted) / max(int(acc.drafted), 1)
    stats.per_position_acceptance = (acc.per_position / np.maximum(acc.drafted_per_position, 1)).tolist()
    if adaptive:
        stats.steps_per_k = {arm_key(k): int(c) for k, c in zip(ks, acc.k_steps)}


class Request(NamedTuple):
    """One call's arguments, as generate takes them (its docstring says what each means)."""

    prompts: Sequence[Sequence[int]]
    max_new_tokens: Union[int, Sequence[int]]
    sampling: SamplingArg
    drafter: Optional[Drafter]
    num_draft_tokens: int
    adaptive: bool
    tree: Optional[Tree]
    max_cache_len: Optional[int] = None
    mesh: Optional[jax.sharding.Mesh] = None
    seed: int = 0


def _prepare(model, req: Request):
    """Checks, then the batch on its device(s). -> (model (placed on the mesh), Batch, arms ks, PRNG key)."""
    cfg: ModelConfig = model.config
    drafter, tree, mesh = req.drafter, req.tree, req.mesh
    K = check_drafter(drafter, req.num_draft_tokens, model) if drafter is not None else 0
    check_tree(tree, drafter)
    rows = check_prompts(req.prompts, cfg.vocab_size)
    B = len(rows)
    limits = check_limits(req.max_new_tokens, B)
    params_s = row_params(req.sampling, B)
    extra = (K + 1 if drafter is not None else 0) if tree is None else max(K + 1, tree_slots(tree))
    check_capacity(rows, limits, extra,
                   cfg.max_position_embeddings if req.max_cache_len is None else int(req.max_cache_len))
    eos_ids = jnp.asarray(list(getattr(model.tokenizer, "eos_token_ids", ()) or ()) or [-1], jnp.int32)
    tokens, lengths, cache, N = padded_batch(model, rows, int(limits.max()), extra)
    tokens, limits = jnp.asarray(tokens), jnp.asarray(limits)
    if mesh is not None:                                 # weights over "model", rows over "data"
        model, cache, (tokens, lengths, limits, params_s) = _placed(model, mesh), sharding.shard_cache(cache, mesh), \
            sharding.shard_rows((tokens, lengths, limits, params_s), mesh)
    ks = (policy.candidates(K) if req.adaptive else (K,)) if drafter is not None else ()
    if tree is not None:
        ks = ks + (tree,) if req.adaptive else (tree,)
    batch = Batch(tokens, lengths, limits, cache, params_s, eos_ids, N, use_live_attention(B, cache.capacity))
    return model, batch, ks, jax.random.PRNGKey(req.seed)


def measure_step_costs(model: Model, prompts, max_new_tokens: int, drafter: Drafter, arm, *,
                       sampling: SamplingArg = Sampling()) -> float:
    """The cost of a step of one arm (a K, or a Tree) in plain steps, timed (or read from the cost
    file) on the programs generate(adaptive=False) runs for these prompts."""
    tree, K = (arm, arm.depth) if isinstance(arm, Tree) else (None, int(arm))
    model, batch, ks, key = _prepare(model, Request(prompts, max_new_tokens, sampling, drafter, K, False, tree))
    progs = Programs(model, drafter, ks, batch, None)
    first, cache, features, key, _ = progs.prefill(key)
    return float(step_costs(model, drafter, ks, batch, _timers(progs, first, cache, features, key))["costs"][0])


def generate(model: Model, prompts: Sequence[Sequence[int]], max_new_tokens: Union[int, Sequence[int]] = 128, *,
             sampling: SamplingArg = Sampling(), drafter: Optional[Drafter] = None, num_draft_tokens: int = 5,
             seed: int = 0, max_cache_len: Optional[int] = None, adaptive: bool = True,
             step_costs: Optional[dict] = None, tree: Optional[Tree] = None,
             mesh: Optional[jax.sharding.Mesh] = None, stream: Optional[OnTokens] = None) -> GenerateOutput:
    """Generate up to max_new_tokens per prompt (token-id lists) with the target `model`.

    drafter=None is plain autoregressive decoding; with a drafter every step proposes up to
    num_draft_tokens (K) tokens that one target pass verifies (lossless rejection sampling).
    adaptive=True (jaxspec/policy.py) picks each step's K in policy.candidates(K), 0 (a plain step)
    included, from running acceptance estimates and step costs measured on first use for this
    batch size; when neither the drafter's prior acceptance makes some K pay nor waiting at K = 0 is
    about as cheap as a plain step (policy.speculation_can_pay), it decodes plainly and says so (a
    warning, stats.decoded_plainly). Measured costs are kept in a file and reused by later runs on
    the machine (jaxspec/costs.py), so seeded runs repeat; step_costs={K: cost in plain steps} for
    every K in policy.candidates(K) pins them instead (out.stats.step_costs of an earlier run).
    adaptive=False: K fixed. tree=jaxspec.Tree(budget, depth, top_k): the drafter may also draft a
    token tree, verified in one pass (jaxspec/tree.py); adaptive, the policy weighs it against the
    chains at its measured cost; adaptive=False, every step is a tree step. mesh: a jax.sharding.Mesh
    with axes ("data", "model") (jaxspec.sharding.make_mesh): the same loops run sharded, rows over
    "data" and weights over "model" (jaxspec/sharding.py). stream: a function called while the loop
    runs with each target pass's new tokens, one list per row ([] where a row got none), first with
    the prompts' pass's token (jaxspec/streaming.py; the loop then sends every step to the host).
    Returns tokens, texts and stats.
    """
    started = time.perf_counter()
    model, batch, ks, key = _prepare(model, Request(prompts, max_new_tokens, sampling, drafter, num_draft_tokens,
                                                    adaptive, tree, max_cache_len, mesh, seed))
    B = batch.tokens.shape[0]
    with streaming.opened(stream) as stream_id, rowwise.over_devices(mesh is not None):   # rows stay on their devices
        progs = Programs(model, drafter, ks, batch, mesh, stream_id)
        ran = _loop(progs, adaptive, step_costs, key, started)
    result = ran.result
    out, count = sharding.to_host(result[0]), sharding.to_host(result[1])
    new = [out[i, :count[i]].tolist() for i in range(B)]
    total, wall = int(count.sum()), ran.prefill_s + ran.decode_s
    stats = Stats(wall_seconds=wall, tokens_per_second=total / wall if wall > 0 else float("nan"),
                  compile_seconds=progs.compile_s, cost_timing_seconds=ran.cost_s, new_tokens=total,
                  target_steps=int(result[2]), prefill_seconds=ran.prefill_s, decode_seconds=ran.decode_s,
                  decode_tokens=total - B, first_token_seconds=ran.first_s,
                  decode_tokens_per_second=(total - B) / ran.decode_s if ran.decode_s > 0 else float("nan"),
                  step_costs=ran.measured, decoded_plainly=ran.plainly,
                  steps_per_k={0: int(result[2])} if ran.plainly else {},
                  tree=dataclasses.asdict(tree) if tree is not None else None)
    if drafter is not None and not ran.plainly:
        _acceptance(stats, result[3], ks, adaptive)
    if drafter is not None and adaptive and (ran.plainly or not any(n for k, n in stats.steps_per_k.items() if k)):
        stats.note = ("decoded plainly" if ran.plainly else "never drafted: the policy kept K = 0") + "; " + \
            policy.why_plain(ks, ran.costs, drafter.prior_acceptance)
    texts = [model.tokenizer.decode(t, skip_special_tokens=True) for t in new] if model.tokenizer is not None \
        else [""] * B
    return GenerateOutput(tokens=new, texts=texts, stats=stats)
