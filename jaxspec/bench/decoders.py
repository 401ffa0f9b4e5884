"""One bench setting (batch size, sampling): every decoder on the same groups of prompts in turn,
speedups over plain decoding of the same run, greedy rows checked against plain decoding's,
and the step costs behind the Leviathan et al. (2023) prediction."""
from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from .inputs import batches


def _aggregate(runs: list) -> dict:
    """Sum token counts and times over batches; acceptance statistics weighted by steps."""
    tokens = sum(st.new_tokens for st in runs)
    seconds = sum(st.wall_seconds for st in runs)
    steps = sum(st.target_steps for st in runs)
    decode_seconds = sum(st.decode_seconds for st in runs)
    agg = {"tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds, "target_steps": steps,
           "prefill_seconds": sum(st.prefill_seconds for st in runs), "decode_seconds": decode_seconds,
           "decode_tokens_per_second": sum(st.decode_tokens for st in runs) / decode_seconds}
    if runs and runs[0].acceptance_rate is not None:
        w = np.array([st.target_steps for st in runs], float)
        agg["mean_accepted_length"] = float(np.dot(w, [st.mean_accepted_length for st in runs]) / w.sum())
        agg["acceptance_rate"] = float(np.dot(w, [st.acceptance_rate for st in runs]) / w.sum())
        agg["per_position_acceptance"] = (w @ np.array([st.per_position_acceptance for st in runs])
                                          / w.sum()).tolist()
    if runs and runs[0].step_costs:                  # adaptive: the costs its policy measured (plain steps)
        agg["step_costs"] = {str(k): c for k, c in runs[0].step_costs.items()}
    if runs and runs[0].steps_per_k:
        agg["steps_per_k"] = {str(k): sum(st.steps_per_k.get(k, 0) for st in runs) for k in runs[0].steps_per_k}
    return agg


def step_cost(model, drafter, arm, group: list, max_new_tokens: int, sampling) -> float:
    """Cost of one step with K drafts (drafting + verifying K+1 tokens) or with a Tree (drafting it,
    verifying its N + 1 inputs), in plain decode steps, timed on the loop generate() runs for this
    batch (jaxspec.generation.measure_step_costs)."""
    from ..generation import measure_step_costs
    return measure_step_costs(model, group, max_new_tokens, drafter, arm, sampling=sampling)


def verify_costs(model, sizes, group: list, max_new_tokens: int) -> dict:
    """{N: cost of one target pass over N + 1 tokens (a tree of N nodes below last) in plain steps},
    timed against a one-token pass on the shapes generate() uses for this batch (measure_costs)."""
    from ..cache import rollback
    from ..costs import measure_costs
    from ..decode.batch import padded_batch
    from ..models import forward

    tokens, lengths, cache, _ = padded_batch(model, group, max_new_tokens, max(sizes) + 1)
    fresh = lambda: jax.tree_util.tree_map(jnp.copy, rollback(cache, lengths))

    def passes(num):
        """A timer: seconds of one pass over num tokens per row (the cache donated, as in the loop)."""
        def one(params, cache):
            return forward(params, jnp.zeros((len(group), num), jnp.int32), cache, model.config)
        run = jax.jit(one, donate_argnums=(1,))
        jax.block_until_ready(run(model.params, fresh()))          # compile and warm up

        def seconds():
            args = (model.params, fresh())
            t = time.perf_counter()
            jax.block_until_ready(run(*args))
            return time.perf_counter() - t
        return seconds

    one = functools.lru_cache(maxsize=None)(lambda: passes(1))     # compiled once, for the first new size

    def timers(n):
        wide = passes(n + 1)
        return one(), lambda i: wide()

    device = jax.devices()[0]
    key = ("verify", device.platform, device.device_kind, model.source, model.config, len(group), cache.capacity)
    return {n: float(measure_costs(key + (n,), functools.partial(timers, n), (n,), rounds=(15, 60),
                                   budget_s=4.0)["costs"][0]) for n in sizes}


MAX_DIFFERENCES = 8      # differing greedy rows whose first difference the bench keeps


def first_difference(plain: list, other: list, prompt: int) -> dict:
    """Where a greedy row first departs from plain decoding's: prompt index, position among the new
    tokens, and each side's token there (None: that row ended before)."""
    pos = next((i for i, (a, b) in enumerate(zip(plain, other)) if a != b), min(len(plain), len(other)))
    at = lambda row: int(row[pos]) if pos < len(row) else None
    return {"prompt": int(prompt), "position": pos, "plain": at(plain), "this": at(other)}


def _speedups(agg: dict, plain: dict) -> dict:
    """Tokens/s of an aggregate over plain's, with and without the prompt pass."""
    return {"speedup": agg["tokens_per_second"] / plain["tokens_per_second"],
            "decode_speedup": agg["decode_tokens_per_second"] / plain["decode_tokens_per_second"]}


def _configs(drafters: dict, ks, adaptive: bool, trees) -> list:
    """(label, drafter, K, adaptive, tree) of every decoder a bench runs, plain first."""
    configs = [("plain", None, 0, False, None)] + [(f"{name} K={k}", d, k, False, None)
                                                   for name, d in drafters.items() for k in ks]
    tree_drafters = {name: d for name, d in drafters.items() if d.drafts_trees}
    configs += [(f"{name} tree N={t.budget}", d, max(ks), False, t) for name, d in tree_drafters.items()
                for t in trees]
    if adaptive:
        configs += [(f"{name} adaptive K<={max(ks)}", d, max(ks), True, None) for name, d in drafters.items()]
        if trees:
            big = max(trees, key=lambda t: t.budget)
            configs += [(f"{name} adaptive K<={max(ks)} +tree N={big.budget}", d, max(ks), True, big)
                        for name, d in tree_drafters.items()]
    return configs


