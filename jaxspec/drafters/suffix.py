"""Suffix decoding (Oliaro et al., "SuffixDecoding", 2024): draft the most frequent continuation of the
longest suffix of the row's text found in a store of the target's past answers, or in the row's own
prompt and output (prompt lookup with long matches). Deterministic drafts (probs=None): lossless as
every drafter is. The stores travel as the compiled loop's params (suffix_store.py builds them with
numpy; suffix_search.py looks them up under jit), so a store that changes keeps its programs.

Choosing between the row and the store (rule "score": the draft of the higher estimated acceptance)
and the contexts of the adaptive policy were measured by `jaxspec train replay` (docs/suffix.md).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from ..tree import Tree, merge_paths
from . import suffix_store
from .base import Context, Drafter, Proposal, PyTree, TreeProposal
from .suffix_search import Match, request_match, store_branches

if TYPE_CHECKING:
    from ..model import Model

RULES = ("score", "longer", "request", "store")


@dataclasses.dataclass(frozen=True)
class SuffixConfig:
    """max_match: longest suffix looked up (tokens); rule: which source drafts when both match
    ("score": the higher estimated_acceptance, the row's on a tie; "longer": the longer match, the
    row's on a tie; "request": the row's whenever it matches; "store": the store's whenever it
    matches); online_tokens: room for answers given to `add`."""

    max_match: int = 24
    rule: str = "score"
    online_tokens: int = 1 << 16

    def __post_init__(self):
        if not 1 <= self.max_match < suffix_store.SORT_DEPTH:
            raise ValueError(f"max_match must be in [1, {suffix_store.SORT_DEPTH}), got {self.max_match}")
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {self.rule!r}")


# Per-token acceptance of a draft's first token, measured by replay (docs/suffix.md): the row's own
# match by its length 1..12+, a store's by its length and the first token's frequency there.
REQUEST_ACCEPTANCE = (0.0, 0.38, 0.62, 0.69, 0.73, 0.76, 0.80, 0.82, 0.87, 0.88, 0.89, 0.91, 0.94)
STORE_LENGTH_EDGES = (1, 2, 3, 4, 6, 9, 13)
STORE_PROB_EDGES = (0.3, 0.6, 0.9)
STORE_ACCEPTANCE = ((0.15, 0.16, 0.31, 0.31), (0.15, 0.28, 0.41, 0.41), (0.15, 0.28, 0.47, 0.47),
                    (0.18, 0.32, 0.50, 0.53), (0.18, 0.40, 0.53, 0.62), (0.18, 0.41, 0.60, 0.73),
                    (0.20, 0.60, 0.75, 0.87))
# Policy contexts: 0 no match, then the estimated acceptance in tenths; each one's prior its middle
NUM_BINS = 10
PRIORS = (0.0,) + tuple((i + 0.5) / NUM_BINS for i in range(NUM_BINS))


def estimated_acceptance(m: Match, from_store: bool) -> jax.Array:
    """float32[B]: the per-token acceptance expected of a draft from the row (by its match length) or
    from a store (by match length and first-token frequency); 0 without a match."""
    if not from_store:
        return jnp.asarray(REQUEST_ACCEPTANCE, jnp.float32)[jnp.minimum(m.length, len(REQUEST_ACCEPTANCE) - 1)]
    n = jnp.searchsorted(jnp.asarray(STORE_LENGTH_EDGES), m.length, side="right") - 1
    p = jnp.searchsorted(jnp.asarray(STORE_PROB_EDGES), m.probs[:, 0], side="right")
    return jnp.where(m.length > 0, jnp.asarray(STORE_ACCEPTANCE, jnp.float32)[jnp.maximum(n, 0), p], 0.0)


class Suffix(Drafter):
    """Suffix(store=None, cfg=SuffixConfig()): store a suffix_store.SuffixStore (None: the row's own text
    only); `Suffix.from_data(DATA)` builds one from a `jaxspec train data` folder's answers."""

    def __init__(self, store: suffix_store.SuffixStore | None = None, cfg: SuffixConfig = SuffixConfig()):
        self.cfg = cfg
        self.store = store
        self.online = suffix_store.build([], capacity=cfg.online_tokens)
        self._device = None

    @classmethod
    def from_data(cls, data_dir: str, cfg: SuffixConfig = SuffixConfig()) -> Suffix:
        return cls(suffix_store.from_data(data_dir), cfg)

    def __repr__(self):
        size = self.store.size if self.store is not None else 0
        return f"Suffix(store of {size} tokens, online {self.online.size}, {self.cfg})"

    def add(self, sequences: Iterable[Sequence[int]]) -> None:
        """Let later calls draft from these token sequences (e.g. earlier outputs), the oldest dropped past
        cfg.online_tokens. The compiled programs stay (the online store's shape is fixed)."""
        self.online = self.online.add(sequences)
        self._device = None

    def static_key(self) -> tuple:
        cap = self.store.capacity if self.store is not None else 0
        return ("Suffix", self.cfg, cap)

    def params_for(self, model: Model | None) -> PyTree:
        if self._device is None:
            stores = [s for s in (self.store, self.online) if s is not None]
            self._device = [{"tokens": jnp.asarray(s.tokens), "sa": jnp.asarray(s.sa),
                             "count": jnp.asarray(s.count, jnp.int32)} for s in stores]
        return {"stores": self._device}

    @property
    def prior_acceptance(self) -> tuple:
        """Per context (no match, then the estimated acceptance in tenths): each tenth's middle."""
        return PRIORS

    def _matches(self, params: PyTree, ctx: Context, num_paths: int, depth: int) -> tuple[Match, Match | None]:
        """(the row's own match, tokens [B, D]; the longest store match, tokens [B, P, D]): P paths from
        the store (suffix_search.store_branches, path 0 its most frequent continuation)."""
        L = self.cfg.max_match
        if L + depth > suffix_store.SORT_DEPTH:
            raise ValueError(f"Suffix drafts at most {suffix_store.SORT_DEPTH - L} tokens a step with max_match {L}, "
                             f"asked for {depth}")
        row = jax.vmap(lambda h, n: request_match(h, n, L, depth))(ctx.history, ctx.history_len)
        store = None
        for s in params["stores"]:
            look = lambda h, n, s=s: store_branches(s["tokens"], s["sa"], s["count"], h, n, L, num_paths, depth)
            m = jax.vmap(look)(ctx.history, ctx.history_len)
            store = m if store is None else _select(m.length > store.length, m, store)   # the first on a tie
        return row, store

    def _choose(self, row: Match, store: Match | None) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Which source drafts each row, by cfg.rule -> (use_store bool[B], the chosen draft's estimated
        acceptance float32[B], matched bool[B]: either source matched)."""
        row_est = estimated_acceptance(row, False)
        if store is None:
            return jnp.zeros_like(row.length, bool), row_est, row.length > 0
        store_est = estimated_acceptance(store._replace(probs=store.probs[:, 0]), True)   # path 0
        if self.cfg.rule == "score":
            use_store = store_est > row_est
        elif self.cfg.rule == "longer":
            use_store = store.length > row.length
        elif self.cfg.rule == "request":
            use_store = (row.length == 0) & (store.length > 0)
        else:
            use_store = store.length > 0
        return use_store, jnp.where(use_store, store_est, row_est), (row.length > 0) | (store.length > 0)

    def _chain(self, params, ctx: Context, num_draft: int):
        """-> (drafts int32[B, K], known bool[B, K]: drafts with a continuation behind them, the estimated
        acceptance float32[B], matched bool[B])."""
        row, store = self._matches(params, ctx, 1, num_draft)
        use_store, estimate, matched = self._choose(row, store)
        if store is not None:
            row = _select(use_store, store._replace(tokens=store.tokens[:, 0], probs=store.probs[:, 0]), row)
        return row.tokens, row.probs > 0, estimate, matched

    def context(self, params: PyTree, state: PyTree, ctx: Context) -> jax.Array:
        _, _, estimate, matched = self._chain(params, ctx, 1)
        bucket = jnp.clip((estimate * NUM_BINS).astype(jnp.int32), 0, NUM_BINS - 1)
        return jnp.where(matched, 1 + bucket, 0).astype(jnp.int32)

    def propose(self, params: PyTree, state: PyTree, ctx: Context, key: jax.Array, num_draft: int) -> Proposal:
        drafts, known, _, _ = self._chain(params, ctx, num_draft)
        last = ctx.history[jnp.arange(ctx.last.shape[0]), jnp.maximum(ctx.history_len - 1, 0)]
        return jnp.where(known, drafts, last[:, None]).astype(jnp.int32), None, state

    def propose_tree(self, params: PyTree, state: PyTree, ctx: Context, key: jax.Array, tree: Tree) -> TreeProposal:
        """budget // depth paths merged into one trie (tree.merge_paths; the rest of the budget unused,
        top_k not read): the chosen chain first, then the other source's, then the store's next most
        frequent branches."""
        M, D = tree.budget // tree.depth, tree.depth
        row, store = self._matches(params, ctx, max(M - 1, 1), D)
        paths, known = row.tokens[:, None], row.probs[:, None] > 0
        if store is not None:
            use_store = self._choose(row, store)[0][:, None, None]
            order = lambda s, r, rest: jnp.concatenate(
                [jnp.where(use_store, s, r), jnp.where(use_store, r, s), rest], axis=1)[:, :M]
            paths = order(store.tokens[:, :1], paths, store.tokens[:, 1:])
            known = order(store.probs[:, :1] > 0, known, store.probs[:, 1:] > 0)
        tokens, parents, valid = jax.vmap(merge_paths)(paths, known)
        pad = lambda x, v: jnp.pad(x, ((0, 0), (0, tree.budget - x.shape[1])), constant_values=v)
        return pad(tokens, 0), pad(parents, -1), pad(valid, False), None, state


def _select(mask: jax.Array, a: Match, b: Match) -> Match:
    """Row b of the result from a where mask[b] (bool[B]), else from b."""
    return jax.tree.map(lambda x, y: jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, y), a, b)
