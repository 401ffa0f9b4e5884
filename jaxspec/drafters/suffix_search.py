"""Suffix-array search under `jit`: the longest suffix of a row's history found in a store, and the
most frequent continuation of it (SuffixDecoding, Oliaro et al. 2024: the walk down a suffix tree
along its most frequent children, here on a suffix array, where the suffixes below a match are one
contiguous range sorted by what follows it). One row at a time; vmap over rows.

Shapes: S history slots, L = max_match, M store capacity, K drafts.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from .suffix_store import SEP

SAMPLES = 16        # suffixes read to find a range's most frequent next token (all of them in a smaller range)


class Match(NamedTuple):
    """A row's draft from one source: length int32 (0: no match), count int32 (occurrences of the match),
    tokens int32[K], probs float32[K] (each token's frequency among the continuations that agree with
    the drafts before it; 0 where there is no continuation)."""

    length: jax.Array
    count: jax.Array
    tokens: jax.Array
    probs: jax.Array


def _iterations(n: int) -> int:
    return max(int(n).bit_length(), 1) + 1


def first_true(pred, lo: jax.Array, hi: jax.Array, iterations: int) -> jax.Array:
    """The first i in [lo, hi) where the monotone pred(i) (False ... True) holds; hi when none."""
    def halve(_, bounds):
        lo, hi = bounds
        mid = (lo + hi) // 2
        right = (lo < hi) & ~pred(mid)
        return jnp.where(right, mid + 1, lo), jnp.where((lo < hi) & ~right, mid, hi)

    return jax.lax.fori_loop(0, iterations, halve, (lo, hi))[0]


def _order(tokens, sa, count, pattern, n):
    """(lo, hi): the range of suffix-array entries whose first n tokens are pattern[:n] (int32[L])."""
    L = pattern.shape[0]
    live = jnp.arange(L) < n

    def sign(i):                                   # store suffix sa[i] against the pattern: -1, 0, 1
        s = tokens[sa[jnp.clip(i, 0, sa.shape[0] - 1)] + jnp.arange(L)]
        differ = (s != pattern) & live
        j = jnp.argmax(differ)
        return jnp.where(differ[j], jnp.sign(s[j] - pattern[j]), 0)

    it = _iterations(sa.shape[0])
    lo = first_true(lambda i: sign(i) >= 0, jnp.int32(0), count, it)
    hi = first_true(lambda i: sign(i) > 0, lo, count, it)
    return lo, hi


def longest_match(tokens, sa, count, history, length, max_match: int):
    """The longest suffix of history[:length] (at most max_match tokens) found in the store
    -> (n int32, lo, hi: its suffix-array range); n = 0 and an empty range when none."""
    n = jnp.arange(1, max_match + 1)
    S = history.shape[0]
    # pattern of length n: history[length - n : length], left-aligned in L slots
    idx = length - n[:, None] + jnp.arange(max_match)[None]
    patterns = history[jnp.clip(idx, 0, S - 1)]
    lo, hi = jax.vmap(lambda p, k: _order(tokens, sa, count, p, k))(patterns, n)
    found = (hi > lo) & (n <= length)
    best = jnp.max(jnp.where(found, n, 0))
    pick = jnp.maximum(best - 1, 0)
    return best, jnp.where(best > 0, lo[pick], 0), jnp.where(best > 0, hi[pick], 0)


def _samples(tokens, sa, lo, hi, offset):
    """Tokens at `offset` of SAMPLES suffixes spread evenly over [lo, hi) (all of a smaller range)
    -> (tokens int32[SAMPLES], counted bool[SAMPLES]: a real sample, not an answer's end)."""
    r = hi - lo
    s = jnp.arange(SAMPLES)
    rows = jnp.where(r > SAMPLES, lo + (s * r) // SAMPLES, lo + s)
    toks = tokens[sa[jnp.clip(rows, 0, sa.shape[0] - 1)] + offset]
    return toks, (s < r) & (toks != SEP)                 # an answer's end is no continuation


def _narrow(tokens, sa, lo, hi, offset, t):
    """The sub-range of [lo, hi) (sorted by the token at offset) whose token at offset is t."""
    it = _iterations(sa.shape[0])
    at = lambda i: tokens[sa[jnp.clip(i, 0, sa.shape[0] - 1)] + offset]
    new_lo = first_true(lambda i: at(i) >= t, lo, hi, it)
    return new_lo, first_true(lambda i: at(i) > t, new_lo, hi, it)


def top_next_tokens(tokens, sa, lo, hi, offset, k: int):
    """The k most frequent tokens at `offset` of the suffixes in [lo, hi) (all agree before it, so the
    range is sorted by it), judged on SAMPLES suffixes (the smallest token on a tie)
    -> (tokens int32[k], found bool[k])."""
    toks, counted = _samples(tokens, sa, lo, hi, offset)
    votes = jnp.sum((toks[:, None] == toks[None]) & counted[None], axis=1)
    picked, found = [], []
    for _ in range(k):
        i = jnp.argmax(jnp.where(counted, votes, -1))
        picked.append(toks[i])
        found.append(counted[i])
        counted &= toks != toks[i]
    return jnp.stack(picked).astype(jnp.int32), jnp.stack(found)


def follow(tokens, sa, lo, hi, n, num_draft: int):
    """Walk num_draft tokens down the most frequent continuation of the range [lo, hi) of an n-token
    match -> (tokens int32[K], probs float32[K]: each token's share of the range before it)."""
    def step(bounds, d):
        lo, hi = bounds
        t, found = top_next_tokens(tokens, sa, lo, hi, n + d, 1)
        t, ok = t[0], found[0] & (hi > lo)
        new_lo, new_hi = _narrow(tokens, sa, lo, hi, n + d, t)
        prob = jnp.where(ok, (new_hi - new_lo) / jnp.maximum(hi - lo, 1), 0.0)
        return (jnp.where(ok, new_lo, 0), jnp.where(ok, new_hi, 0)), (jnp.where(ok, t, 0), prob)

    _, (toks, probs) = jax.lax.scan(step, (lo, hi), jnp.arange(num_draft))
    return toks.astype(jnp.int32), probs.astype(jnp.float32)


def store_branches(tokens, sa, count, history, length, max_match: int, num_paths: int, depth: int) -> Match:
    """One row's draft paths from a store: its longest match, the num_paths most frequent next tokens
    after it, each followed by its most frequent continuation -> Match with tokens and probs [P, D];
    path 0 is the most frequent continuation."""
    tokens, sa, history = jnp.asarray(tokens), jnp.asarray(sa), jnp.asarray(history)
    n, lo, hi = longest_match(tokens, sa, count, history, length, max_match)
    firsts, found = top_next_tokens(tokens, sa, lo, hi, n, num_paths)
    found &= hi > lo

    def path(t, ok):
        sub_lo, sub_hi = _narrow(tokens, sa, lo, hi, n, t)
        rest, rest_probs = follow(tokens, sa, sub_lo, sub_hi, n + 1, depth - 1)
        first_prob = jnp.where(ok, (sub_hi - sub_lo) / jnp.maximum(hi - lo, 1), 0.0)
        probs = jnp.concatenate([first_prob[None], jnp.where(ok, rest_probs, 0.0)])
        return jnp.concatenate([t[None], rest]), probs.astype(jnp.float32)

    toks, probs = jax.vmap(path)(firsts, found)
    return Match(n, hi - lo, jnp.where(probs > 0, toks, 0), probs)


def store_match(tokens, sa, count, history, length, max_match: int, num_draft: int) -> Match:
    """One row's draft from a store: its longest match and that match's most frequent continuation."""
    m = store_branches(tokens, sa, count, history, length, max_match, 1, num_draft)
    return m._replace(tokens=m.tokens[0], probs=m.probs[0])


def request_match(history, length, max_match: int, num_draft: int) -> Match:
    """One row's draft from its own history (prompt lookup with matches up to max_match tokens): the
    latest of the longest earlier matches of its last tokens and what followed it, repeated with the
    period (length - its start) where it runs into the present (a text repeating itself goes on doing
    so); probs[0] is the share of the matches as long that the same token followed, the later ones 1."""
    history = jnp.asarray(history)
    S = history.shape[0]
    c = jnp.arange(S, dtype=jnp.int32)                                   # a continuation's first slot
    same = [history[jnp.clip(c - 1 - j, 0, S - 1)] == history[jnp.maximum(length - 1 - j, 0)]
            for j in range(max_match)]
    matched = jnp.sum(jnp.cumprod(jnp.stack(same), axis=0), axis=0)     # suffix tokens matched before c
    matched = jnp.where(c < length, jnp.minimum(matched, c), 0)          # inside the history, not past its start
    n = jnp.max(matched)
    start = jnp.max(jnp.where((matched == n) & (n > 0), c, -1))
    slot = start + jnp.arange(num_draft) % jnp.maximum(length - start, 1)
    known = jnp.broadcast_to(n > 0, slot.shape)
    toks = jnp.where(known, history[jnp.clip(slot, 0, S - 1)], 0)
    longest = (matched == n) & (n > 0)
    agree = jnp.sum(longest & (history[c] == toks[0])) / jnp.maximum(jnp.sum(longest), 1)
    probs = jnp.where(known, jnp.where(jnp.arange(num_draft) == 0, agree, 1.0), 0.0)
    return Match(n, jnp.sum(longest).astype(jnp.int32), toks.astype(jnp.int32), probs.astype(jnp.float32))
