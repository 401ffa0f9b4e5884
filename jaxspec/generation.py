"""jaxspec.generate: checks, then per shape bucket a compiled prefill program and one compiled
lax.while_loop (decode/plain.py or decode/speculative.py), then the outputs and statistics.

Prompts are right-padded to a power-of-two bucket; padded slots lie beyond each row's length,
so they are masked and later overwritten. Rows stop independently at EOS or their own limit.
"""
from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from . import policy, rowwise, sharding
from .config import ModelConfig
from .costs import step_costs
from .decode.batch import (LIVE_ATTENTION_MIN_BATCH, check_capacity, check_drafter, check_limits, check_prompts,
                           check_tree, padded_batch, tree_slots)
from .decode.plain import autoregressive
from .decode.prefill import prefill
from .decode.programs import compiled
from .decode.speculative import speculative
from .drafters.base import Drafter
from .model import Model
from .sampling import Sampling, SamplingArg, row_params
from .tree import Tree


@dataclasses.dataclass
class Stats:
    wall_seconds: float                    # prefill_seconds + decode_seconds
    tokens_per_second: float               # new_tokens / wall_seconds
    compile_seconds: float
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


@dataclasses.dataclass
class GenerateOutput:
    tokens: list          # list[list[int]]: new tokens per row, EOS kept when produced
    texts: list           # decoded, special tokens skipped
    stats: Stats


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


def _plan(model, drafter, ks, tokens, lengths, cache, params_s, live_attention, pinned):
    """Adaptive: measure the step costs (unless pinned) and apply the gate. -> (drafter or None, costs
    float32[len(ks)], seconds spent measuring, {K: cost} for the stats)."""
    measured = _pinned(pinned, ks) if pinned is not None else \
        step_costs(model, drafter, ks, tokens, lengths, cache, params_s, live_attention)
    costs = sharding.agreed(measured["costs"])
    if not policy.speculation_can_pay(ks, costs, drafter.prior_acceptance, sharding.agreed(measured["errors"])):
        warnings.warn(f"{type(drafter).__name__}: no draft length is expected to pay at these step costs "
                      f"({', '.join(f'K={arm_key(k)}: {c:.2f}' for k, c in zip(ks, costs))} plain steps) and prior "
                      "acceptance; decoding plainly (out.stats.decoded_plainly)", stacklevel=3)
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


def _loop(model, drafter, ks, costs, tokens, lengths, limits, cache, params_s, eos_ids, key, N, live_attention,
          mesh=None):
    """Prefill and the decode loop, each compiled once per shape (and placement). -> (loop result,
    compile s, prefill s, decode s)."""
    cfg = model.config
    hidden_layers = drafter.hidden_layers if drafter is not None else ()
    args = (model.params, tokens, lengths, cache, params_s, key)
    run_prefill, compile_s = compiled(("prefill", cfg, hidden_layers), prefill,
                                      {"cfg": cfg, "hidden_layers": hidden_layers}, args, donate=(3,))
    start = time.perf_counter()
    first, cache, features, key = run_prefill(*args)
    first.block_until_ready()
    prefill_s = time.perf_counter() - start
    if drafter is None:
        args = (model.params, first, limits, cache, params_s, eos_ids, key)
        loop, loop_compile_s = compiled(("autoregressive", cfg, N, live_attention), autoregressive,
                                        {"cfg": cfg, "capacity_out": N, "live_attention": live_attention},
                                        args, donate=(3,))
    else:
        args = (model.params, _drafter_params(drafter, model, mesh), tokens, lengths, limits, cache, params_s, eos_ids, key,
                first, features, jnp.asarray(costs), jnp.asarray(drafter.prior_acceptance, jnp.float32))
        loop, loop_compile_s = compiled(("speculative", cfg, drafter.static_key(), ks, N, live_attention),
                                        speculative, {"cfg": cfg, "drafter": drafter, "ks": ks, "capacity_out": N,
                                                      "live_attention": live_attention}, args, donate=(5,))
    start = time.perf_counter()
    result = jax.block_until_ready(loop(*args))
    return result, compile_s + loop_compile_s, prefill_s, time.perf_counter() - start


