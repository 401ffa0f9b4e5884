"""Tree primitives (jaxspec/tree.py) against plain-Python walks of random trees."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.tree import Tree, ancestors, greedy_tree_accept, node_depths


def _random_trees(rng, B, N, V):
    parents = np.array([[rng.integers(-1, i) if i else -1 for i in range(N)] for _ in range(B)])
    valid = rng.random((B, N)) < 0.85
    for b in range(B):                                   # a node whose parent is missing is missing too
        for i in range(N):
            if parents[b, i] >= 0 and not valid[b, parents[b, i]]:
                valid[b, i] = False
    return parents, valid, rng.integers(0, V, (B, N)), rng.integers(0, V, (B, N + 1))


def _path_of(parents, i):
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


def _reference(parents, valid, tokens, argmax):
    """The deepest node whose whole path matches the target's argmax (the first such at that depth)."""
    best = []
    for i in range(len(tokens)):
        path = _path_of(parents, i)
        if all(valid[j] and tokens[j] == argmax[parents[j] + 1] for j in path) and len(path) > len(best):
            best = path
    bonus = argmax[best[-1] + 1] if best else argmax[0]
    return len(best), best, [int(tokens[j]) for j in best] + [int(bonus)]


def test_ancestor_mask_and_depths_match_walking_the_parents():
    rng = np.random.default_rng(0)
    parents, *_ = _random_trees(rng, 3, 12, 5)
    D = 12
    mask, depths = np.asarray(ancestors(jnp.asarray(parents), D)), np.asarray(node_depths(jnp.asarray(parents), D))
    for b in range(3):
        for i in range(12):
            ups = {0} | {j + 1 for j in _path_of(parents[b], i)}           # last, then the node's path
            assert set(np.flatnonzero(mask[b, i + 1])) == ups
            assert depths[b, i + 1] == len(_path_of(parents[b], i))
        assert set(np.flatnonzero(mask[b, 0])) == {0} and depths[b, 0] == 0


@pytest.mark.parametrize("seed", range(4))
def test_greedy_tree_acceptance_equals_a_walk_of_the_tree(seed):
    rng = np.random.default_rng(seed)
    B, N, V, D = 16, 10, 3, 10                           # V = 3: many nodes match, long paths
    parents, valid, tokens, argmax = _random_trees(rng, B, N, V)
    n, path, emitted = jax.jit(greedy_tree_accept, static_argnums=4)(
        jnp.asarray(tokens), jnp.asarray(parents), jnp.asarray(valid), jnp.asarray(argmax), D)
    lengths = []
    for b in range(B):
        want_n, want_path, want_emitted = _reference(parents[b], valid[b], tokens[b], argmax[b])
        assert int(n[b]) == want_n
        assert np.asarray(path[b]).tolist() == want_path + [-1] * (D - want_n)
        assert np.asarray(emitted[b]).tolist() == want_emitted + [-1] * (D - want_n)
        lengths.append(want_n)
    assert max(lengths) >= 2 and min(lengths) == 0        # the cases cover deep paths and none


def test_a_chain_is_a_tree_with_one_child_per_node():
    tokens, argmax = jnp.asarray([[5, 6, 9]]), jnp.asarray([[5, 6, 7, 8]])    # the third draft is wrong
    n, path, emitted = greedy_tree_accept(tokens, jnp.asarray([[-1, 0, 1]]), jnp.ones((1, 3), bool), argmax, 3)
    assert int(n[0]) == 2 and path[0].tolist() == [0, 1, -1] and emitted[0].tolist() == [5, 6, 7, -1]
    with pytest.raises(ValueError, match="depth <= budget"):
        Tree(budget=4, depth=6)


def test_keep_path_moves_the_kept_nodes_behind_last_and_drops_the_rest():
    from jaxspec.cache import KVCache, keep_path
    L, B, S = 2, 2, 12
    k = jnp.broadcast_to(jnp.arange(S, dtype=jnp.float32)[None, None, :, None, None], (L, B, S, 1, 1))
    cache = KVCache(k, -k, jnp.asarray([9, 9]))
    start = jnp.asarray([3, 5])                         # the slot of `last`; nodes from start + 1
    path = jnp.asarray([[1, 3, 4], [0, -1, -1]])        # row 0 keeps nodes 1, 3, 4; row 1 node 0
    out = keep_path(cache, start, path)
    assert out.length.tolist() == [7, 7]
    np.testing.assert_array_equal(out.k[1, 0, :7, 0, 0], [0, 1, 2, 3, 5, 7, 8])   # slots 4, 6, 7 moved up
    np.testing.assert_array_equal(out.k[0, 1, :7, 0, 0], [0, 1, 2, 3, 4, 5, 6])   # node 0 already in place
    np.testing.assert_array_equal(out.v, -out.k)
    np.testing.assert_array_equal(out.k[:, 0, 7:], cache.k[:, 0, 7:])              # past the length: as it was


