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