def _acceptance(stats: Stats, acc, ks, adaptive: bool) -> None:
    """Fill the acceptance statistics from the loop's AcceptCounts."""
    acc = jax.tree_util.tree_map(sharding.to_host, acc)
    stats.mean_accepted_length = 1.0 + int(acc.accepted) / max(int(acc.steps), 1)
    stats.acceptance_rate = int(acc.accepted) / max(int(acc.drafted), 1)
    stats.per_position_acceptance = (acc.per_position / np.maximum(acc.drafted_per_position, 1)).tolist()
    if adaptive:
        stats.steps_per_k = {arm_key(k): int(c) for k, c in zip(ks, acc.k_steps)}


def generate(model: Model, prompts: Sequence[Sequence[int]], max_new_tokens: Union[int, Sequence[int]] = 128, *,
             sampling: SamplingArg = Sampling(), drafter: Optional[Drafter] = None, num_draft_tokens: int = 5,
             seed: int = 0, max_cache_len: Optional[int] = None, adaptive: bool = True,
             step_costs: Optional[dict] = None, tree: Optional[Tree] = None,
             mesh: Optional[jax.sharding.Mesh] = None) -> GenerateOutput:
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
    "data" and weights over "model" (jaxspec/sharding.py). Returns tokens, texts and stats.
    """
    cfg: ModelConfig = model.config
    K = check_drafter(drafter, num_draft_tokens, model) if drafter is not None else 0
    check_tree(tree, drafter)
    rows = check_prompts(prompts, cfg.vocab_size)
    B = len(rows)
    limits = check_limits(max_new_tokens, B)
    params_s = row_params(sampling, B)
    extra = (K + 1 if drafter is not None else 0) if tree is None else max(K + 1, tree_slots(tree))
    check_capacity(rows, limits, extra, cfg.max_position_embeddings if max_cache_len is None else int(max_cache_len))
    eos_ids = jnp.asarray(list(getattr(model.tokenizer, "eos_token_ids", ()) or ()) or [-1], jnp.int32)
    tokens, lengths, cache, N = padded_batch(model, rows, int(limits.max()), extra)
    tokens, limits, key = jnp.asarray(tokens), jnp.asarray(limits), jax.random.PRNGKey(seed)
    if mesh is not None:                                 # weights over "model", rows over "data"
        model, cache, (tokens, lengths, limits, params_s) = _placed(model, mesh), sharding.shard_cache(cache, mesh), \
            sharding.shard_rows((tokens, lengths, limits, params_s), mesh)
    live_attention = B >= LIVE_ATTENTION_MIN_BATCH
    ks = (policy.candidates(K) if adaptive else (K,)) if drafter is not None else ()
    if tree is not None:
        ks = ks + (tree,) if adaptive else (tree,)
    costs, cost_s, measured, plainly = np.ones((len(ks),), np.float32), 0.0, {}, False
    with rowwise.over_devices(mesh is not None):         # per-row indexing that keeps rows on their devices
        if drafter is not None and adaptive:
            drafter, costs, cost_s, measured = _plan(model, drafter, ks, tokens, lengths, cache, params_s,
                                                     live_attention, step_costs)
            plainly = drafter is None
        result, compile_s, prefill_s, decode_s = _loop(model, drafter, ks, costs, tokens, lengths, limits, cache,
                                                       params_s, eos_ids, key, N, live_attention, mesh)
    out, count = sharding.to_host(result[0]), sharding.to_host(result[1])
    new = [out[i, :count[i]].tolist() for i in range(B)]
    total, wall = int(count.sum()), prefill_s + decode_s
    stats = Stats(wall_seconds=wall, tokens_per_second=total / wall if wall > 0 else float("nan"),
                  compile_seconds=compile_s + cost_s, new_tokens=total, target_steps=int(result[2]),
                  prefill_seconds=prefill_s, decode_seconds=decode_s, decode_tokens=total - B,
                  decode_tokens_per_second=(total - B) / decode_s if decode_s > 0 else float("nan"),
                  step_costs=measured, decoded_plainly=plainly, steps_per_k={0: int(result[2])} if plainly else {},
                  tree=dataclasses.asdict(tree) if tree is not None else None)
    if drafter is not None:
        _acceptance(stats, result[3], ks, adaptive)
    texts = [model.tokenizer.decode(t, skip_special_tokens=True) for t in new] if model.tokenizer is not None \
        else [""] * B
    return GenerateOutput(tokens=new, texts=texts, stats=stats)