def test_a_tree_pass_gives_each_node_the_logits_of_its_own_path():
    """One target pass over [last, nodes] with tree_inputs: every node's logits equal a plain forward
    over the prompt, last and that node's path (transformers-free, but against our causal forward)."""
    from jaxspec.cache import init_cache, keep_path
    from jaxspec.models import forward
    from jaxspec.tree import tree_inputs

    from .conftest import TINY, tiny_model
    m, rng = tiny_model(), np.random.default_rng(3)
    B, N, D, S = 2, 7, 7, 40
    prompts = rng.integers(0, TINY.vocab_size, (B, 6))
    lengths = np.array([6, 4])                                          # row 1: a shorter prompt
    parents, _, tokens, _ = _random_trees(rng, B, N, TINY.vocab_size)
    last = rng.integers(0, TINY.vocab_size, (B,))
    cache = forward(m.params, jnp.asarray(prompts), init_cache(TINY, B, S), TINY)[2]
    cache = cache._replace(length=jnp.asarray(lengths, jnp.int32))
    inputs = jnp.concatenate([jnp.asarray(last)[:, None], jnp.asarray(tokens)], axis=1)
    tree = tree_inputs(cache.length, jnp.asarray(parents), D, S)
    logits, _, after = forward(m.params, inputs, cache, TINY, tree=tree)
    for b in range(B):
        for i in range(-1, N):
            path = _path_of(parents[b], i) if i >= 0 else []
            seq = list(prompts[b, :lengths[b]]) + [int(last[b])] + [int(tokens[b, j]) for j in path]
            want = forward(m.params, jnp.asarray([seq]), init_cache(TINY, 1, S), TINY)[0][0, -1]
            np.testing.assert_allclose(logits[b, i + 1], want, atol=1e-4, err_msg=f"row {b}, node {i}")
    # keep the path to node N-1 of row 0: the cache then equals one built from that sequence
    path = _path_of(parents[0], N - 1)
    kept = keep_path(after, jnp.asarray(lengths), jnp.asarray([path + [-1] * (D - len(path))] * B))
    seq = list(prompts[0, :6]) + [int(last[0])] + [int(tokens[0, j]) for j in path]
    ref = forward(m.params, jnp.asarray([seq]), init_cache(TINY, 1, S), TINY)[2]
    assert int(kept.length[0]) == len(seq)
    np.testing.assert_allclose(kept.k[:, 0, :len(seq)], ref.k[:, 0, :len(seq)], atol=1e-5)


def test_greedy_tree_verification_emits_what_plain_greedy_decoding_does():
    """Any tree, random or holding the greedy continuation: the emitted tokens are the next
    num_accepted + 1 tokens of plain greedy decoding, and decoding on from the kept cache stays equal."""
    import jaxspec
    from jaxspec.cache import init_cache
    from jaxspec.models import forward
    from jaxspec.decode.speculative import verify_tree
    from jaxspec.sampling import Sampling, row_params

    from .conftest import TINY, tiny_model
    m, rng = tiny_model(), np.random.default_rng(5)
    prompt = [int(t) for t in rng.integers(0, TINY.vocab_size, 5)]
    plain = jaxspec.generate(m, [prompt], max_new_tokens=12).tokens[0]
    N = 8
    parents, valid, tokens, _ = _random_trees(rng, 1, N, TINY.vocab_size)   # depth up to N
    greedy_chain = np.array([[-1, 0, 1, 2, -1, 4, 0, 6]])                   # nodes 0-3: plain's tokens 2-5
    greedy_tokens = np.array([[plain[1], plain[2], plain[3], plain[4], 7, 8, 9, 10]])
    cases = ((parents, tokens, valid, N, None), (greedy_chain, greedy_tokens, np.ones((1, N), bool), 4, 4))
    for par, tok, val, D, want_n in cases:
        cache = forward(m.params, jnp.asarray([prompt]), init_cache(TINY, 1, 32), TINY)[2]   # last = plain[0]
        n, emitted, _, _, cache = verify_tree(m.params, cache, jnp.asarray([plain[0]]), jnp.asarray(tok),
                                              jnp.asarray(par), jnp.asarray(val), None, row_params(Sampling(), 1),
                                              jax.random.PRNGKey(0), cfg=TINY, depth=D)
        k = int(n[0])
        assert want_n is None or k == want_n
        assert emitted[0, :k + 1].tolist() == plain[1:k + 2]
        assert int(cache.length[0]) == len(prompt) + 1 + k
        nxt = forward(m.params, jnp.asarray([[int(emitted[0, k])]]), cache, TINY)[0]   # decode on from there
        assert int(jnp.argmax(nxt[0, -1])) == plain[k + 2]


