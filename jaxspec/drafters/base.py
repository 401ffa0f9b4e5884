"""The drafter protocol shared by the speculative loop and every drafter.

A drafter is a Python object holding static settings; its arrays travel as `params` so that
compiled programs can be reused. Inside the compiled loop:
  params = drafter.params_for(target_model)
  state = drafter.init(params, prompts[B, T], lengths[B], capacity, features[N, B, T, E])
  tokens[B, K], probs[B, K, V] | None, state = drafter.propose(params, state, ctx, key, K)
  state = drafter.commit(params, state, ctx, num_accepted[B])
  state = drafter.sync(params, state, ctx)   # instead of propose in a step without drafts (K = 0)
  tokens[B, N], parents[B, N], valid[B, N], probs[B, N, V] | None, state =
      drafter.propose_tree(params, state, ctx, key, tree)   # a token tree instead (jaxspec/tree.py)
  context int32[B] = drafter.context(params, state, ctx)   # before each adaptive step (policy.py)
probs=None means the draft is deterministic (argmax or lookup): q is one-hot on the token.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from ..cache import rollback
from ..heads.metadata import HeadMetadata, head_metadata
from ..sampling import probs_from_logits

if TYPE_CHECKING:
    from ..model import Model
    from ..tree import Tree

PyTree = Any    # nested dicts / tuples / NamedTuples of arrays
Proposal = tuple[jax.Array, "jax.Array | None", PyTree]      # drafts int32[B, K], probs [B, K, V] or None, state
TreeProposal = tuple[jax.Array, jax.Array, jax.Array, "jax.Array | None", PyTree]   # tokens, parents, valid, probs, state

CATCH_UP = 16   # positions per pass when a drafter's propose takes in what plain steps (sync) skipped


class Context(NamedTuple):
    """What the loop knows at the start of a step, per row."""

    last: jax.Array          # int32[B]: newest token, emitted but not yet in the target cache
    history: jax.Array       # int32[B, S]: prompt + emitted tokens (slots >= history_len are stale)
    history_len: jax.Array   # int32[B]: valid history, = target cache length + 1
    sampling: dict           # per-row sampling arrays [B] (see sampling.row_params)
    features: jax.Array      # [N, B, P, E] target hidden states (drafter.hidden_layers) of the last
                             # pass (P = the largest K + 1; entries past that pass's tokens are padding);
                             # before the first step index 0 holds the prompt's last position

    def feature_positions(self, n_prev: jax.Array) -> jax.Array:
        """int32[B, P]: the positions of `features`, the last pass having accepted n_prev[B] drafts:
        its inputs were the n_prev + 1 tokens before `last` (and padding), from history_len - 2 - n_prev."""
        return (self.history_len - 2 - n_prev)[:, None] + jnp.arange(self.features.shape[2])


class Drafter:
    """Base class: subclasses override the methods below."""

    hidden_layers: tuple = ()   # target layers whose hidden states the drafter reads
    metadata: HeadMetadata | None = None   # trained drafters: what train/ recorded (heads/metadata.py)

    def params_for(self, model: Model) -> PyTree:
        """The arrays the compiled loop passes in (may include the target's, e.g. its embeddings)."""
        return {}

    def static_key(self) -> tuple:
        """Everything that changes the compiled program (hashable)."""
        return (type(self).__name__,)

    def check_target(self, model: Model) -> None:
        """Raise ValueError if this drafter cannot serve `model` (vocabulary, tokenizer)."""

    def init(self, params: PyTree, prompts: jax.Array, lengths: jax.Array, capacity: int,
             features: jax.Array) -> PyTree:
        """prompts int32[B, T], lengths int32[B]; features [N, B, T, E]: the prompt's hidden states from
        the target's prefill. -> the drafter's state (caches, buffers) for `capacity` slots."""
        return ()

    def propose(self, params: PyTree, state: PyTree, ctx: Context, key: jax.Array,
                num_draft: int) -> Proposal:
        """-> (drafts int32[B, K], their probabilities [B, K, V] or None for deterministic drafts, state)."""
        raise NotImplementedError

    def propose_tree(self, params: PyTree, state: PyTree, ctx: Context, key: jax.Array,
                     tree: Tree) -> TreeProposal:
        """A token tree of tree.budget nodes below ctx.last (jaxspec/tree.py: parents before children,
        -1 = a child of last; children of one node carry distinct tokens). The next commit gets the
        drafts kept on its path, and ctx.features then hold the pass's features of [last, that path].
        probs None: deterministic children; else q_i per node (tree.sampled_tree_accept)."""
        raise NotImplementedError(f"{type(self).__name__} does not draft token trees")

    @property
    def drafts_trees(self) -> bool:
        return type(self).propose_tree is not Drafter.propose_tree

    def commit(self, params: PyTree, state: PyTree, ctx: Context, num_accepted: jax.Array) -> PyTree:
        """After verification: num_accepted int32[B] of the last proposal's drafts were kept."""
        return state

    def context(self, params: PyTree, state: PyTree, ctx: Context) -> jax.Array:
        """int32[B] in [0, len(prior_acceptance)): what the drafter knows before drafting that
        predicts acceptance (NGram: the length of its match). The adaptive policy keeps one
        acceptance estimate per context. Default: one context."""
        return jnp.zeros_like(ctx.last)

    @property
    def prior_acceptance(self) -> tuple:
        """Per context, the per-token acceptance assumed before any evidence: a shipped head's
        held-out first-draft acceptance (metadata), else 0.5."""
        held = self.metadata.first_draft_acceptance if self.metadata is not None else None
        return (held,) if held is not None else (0.5,)

    def sync(self, params: PyTree, state: PyTree, ctx: Context) -> PyTree:
        """A step verifies no drafts (adaptive K = 0, a plain target step): take in what propose
        would have (the last pass's tokens and features) so later drafts see the full context.
        The default keeps the state as it is (right for drafters that read only ctx.history)."""
        return state


class HeadDrafter(Drafter):
    """A drafter around a trained Flax NNX head (EAGLE, MTP): built from the module, or from its
    arrays and config, with optional HeadMetadata. It keeps nnx.split(head) = (graph, state); the
    compiled loop gets the state (params_for) and merges it back with the graph (head)."""

    head_class: type = nnx.Module     # the head's module; its __init__(cfg, arrays)

    def __init__(self, head, cfg=None, metadata: HeadMetadata | dict | None = None):
        name = type(self).__name__
        if not isinstance(head, self.head_class):
            if cfg is None:
                raise ValueError(f"{name}(arrays, cfg): the config is needed with a mapping of arrays")
            head = self.head_class(cfg, head)
        self.cfg = head.cfg
        self.graph, self.state = nnx.split(head)
        self.hidden_layers = self.layers_read(self.cfg)
        self.metadata = head_metadata(metadata, self.hidden_layers, self.cfg.draft_vocab_size)

    @staticmethod
    def layers_read(cfg: Any) -> tuple:
        """The target layers whose hidden states the head reads."""
        raise NotImplementedError

    def head(self, params=None):
        """The head module: from the compiled loop's params["head"], or the one held."""
        return nnx.merge(self.graph, self.state if params is None else params["head"])


def draw_token(logits: jax.Array, key, sampling: dict):
    """One draft token per row from logits [B, V] with the target's sampling settings
    -> (token int32[B], the distribution q [B, V] it was drawn from). An all-greedy batch takes the
    argmax without drawing V random numbers per row."""
    def greedy():
        tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return tok, jax.nn.one_hot(tok, logits.shape[-1], dtype=jnp.float32)

    def sampled():
        q = probs_from_logits(logits, sampling)
        return jax.random.categorical(key, jnp.log(q), axis=-1).astype(jnp.int32), q

    return jax.lax.cond(jnp.all(sampling["temperature"] == 0), greedy, sampled)


def check_head_target(kind: str, vocab_size: int, hidden_size: int, metadata: HeadMetadata, model) -> None:
    """ValueError unless a head trained for (vocab_size, hidden_size, metadata's fingerprint) fits `model`."""
    t = model.config
    if (vocab_size, hidden_size) != (t.vocab_size, t.hidden_size):
        raise ValueError(f"{kind} head is for a target with vocabulary {vocab_size} and width "
                         f"{hidden_size}, not {t.vocab_size} and {t.hidden_size}")
    metadata.check_target(kind, model)


def catch_up(feed: Callable, cache, written: jax.Array, end: jax.Array, limit: int):
    """Take into a drafter's cache the positions [written, end) per row (int32[B] each) that plain
    steps skipped, CATCH_UP at a time: feed(cache rolled back to written, pos int32[B, CATCH_UP],
    clipped to limit - 1) -> cache after one pass over those positions. -> cache. Positions past
    `end` in the last chunk are written too, and overwritten before any query sees them."""
    def chunk(carry):
        cache, written = carry
        pos = jnp.minimum(written[:, None] + jnp.arange(CATCH_UP), limit - 1)
        return feed(rollback(cache, written), pos), jnp.minimum(written + CATCH_UP, end)

    return jax.lax.while_loop(lambda c: jnp.any(c[1] < end), chunk, (cache, written))[0]


def sample_chain(first_logits: jax.Array, step: Callable, carry, key, num_draft: int, sampling: dict):
    """Draw K draft tokens autoregressively with the target's sampling settings.

    first_logits [B, V] give token 1; step(carry, token int32[B]) -> (carry, logits [B, V]) gives
    each next one. -> (tokens int32[B, K], probs [B, K, V] the distributions drawn from, carry)."""
    keys = jax.random.split(key, num_draft)
    draw = lambda logits, k: draw_token(logits, k, sampling)
    tok, q = draw(first_logits, keys[0])

    def body(state, k):
        carry, tok = state
        carry, logits = step(carry, tok)
        nxt, q = draw(logits, k)
        return (carry, nxt), (nxt, q)

    (carry, _), (toks, qs) = jax.lax.scan(body, (carry, tok), keys[1:])
    tokens = jnp.concatenate([tok[:, None], jnp.swapaxes(toks, 0, 1)], axis=1)
    probs = jnp.concatenate([q[:, None], jnp.swapaxes(qs, 0, 1)], axis=1)
    return tokens, probs, carry
