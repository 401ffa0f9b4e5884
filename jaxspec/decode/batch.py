"""Input checks and the padded batch: everything generate() settles before any compute."""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from ..cache import KVCache, init_cache
from ..drafters.base import Drafter

# From this batch size on, decode steps attend only over the slots in use (models/llama.attend_live).
# XLA CPU, SmolLM2, one-token step over a 640-slot cache with 200 in use: batch 16 131 -> 86 ms,
# batch 64 571 -> 366 ms; at batch 4 it saved 0-8% and cost up to 6%, with few slots left unused.
LIVE_ATTENTION_MIN_BATCH = 8
# ... and from this cache capacity on at any batch size: batch-1 plain step, the cache nearly full
# (measured, slots 512 / 2048 / 8192): SmolLM2 28 / 48 / - ms over every slot, 30 / 41 / - ms live;
# Gemma 3 270M 48 / 58 / 110 ms, 50 / 51 / 73 ms live (its local layers then skip the blocks older
# than their window).
LIVE_ATTENTION_MIN_SLOTS = 2048


def use_live_attention(batch: int, capacity: int) -> bool:
    """Whether decode steps of `batch` rows over a cache of `capacity` slots attend by attend_live."""
    return batch >= LIVE_ATTENTION_MIN_BATCH or capacity >= LIVE_ATTENTION_MIN_SLOTS


def bucket(n: int, minimum: int = 16) -> int:
    """Next power of two >= n (at least `minimum`): shapes that repeat, so programs are reused."""
    return max(minimum, 1 << (max(n, 1) - 1).bit_length())


def check_prompts(prompts, vocab_size: int) -> list[list[int]]:
    """Token-id lists, each non-empty and inside the vocabulary -> lists of ints."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    rows = []
    for i, p in enumerate(prompts):
        ids = np.asarray(p).reshape(-1) if not isinstance(p, (str, bytes)) else None
        if ids is not None and ids.size == 0:
            raise ValueError(f"prompt {i} is empty: generation needs at least one token")
        if ids is None or ids.dtype.kind not in "iu":
            raise ValueError(f"prompt {i} must be a list of token ids (use model.tokenizer to encode text)")
        if ids.min() < 0 or ids.max() >= vocab_size:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size})")
        rows.append([int(t) for t in ids])
    return rows


def check_limits(max_new_tokens, batch: int) -> np.ndarray:
    """An int or one int per row, each >= 1 -> int32[B]."""
    limits = np.broadcast_to(np.asarray(max_new_tokens), (batch,)) if np.ndim(max_new_tokens) == 0 \
        else np.asarray(max_new_tokens)
    if limits.shape != (batch,) or limits.dtype.kind not in "iu":
        raise ValueError(f"max_new_tokens must be an int or a list of {batch} ints")
    if limits.min() < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {limits.min()}")
    return limits.astype(np.int32)


MAX_DRAFT_TOKENS = 16   # at acceptance 0.9 per token a K = 16 step expects 8.3 tokens, and drafts past it add
                        # less than 0.2 each while every one widens the verify pass


def check_drafter(drafter, num_draft_tokens, model) -> int:
    """A drafter that serves `model` and 1 <= K <= MAX_DRAFT_TOKENS -> K."""
    if not isinstance(drafter, Drafter):
        raise ValueError(f"drafter must be a jaxspec.drafters drafter or None, got {type(drafter).__name__}")
    if isinstance(num_draft_tokens, bool) or int(num_draft_tokens) != num_draft_tokens or num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens (K) must be an integer >= 1, got {num_draft_tokens}")
    if num_draft_tokens > MAX_DRAFT_TOKENS:
        raise ValueError(f"num_draft_tokens (K) = {num_draft_tokens} is more than can pay: a step verifies K + 1 "
                         f"tokens, and past K = {MAX_DRAFT_TOKENS} the last drafts are almost never kept (at "
                         f"acceptance 0.9 per token, K = 16 expects 8.3 tokens a step); use K <= {MAX_DRAFT_TOKENS}")
    drafter.check_target(model)
    return int(num_draft_tokens)


def check_tree(tree, drafter) -> None:
    """generate(tree=...): a jaxspec.Tree, with a drafter that drafts trees."""
    from ..tree import Tree
    if tree is None:
        return
    if not isinstance(tree, Tree):
        raise ValueError(f"tree must be a jaxspec.Tree(budget, depth, top_k), got {type(tree).__name__}")
    if drafter is None or not drafter.drafts_trees:
        who = "no drafter" if drafter is None else type(drafter).__name__
        raise ValueError(f"tree={tree} needs a drafter that drafts token trees; got {who}")


def tree_slots(tree) -> int:
    """Cache slots past the length a tree step may write: the target's N + 1 inputs, a drafter's
    frontier nodes (tree.frontier_inputs: (depth - 1) top_k after last), its chain of depth + 1."""
    return max(tree.budget + 1, (tree.depth - 1) * tree.top_k + 1, tree.depth + 1)


def check_capacity(rows: list, limits: np.ndarray, extra: int, capacity: int) -> None:
    """Refuse, before any compute, a row whose prompt + max_new_tokens + extra (K + 1) cannot fit."""
    for i, r in enumerate(rows):
        if len(r) + int(limits[i]) + extra > capacity:
            raise ValueError(f"prompt {i} ({len(r)} tokens) + max_new_tokens ({int(limits[i])})"
                             + (f" + K+1 ({extra})" if extra else "")
                             + f" exceeds the cache capacity of {capacity} tokens")


def padded_batch(model, rows: list, max_new_tokens: int, extra: int):
    """Prompts right-padded to a length bucket T, and an empty cache of T + N + extra slots (N: the
    output bucket) -> (tokens int32[B, T] (numpy), lengths int32[B], cache, N)."""
    T, N = bucket(max(len(r) for r in rows)), bucket(max_new_tokens)
    tokens = np.zeros((len(rows), T), np.int32)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
    lengths = jnp.asarray([len(r) for r in rows], jnp.int32)
    return tokens, lengths, init_cache(model.config, len(rows), T + N + extra, model.params["embed"].dtype), N


def live_slots(cache: KVCache, done, num_tokens, on: bool):
    """The cache slots a step of num_tokens may read (models.llama.attend_live), or None (all S) when off."""
    return jnp.max(jnp.where(done, 0, cache.length)) + num_tokens if on else None