def test_sampled_tree_acceptance_keeps_the_target_law_of_two_tokens():
    """A fixed tree of deterministic children below `last` on a tiny target (V = 8): the first two
    emitted tokens (the second drawn from the exact conditional when the step emits one) follow the
    target's exact joint law, while the tree's own guesses are accepted often."""
    from scipy import stats

    from jaxspec.cache import init_cache
    from jaxspec.config import ModelConfig
    from jaxspec.models import forward
    from jaxspec.tree import sampled_tree_accept, tree_inputs

    from .conftest import tiny_model
    V8 = ModelConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                     num_kv_heads=1, head_dim=8, max_position_embeddings=64)
    m, prompt, rows = tiny_model(V8, seed=2, scale=0.8), [1, 5, 2], 24_000
    probs = lambda seq: np.asarray(jax.nn.softmax(forward(m.params, jnp.asarray([seq]), init_cache(V8, 1, 16),
                                                          V8)[0][0, -1]), np.float64)
    p1 = probs(prompt)                                        # `last` = prompt[-1], not yet cached: x1 ~ p1
    p2 = np.stack([probs(prompt + [x]) for x in range(8)])   # p(x2 | x1)
    parents = np.array([[-1, -1, -1, 0, 0, 2]])
    top = lambda p, r: int(np.argsort(p)[-1 - r])
    a, b = top(p1, 0), top(p1, 1)             # level 1: the three likeliest; below a: its two likeliest
    tokens = np.array([[a, b, top(p1, 2), top(p2[a], 0), top(p2[a], 1), 7]])
    cache = forward(m.params, jnp.asarray([prompt[:-1]]), init_cache(V8, 1, 16), V8)[2]
    tree = tree_inputs(cache.length, jnp.asarray(parents), 2, 16)
    logits = forward(m.params, jnp.asarray([[prompt[-1]] + tokens[0].tolist()]), cache, V8, tree=tree)[0]
    target = jnp.broadcast_to(jax.nn.softmax(logits, -1), (rows,) + logits.shape[1:])
    n, _, emitted = jax.jit(sampled_tree_accept, static_argnums=5)(
        jnp.broadcast_to(jnp.asarray(tokens), (rows, 6)), jnp.broadcast_to(jnp.asarray(parents), (rows, 6)),
        jnp.ones((rows, 6), bool), target, jax.random.PRNGKey(0), 2)
    n, emitted = np.asarray(n), np.asarray(emitted)
    rng = np.random.default_rng(1)
    x1 = emitted[:, 0]
    x2 = np.where(n >= 1, emitted[:, 1], [rng.choice(8, p=p2[x] / p2[x].sum()) for x in x1])
    exact = (p1[:, None] * p2).reshape(-1)
    counts = np.bincount(x1 * 8 + x2, minlength=64)
    keep = exact * rows >= 5
    pvalue = stats.chisquare(counts[keep], exact[keep] / exact[keep].sum() * counts[keep].sum()).pvalue
    tvd = 0.5 * np.abs(counts / rows - exact).sum()
    assert pvalue > 1e-3 and tvd < 0.03, (pvalue, tvd)
    assert 0.3 < (n >= 1).mean() and (n == 2).mean() > 0.02, np.bincount(n)   # the tree does get used


# ---------------------------------------------------------------- drafting trees

def _eagle2_reference(first, children, budget, depth, k):
    """EAGLE-2's expansion and rerank in plain Python: first [V] log-probs below last; children(token,
    level) [V] log-probs below a node. -> the kept nodes as (path of tokens, value), best first."""
    top = lambda lp: sorted(range(len(lp)), key=lambda t: (-lp[t], t))[:k]
    layer = [((t,), first[t]) for t in top(first)]
    made = list(layer)
    for level in range(1, depth):
        frontier = sorted(layer, key=lambda n: -n[1])[:k]
        layer = [(path + (t,), value + lp[t]) for path, value in frontier
                 for lp in [children(path[-1], level)] for t in top(lp)]
        made += layer
    return sorted(made, key=lambda n: -n[1])[:budget]


