"""What a bench runs on: its prompts, its drafters by name, and what they cost in memory; the
machine's read bandwidth and the target's weight bytes (the decode bound)."""
from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from .. import paths


EVAL_PROMPTS = "eval.jsonl"    # the default prompt file, in paths.prompts_dir()


def read_prompts(path: str | None, limit: int, source: str | None = None) -> list[str]:
    """`limit` prompts spread evenly over a JSONL file with a "prompt" field (default: eval.jsonl in
    paths.prompts_dir()); source: only the rows whose "source" field is this (e.g. gsm8k-test,
    humaneval, vicuna-80). ValueError for a missing file."""
    path = path or paths.prompt_file(EVAL_PROMPTS)
    rows = paths.read_jsonl(path)
    if source:
        found = sorted({r.get("source", "") for r in rows})
        rows = [r for r in rows if r.get("source") == source]
        if not rows:
            raise ValueError(f"--source {source!r}: no prompt of that source in {path} (it has {', '.join(found)})")
    rows = [r["prompt"] for r in rows]
    if limit >= len(rows):
        return rows
    return [rows[i] for i in np.linspace(0, len(rows) - 1, limit).round().astype(int)]  # spread over the file


def read_bandwidth(nbytes: int = 512 * 2**20, repeats: int = 10) -> float:
    """Measured memory read bandwidth in bytes/s: a jitted sum over a large float32 array."""
    x = jnp.ones((nbytes // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        total(x).block_until_ready()
    return nbytes * repeats / (time.perf_counter() - start)


def weight_bytes(params) -> int:
    return int(sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(params)))


def drafter_memory(model, drafter, K: int, prompt_len: int, max_new_tokens: int) -> dict:
    """What a drafter adds at run time, batch 1: its parameters (arrays passed to the compiled loop that
    the target does not own, e.g. a head or a draft model's weights, and the target rows an MTP head
    reads) and its state (caches, buffers) at the capacity generate() allocates for this prompt length."""
    from ..decode.batch import bucket

    target = {id(x) for x in jax.tree_util.tree_leaves(model.params)}
    own = [x for x in jax.tree_util.tree_leaves(drafter.params_for(model)) if id(x) not in target]
    T, E = bucket(prompt_len), model.config.hidden_size
    capacity = T + bucket(max_new_tokens) + K + 1
    feats = jax.ShapeDtypeStruct((len(drafter.hidden_layers), 1, T, E), model.params["embed"].dtype)
    init = lambda params, prompts, lengths, feats: drafter.init(params, prompts, lengths, capacity, feats)
    state = jax.eval_shape(init, drafter.params_for(model), jax.ShapeDtypeStruct((1, T), jnp.int32),
                           jax.ShapeDtypeStruct((1,), jnp.int32), feats)
    return {"parameters": int(sum(x.size for x in own if jnp.issubdtype(x.dtype, jnp.floating))),
            "weight_bytes": int(sum(x.nbytes for x in own)),
            "state_bytes": int(sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state))),
            "capacity": capacity}


def make_drafter(spec: str, model):
    """'ngram' | 'ngram:MAX:MIN' | 'draft:PATH' (a model folder or .gguf) | 'truncated:N' (first N layers)
    | 'eagle:PATH' | 'eagle' | 'mtp:PATH' | 'mtp' | 'draft' ('eagle', 'mtp', 'draft': the heads and the
    distilled draft model shipped for the model, drafters.shipped) | 'suffix' (over the shipped data's
    answers) | 'suffix:DATA' (a `jaxspec train data` folder's) | 'suffix:none' (the request's text only)
    | PATH (a saved head's folder, its kind read from head.json, or a draft model's folder)."""
    from ..drafters import MTP, DraftModel, Eagle, NGram, Suffix, shipped, truncated

    name, _, arg = spec.partition(":")
    if name == "ngram":
        return NGram(*(int(x) for x in arg.split(":"))) if arg else NGram()
    if name == "suffix":
        return Suffix() if arg == "none" else Suffix.from_data(arg) if arg else shipped(model, "suffix")
    if name == "truncated" and arg:
        return DraftModel(truncated(model, int(arg)))
    loaders = {"eagle": Eagle.load, "mtp": MTP.load, "draft": DraftModel.load}
    if name in loaders:
        return loaders[name](arg) if arg else shipped(model, name)
    if os.path.isdir(spec):                       # a saved head's or draft model's folder
        from ..heads.io import META
        kind = json.load(open(os.path.join(spec, META))).get("kind") if os.path.isfile(os.path.join(spec, META)) \
            else "draft"
        return loaders[kind](spec)
    if os.sep in spec or spec.startswith(".") or os.path.splitext(spec)[1]:
        raise ValueError(f"drafter folder not found: {spec}")
    raise ValueError(f"unknown drafter {spec!r}: use ngram, ngram:MAX:MIN, draft, draft:PATH, "
                     f"truncated:N, eagle, eagle:PATH, mtp, mtp:PATH, suffix, suffix:DATA or a head's folder")


def batches(prompts_ids: list, batch: int) -> list:
    """Consecutive groups of `batch` prompts; prompts repeat (cycled) to fill the last or only group."""
    n = max(1, -(-len(prompts_ids) // batch))
    return [[prompts_ids[(g * batch + i) % len(prompts_ids)] for i in range(batch)] for g in range(n)]
