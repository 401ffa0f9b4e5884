"""Prompt pools and the mix that draws from them: which prompt the data's j-th example answers.

A pool is a prompt file, optionally restricted to rows of one `kind` ("train-mix.jsonl:code"). A mix
gives each pool a weight; the j-th prompt of a data part comes from the pool picked by the j-th
uniform draw of a seeded generator, and is that pool's next prompt in its own seeded shuffle. Both
sequences only grow with more prompts, so extending the data keeps every earlier choice.
"""
from __future__ import annotations

import os

import numpy as np
from jaxspec import paths

DEFAULT_DIR = paths.prompts_dir()       # $JAXSPEC_PROMPTS, else data/prompts in the repository


def read_prompt_rows(path: str) -> list[dict]:
    """The rows of a JSONL prompt file (each with a "prompt" field)."""
    rows = paths.read_jsonl(path)
    if not rows:
        raise ValueError(f"{path} holds no prompts")
    if any("prompt" not in r for r in rows):
        raise ValueError(f"{path}: every row needs a 'prompt' field")
    return rows


def read_prompt_file(path: str) -> list[str]:
    return [r["prompt"] for r in read_prompt_rows(path)]


def parse_mix(spec: str) -> dict[str, float]:
    """"train.jsonl=0.2,train-mix.jsonl:code=0.4,train-mix.jsonl:chat=0.4" -> {pool: weight} summing to 1.
    A lone pool name needs no weight."""
    mix = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, _, weight = part.partition("=")
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"--mix: weight of {name!r} is not a number: {weight!r}") from None
        if not w > 0:
            raise ValueError(f"--mix: weight of {name!r} must be > 0, got {w}")
        mix[name.strip()] = w
    if not mix:
        raise ValueError("--mix names no prompt pool")
    total = sum(mix.values())
    return {k: round(v / total, 6) for k, v in mix.items()}


def pool_file(pool: str) -> str:
    return pool.partition(":")[0]


def pool_indices(rows: list[dict], pool: str) -> np.ndarray:
    """Row indices of a file's rows that belong to `pool` (all rows, or those of its kind)."""
    kind = pool.partition(":")[2]
    if not kind:
        return np.arange(len(rows))
    idx = np.asarray([i for i, r in enumerate(rows) if r.get("kind") == kind], np.int64)
    if not len(idx):
        raise ValueError(f"prompt pool {pool!r}: no row of kind {kind!r} in {pool_file(pool)}")
    return idx


def pool_orders(mix: dict[str, float], prompts_dir: str, seed: int, heldout: int,
                excluded: dict[str, set]) -> tuple[dict[str, list[int]], dict[str, list[int]], dict[str, list[str]]]:
    """Each pool's shuffled prompt indices (rows of its file), minus `excluded[file]`.

    -> (held-out indices per pool: its first `heldout`; the rest in order per pool; the prompt texts per
    file)."""
    rows, held, order = {}, {}, {}
    for p, pool in enumerate(mix):
        name = pool_file(pool)
        if name not in rows:
            rows[name] = read_prompt_rows(os.path.join(prompts_dir, name))
        idx = pool_indices(rows[name], pool)
        idx = idx[~np.isin(idx, np.fromiter(excluded.get(name, ()), np.int64))]
        idx = idx[np.random.default_rng([seed, p]).permutation(len(idx))].tolist()
        held[pool], order[pool] = idx[:heldout], idx[heldout:]
    return held, order, {name: [r["prompt"] for r in r_] for name, r_ in rows.items()}


def draw_pools(mix: dict[str, float], seed: int, n: int) -> list[str]:
    """The pool of each of the first n prompts: uniform draws against the mix's cumulative weights."""
    names = list(mix)
    edges = np.cumsum([mix[k] for k in names])
    u = np.random.default_rng([seed, 1 << 20]).random(n)
    return [names[min(int(i), len(names) - 1)] for i in np.searchsorted(edges / edges[-1], u, side="right")]


def stream(mix: dict[str, float], order: dict[str, list[int]], seed: int, n: int) -> list[tuple[str, int]]:
    """The first n (pool, prompt index) of a part; a pool that runs out is an error."""
    taken = {k: 0 for k in mix}
    out = []
    for pool in draw_pools(mix, seed, n):
        if taken[pool] >= len(order[pool]):
            raise ValueError(f"prompt pool {pool!r} holds only {len(order[pool])} unused prompts; "
                             f"ask for fewer prompts or give it less weight in --mix")
        out.append((pool, order[pool][taken[pool]]))
        taken[pool] += 1
    return out