def test_grow_tree_keeps_the_best_nodes_of_an_eagle2_expansion():
    from jaxspec.tree import grow_tree
    V, B = 12, 2
    rng = np.random.default_rng(0)
    table = np.log(rng.dirichlet(np.ones(V) * 0.5, size=(4, V)))               # [level, token, V]
    first = np.log(rng.dirichlet(np.ones(V) * 0.5, size=B))
    tree = Tree(budget=10, depth=4, top_k=3)

    def expand(carry, tokens, parent, level):
        return jnp.asarray(table, jnp.float32)[level][tokens], carry

    tokens, parents, valid, _ = grow_tree(jnp.asarray(first, jnp.float32), expand, (), tree)
    tokens, parents, valid = map(np.asarray, (tokens, parents, valid))
    for b in range(B):
        assert valid[b].all() and all(parents[b, i] < i for i in range(tree.budget))
        paths = [tuple(int(tokens[b, j]) for j in _path_of(parents[b], i)) for i in range(tree.budget)]
        ref = _eagle2_reference(first[b], lambda t, level: table[level][t], tree.budget, tree.depth, tree.top_k)
        assert sorted(paths) == sorted(p for p, _ in ref)
        for i in range(tree.budget):                   # siblings carry distinct tokens
            sib = [int(tokens[b, j]) for j in range(tree.budget) if parents[b, j] == parents[b, i]]
            assert len(sib) == len(set(sib))


def test_ngram_tree_merges_the_continuations_of_earlier_matches():
    from jaxspec.drafters import NGram
    from jaxspec.drafters.base import Context

    history = [1, 2, 3, 9, 1, 2, 4, 8, 1, 2, 3, 7, 5, 1, 2]
    S = 24
    ctx = Context(jnp.asarray([2]), jnp.asarray([history + [0] * (S - len(history))]), jnp.asarray([len(history)]),
                  None, None)
    tokens, parents, valid, probs, _ = NGram(max_ngram=2).propose_tree({}, (), ctx, None, Tree(budget=13, depth=4))
    tokens, parents, valid = (np.asarray(x)[0] for x in (tokens, parents, valid))
    assert probs is None and tokens.shape == (13,) and not valid[12]        # 13 // 4 = 3 continuations
    paths = {tuple(int(tokens[j]) for j in _path_of(parents, i)) for i in range(13) if valid[i]}
    conts = [(3, 7, 5, 1), (4, 8, 1, 2), (3, 9, 1, 2)]                        # after each "1 2", newest first
    assert paths == {c[:d] for c in conts for d in range(1, 5)}
    assert valid.sum() == len(paths)                                          # the shared "3" is one node
    assert [int(tokens[j]) for j in _path_of(parents, 3)] == [3, 7, 5, 1]    # the newest match leads