def bench_decoders(model, prompts_ids, max_new_tokens: int, drafters: dict, *, ks, batch: int = 1,
                   sampling=None, adaptive: bool = True, seed: int = 0, progress: bool = True,
                   repeats: int = 1, trees=(), mesh=None) -> dict:
    """Plain decoding, each drafter at each fixed K, each fixed tree (trees: jaxspec.Tree shapes; the
    drafters that draft trees) and (adaptive=True) with adaptive K up to max(ks), and with the largest
    tree offered too, on groups of `batch` prompts (taken in order of length bucket), each group run by
    every decoder in turn. Compiling (and measuring the adaptive policy's costs) runs first on the
    first group and is reported apart.

    repeats > 1 runs everything that many times, the decoders' order rotated by one each time, and
    adds each repeat's speedups ("speedups", "decode_speedups"): the spread is this run's noise.
    Greedy runs also count the rows each decoder made exactly as plain decoding did ("rows_as_plain"
    of "rows"): speculation must not change a token."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    from ..decode.batch import bucket
    from ..generation import generate
    from ..sampling import Sampling

    sampling = sampling or Sampling()
    configs = _configs(drafters, ks, adaptive, trees)
    # one length bucket after another: each decoder compiles a bucket's programs once (generate keeps
    # MAX_PROGRAMS of them; nine decoders on prompts of alternating buckets recompiled in every run)
    index_groups = batches(sorted(range(len(prompts_ids)), key=lambda i: bucket(len(prompts_ids[i]))), batch)
    groups = [[prompts_ids[i] for i in g] for g in index_groups]
    run = lambda group, d, k, ad, t: generate(model, group, max_new_tokens=max_new_tokens, sampling=sampling,
                                              drafter=d, num_draft_tokens=max(k, 1), adaptive=ad, seed=seed, tree=t,
                                              mesh=mesh)
    desc = f"bench: batch {batch}, temperature {sampling.temperature:g}"
    # one generation = one decoder on one group of `batch` prompts; the first of each decoder compiles
    bar = tqdm(total=len(configs) * (repeats * len(groups) + 1), desc=desc, unit="generation", disable=not progress)
    compile_s = {}
    for label, d, k, ad, t in configs:
        bar.set_postfix_str(f"{label} (compiling)")
        first = run(groups[0], d, k, ad, t).stats
        compile_s[label] = first.compile_seconds + first.cost_timing_seconds
        bar.update(1)
    runs = {label: [[] for _ in range(repeats)] for label, *_ in configs}     # [repeat][group] stats
    made = {label: [] for label, *_ in configs}           # each run's rows, in (repeat, group) order
    made_from = []                                        # the prompt index of each of those rows
    for rep in range(repeats):
        order = configs[rep % len(configs):] + configs[:rep % len(configs)]
        for group, indices in zip(groups, index_groups):
            made_from += indices
            for label, d, k, ad, t in order:
                bar.set_postfix_str(label)
                out = run(group, d, k, ad, t)
                runs[label][rep].append(out.stats)
                made[label] += out.tokens
                bar.update(1)
    bar.close()
    result = {}
    for label, d, k, ad, t in configs:
        r = {**_compared(runs[label], runs["plain"]), "compile_seconds": compile_s[label], "K": k, "adaptive": ad,
             "tree": dataclasses.asdict(t) if t is not None else None}
        if sampling.temperature == 0:        # greedy: the same tokens as plain, row by row
            r.update(_rows_as_plain(made[label], made["plain"], made_from))
        if d is not None and not ad:          # Leviathan: tokens per step / cost of a step (plain steps)
            r["step_cost"] = step_cost(model, d, t if t is not None else k, groups[0], max_new_tokens, sampling)
            r["predicted_speedup"] = r["mean_accepted_length"] / r["step_cost"]
            r["measured_over_predicted"] = r["decode_speedup"] / r["predicted_speedup"]   # both after prefill
        result[label] = r
    return result


def _compared(runs: list, plain_runs: list) -> dict:
    """A decoder's aggregate over its runs [repeat][group] with its speedups over plain decoding's
    (and each repeat's, when there are several)."""
    r = _aggregate(sum(runs, []))
    r.update(_speedups(r, _aggregate(sum(plain_runs, []))))
    if len(runs) > 1:
        reps = [_speedups(_aggregate(rep), _aggregate(p)) for rep, p in zip(runs, plain_runs)]
        r["speedups"] = [x["speedup"] for x in reps]
        r["decode_speedups"] = [x["decode_speedup"] for x in reps]
    return r


def _rows_as_plain(made: list, plain: list, made_from: list) -> dict:
    """How many rows equal plain decoding's, and where the first few that do not differ."""
    same = [a == b for a, b in zip(made, plain)]
    return {"rows_as_plain": sum(same), "rows": len(same),
            "differences": [first_difference(plain[i], made[i], made_from[i])
                            for i in np.flatnonzero(~np.array(same, bool))[:MAX_DIFFERENCES]]}


def generate_greedy(model, ids, max_new_tokens: int) -> list:
    from ..generation import generate
    return generate(model, [ids], max_new_tokens=max_new_tokens).tokens[0]
