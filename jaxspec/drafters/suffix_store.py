"""The token store of suffix decoding (Oliaro et al., "SuffixDecoding", 2024), built with numpy.

A store is answers the target wrote, concatenated with a separator after each, and a suffix array
over it: the start of every suffix that begins with a real token, sorted by its first SORT_DEPTH
tokens (the separator sorts before every token). Arrays have a fixed capacity so that a store that
grows (`SuffixStore.add`) keeps the compiled programs' shapes; slots past `size` are separators and
past `count` the suffix array is padding.

The suffix array is made by prefix doubling (Manber and Myers 1993), stopped at SORT_DEPTH tokens:
about 4 s for SmolLM2's 2M answer tokens on 2 CPU cores, kept in $JAXSPEC_CACHE afterwards.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable

import numpy as np

from .. import paths, shards

SEP = -1             # after every answer; sorts before every token id
SORT_DEPTH = 64      # suffixes are in order by this many tokens: matched length + drafts must fit in it
CACHE_VERSION = 1


def suffix_array(tokens: np.ndarray, depth: int = SORT_DEPTH) -> np.ndarray:
    """int32[M] tokens -> int32[count] the starts of the suffixes that begin with a token (not SEP),
    sorted by their first `depth` tokens (ties: by position)."""
    n = len(tokens)
    rank = tokens.astype(np.int64) + 1                         # SEP -> 0
    width = 1
    while width < min(depth, n):
        after = np.zeros(n, np.int64)
        after[:n - width] = rank[width:]
        order = np.lexsort((after, rank))
        new_group = np.ones(n, bool)
        new_group[1:] = (rank[order][1:] != rank[order][:-1]) | (after[order][1:] != after[order][:-1])
        rank = np.empty(n, np.int64)
        rank[order] = np.cumsum(new_group)
        width *= 2
        if rank.max() == n:                                    # every suffix told apart
            break
    starts = np.argsort(rank, kind="stable").astype(np.int32)
    return starts[tokens[starts] != SEP]


@dataclasses.dataclass
class SuffixStore:
    """tokens int32[capacity + pad]: answers, each followed by SEP, then SEPs; sa int32[capacity]: the
    suffix array (count entries, then zeros); max_tokens: the bound `add` keeps (oldest answers go)."""

    tokens: np.ndarray
    sa: np.ndarray
    size: int
    count: int
    max_tokens: int
    sequences: list = dataclasses.field(default_factory=list, repr=False)

    @property
    def capacity(self) -> int:
        return len(self.sa)

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.sa.nbytes

    def add(self, sequences: Iterable) -> SuffixStore:
        """A store with `sequences` (token id lists) appended, the oldest dropped past max_tokens."""
        return build(self.sequences + [np.asarray(s, np.int32) for s in sequences], self.max_tokens, self.capacity)


def build(sequences: list, max_tokens: int | None = None, capacity: int | None = None) -> SuffixStore:
    """A store of `sequences` (the newest kept when they exceed max_tokens, counting one SEP each) with
    room for `capacity` tokens (default: max_tokens, else the size rounded up to a power of two)."""
    seqs = [np.asarray(s, np.int32).reshape(-1) for s in sequences]
    seqs = [s for s in seqs if len(s)]
    if max_tokens is not None:
        kept, total = [], 0
        for s in reversed(seqs):
            if total + len(s) + 1 > max_tokens:
                break
            kept.append(s)
            total += len(s) + 1
        seqs = kept[::-1]
    size = sum(len(s) + 1 for s in seqs)
    capacity = capacity or max_tokens or 1 << max(size - 1, 1).bit_length()
    if size > capacity:
        raise ValueError(f"a suffix store of {size} tokens does not fit its capacity {capacity}")
    tokens = np.full(capacity + SORT_DEPTH, SEP, np.int32)
    if seqs:
        tokens[:size] = np.concatenate([np.append(s, SEP) for s in seqs])
    sa = suffix_array(tokens[:size])
    padded = np.zeros(capacity, np.int32)
    padded[:len(sa)] = sa
    return SuffixStore(tokens, padded, size, len(sa), max_tokens or capacity, seqs)


def _data_key(data_dir: str) -> str:
    """A name for the store of a data folder: its shards' names, sizes and modification times."""
    h = hashlib.sha256(str(CACHE_VERSION).encode())
    for name in sorted(os.listdir(data_dir)):
        if name.startswith("shard-"):
            st = os.stat(os.path.join(data_dir, name))
            h.update(f"{name}:{st.st_size}:{int(st.st_mtime)}".encode())
    return h.hexdigest()[:16]


def from_data(data_dir: str, max_tokens: int | None = None) -> SuffixStore:
    """The store of a data folder's answers, read from $JAXSPEC_CACHE/suffix/ when built before."""
    folder = os.path.join(paths.cache_dir(), "suffix")
    path = os.path.join(folder, f"{_data_key(data_dir)}-{max_tokens or 0}.npz")
    if os.path.isfile(path):
        try:
            with np.load(path) as z:
                meta = json.loads(str(z["meta"]))
                answers = np.split(z["answers"], np.cumsum(z["answer_lengths"])[:-1])
                return SuffixStore(z["tokens"], z["sa"], meta["size"], meta["count"], meta["max_tokens"],
                                   list(answers))
        except (OSError, ValueError, KeyError):
            pass                                                    # rebuilt below
    answers = shards.answers(data_dir)
    store = build(answers, max_tokens)
    os.makedirs(folder, exist_ok=True)
    tmp = path + ".tmp.npz"
    meta = {"size": store.size, "count": store.count, "max_tokens": store.max_tokens}
    np.savez(tmp, tokens=store.tokens, sa=store.sa, meta=json.dumps(meta),
             answers=np.concatenate(store.sequences), answer_lengths=[len(s) for s in store.sequences])
    os.replace(tmp, path)
    return store