def test_sample_children_draws_without_replacement():
    from jaxspec.tree import sample_children
    q = jnp.asarray([[0.5, 0.3, 0.15, 0.05]])
    rows = 40_000
    tokens, q_each = jax.jit(lambda k: sample_children(k, jnp.broadcast_to(q, (rows, 4)), 2))(jax.random.PRNGKey(0))
    tokens, q_each = np.asarray(tokens), np.asarray(q_each)
    assert (tokens[:, 0] != tokens[:, 1]).all()
    qq = np.asarray(q[0], np.float64)
    exact = np.array([[qq[a] * qq[b] / (1 - qq[a]) if a != b else 0 for b in range(4)] for a in range(4)])
    counts = np.bincount(tokens[:, 0] * 4 + tokens[:, 1], minlength=16) / rows
    assert 0.5 * np.abs(counts - exact.reshape(-1)).sum() < 0.01
    np.testing.assert_allclose(q_each[:, 0], np.broadcast_to(qq, (rows, 4)), rtol=1e-5)
    second = np.where(np.arange(4)[None] == tokens[:, :1], 0, qq[None]) / (1 - qq[tokens[:, 0]])[:, None]
    np.testing.assert_allclose(q_each[:, 1], second, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- through the loop

class SampledChildren:
    """A test drafter: a full binary tree of depth 2 whose children are drawn without replacement
    from q(. | parent's token), a fixed random table (the drawn-children case of sampled_tree_accept)."""

    def __new__(cls, V: int, seed: int):
        from jaxspec.drafters.base import Drafter
        from jaxspec.tree import sample_children

        class _Drafter(Drafter):
            table = jax.nn.softmax(1.5 * jax.random.normal(jax.random.PRNGKey(seed), (V, V)), axis=-1)

            def static_key(self):
                return ("SampledChildren", V, seed)

            def params_for(self, model):
                return {"table": self.table}

            def propose_tree(self, params, state, ctx, key, tree):
                assert (tree.budget, tree.depth, tree.top_k) == (6, 2, 2)
                B, k1, k2 = ctx.last.shape[0], *jax.random.split(key)
                t1, q1 = sample_children(k1, params["table"][ctx.last], 2)                   # [B, 2]
                t2, q2 = sample_children(k2, params["table"][t1.reshape(-1)], 2)            # [2B, 2]
                tokens = jnp.concatenate([t1, t2.reshape(B, 4)], axis=1)
                probs = jnp.concatenate([q1, q2.reshape(B, 4, V)], axis=1)
                parents = jnp.broadcast_to(jnp.asarray([-1, -1, 0, 0, 1, 1], jnp.int32), (B, 6))
                return tokens, parents, jnp.ones((B, 6), bool), probs, state

        return _Drafter()


@pytest.mark.parametrize("sampling", ["t1", "topk", "topp"])
def test_sampled_tree_speculation_matches_the_target_law_of_three_tokens(sampling):
    """The exact joint law of the first 3 tokens (all 8^3 sequences) against tree-speculative samples,
    with deterministic children (EAGLE-2 trees of a draft model and an EAGLE head, MTP's static tree,
    NGram's merged continuations) and with children drawn without replacement (SampledChildren)."""
    import jaxspec
    from jaxspec.drafters import MTP, DraftModel, Eagle, NGram
    from jaxspec.heads import EagleConfig, MTPConfig, init_eagle_params, init_mtp_params
    from jaxspec.sampling import Sampling

    from .conftest import tiny_model
    from .test_speculative import ROWS, V8, _exact_joint, assert_follows_law

    sampling = {"t1": Sampling(temperature=1.0), "topk": Sampling(temperature=0.9, top_k=4),
                "topp": Sampling(temperature=1.2, top_p=0.8)}[sampling]
    target, prompt = tiny_model(V8, seed=2, scale=0.8), [1, 5, 2]
    exact = _exact_joint(target, prompt, sampling)
    eagle_cfg = EagleConfig.for_target(V8, draft_vocab_size=V8.vocab_size)
    mtp_cfg = MTPConfig.for_target(V8, num_modules=2, draft_vocab_size=V8.vocab_size)
    drafters = [(DraftModel(tiny_model(V8, seed=3, scale=0.8)), Tree(5, 2, 3)),
                (Eagle(init_eagle_params(eagle_cfg, jax.random.PRNGKey(5), scale=0.5), eagle_cfg), Tree(5, 2, 3)),
                (MTP(init_mtp_params(mtp_cfg, jax.random.PRNGKey(4), scale=0.5), mtp_cfg), Tree(5, 2, 3)),
                (NGram(), Tree(4, 2, 2)), (SampledChildren(8, seed=6), Tree(6, 2, 2))]
    for drafter, tree in drafters:
        out = jaxspec.generate(target, [prompt] * ROWS, max_new_tokens=3, sampling=sampling, drafter=drafter,
                               tree=tree, adaptive=False, seed=11)
        name = type(drafter).__name__
        assert_follows_law(out.tokens, exact, name)
        if not isinstance(drafter, NGram):
            assert out.stats.mean_accepted_length > 1.05, name         # the tree's guesses do get kept


# ---------------------------------------------------------------- real SmolLM2, greedy

@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ngram", "eagle", "mtp", "draft"])
def test_greedy_trees_are_lossless_on_smollm2(smollm, chat_prompts, kind):
    """Every drafter's tree, fixed every step: batch 1 and batch 4 (prompts of different lengths)
    give plain greedy decoding's tokens."""
    import jaxspec
    from jaxspec.bench import make_drafter

    drafter = make_drafter(kind, smollm)                  # eagle, mtp, draft: shipped in checkpoints/
    short = smollm.tokenizer.apply_chat_template([{"role": "user", "content": "Count to twenty."}],
                                                 add_generation_prompt=True)
    prompts = chat_prompts + [short]
    assert len({len(p) for p in prompts}) == 4
    plain = jaxspec.generate(smollm, prompts, max_new_tokens=40).tokens
    for rows in ([0], [0, 1, 2, 3]):
        out = jaxspec.generate(smollm, [prompts[i] for i in rows], max_new_tokens=40, drafter=drafter,
                               tree=Tree(budget=16, depth=4, top_k=4), adaptive=False)
        assert out.tokens == [plain[i] for i in rows], f"{kind}, batch {len(rows)}"
        s = out.stats
        assert s.tree == {"budget": 16, "depth": 4, "top_k": 4} and 1.0 <= s.mean_accepted_length <= 5.0
        assert 40 / 5 <= s.target_steps < 40           # loop steps: at most depth + 1 = 5 tokens a pass
