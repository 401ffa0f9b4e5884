"""Suffix decoding's store and search against brute force over the same token lists."""
import jax
import numpy as np
import pytest

from jaxspec.drafters import suffix_store
from jaxspec.drafters.suffix_search import request_match, store_match

VOCAB = 4     # few distinct tokens: long matches and many occurrences


def _occurrences(answers, pattern):
    """(answer, end) for every place an answer holds pattern, end = index after it."""
    n = len(pattern)
    return [(a, i + n) for a, seq in enumerate(answers) for i in range(len(seq) - n + 1)
            if list(seq[i:i + n]) == list(pattern)]


def _brute_store(answers, history, max_match, num_draft):
    """The longest suffix of history found in answers; then, num_draft times, the most frequent next
    token among the occurrences that still agree (smallest token on a tie, stop at an answer's end)."""
    best = max((n for n in range(1, min(max_match, len(history)) + 1)
                if _occurrences(answers, history[len(history) - n:])), default=0)
    occ = _occurrences(answers, history[len(history) - best:]) if best else []
    count, tokens, probs = len(occ), [], []
    for _ in range(num_draft):
        nxt = [answers[a][e] for a, e in occ if e < len(answers[a])]
        if not nxt:
            break
        values, counts = np.unique(nxt, return_counts=True)
        t = int(values[np.argmax(counts)])
        tokens.append(t)
        probs.append(counts.max() / len(occ))
        occ = [(a, e + 1) for a, e in occ if e < len(answers[a]) and answers[a][e] == t]
    return best, count, tokens, probs


@pytest.mark.parametrize("seed", range(3))
def test_store_match_is_the_longest_match_and_its_most_frequent_continuation(seed):
    rng = np.random.default_rng(seed)
    answers = [rng.integers(0, VOCAB, rng.integers(1, 12)).astype(np.int32) for _ in range(6)]
    store = suffix_store.build(answers)
    S, L, K = 16, 5, 4
    look = jax.jit(jax.vmap(lambda h, n: store_match(store.tokens, store.sa, store.count, h, n, L, K)))
    histories = rng.integers(0, VOCAB + 1, (24, S)).astype(np.int32)      # token VOCAB is in no answer
    lengths = rng.integers(1, S + 1, 24).astype(np.int32)
    got = jax.device_get(look(histories, lengths))
    for b in range(24):
        n, count, tokens, probs = _brute_store(answers, list(histories[b, :lengths[b]]), L, K)
        assert (int(got.length[b]), int(got.count[b])) == (n, count), b
        kept = int(np.sum(got.probs[b] > 0))
        assert list(got.tokens[b, :kept]) == tokens, b
        np.testing.assert_allclose(got.probs[b, :kept], probs, rtol=1e-6)


def test_store_match_samples_a_large_range_and_counts_it_exactly():
    """Past suffix_search.SAMPLES occurrences the most frequent next token is judged on a sample; a
    clear majority is still found, and its frequency is exact."""
    answers = [np.array([1, 2, 3], np.int32)] * 70 + [np.array([1, 2, 0], np.int32)] * 30
    store = suffix_store.build(answers)
    m = store_match(store.tokens, store.sa, store.count, np.array([5, 1, 2], np.int32), 3, 4, 2)
    assert (int(m.length), int(m.count)) == (2, 100)
    assert int(m.tokens[0]) == 3 and float(m.probs[0]) == pytest.approx(0.7)
    assert float(m.probs[1]) == 0.0                   # the answers end after 3


def _brute_request(history, max_match, num_draft):
    """The latest of the longest earlier occurrences of the history's last tokens, and what followed
    (repeated with its period where it reaches the end of the history)."""
    L = len(history)
    def matched(c):                                   # suffix tokens equal before slot c
        n = 0
        while n < min(max_match, c) and history[c - 1 - n] == history[L - 1 - n]:
            n += 1
        return n
    lengths = [matched(c) for c in range(L)]
    n = max(lengths, default=0)
    if n == 0:
        return 0, []
    c = max(i for i in range(L) if lengths[i] == n)
    return n, [history[c + i % (L - c)] for i in range(num_draft)]


def test_request_match_is_the_latest_longest_earlier_occurrence():
    rng = np.random.default_rng(7)
    S, L, K = 20, 6, 3
    look = jax.jit(jax.vmap(lambda h, n: request_match(h, n, L, K)))
    histories = rng.integers(0, VOCAB, (32, S)).astype(np.int32)
    lengths = rng.integers(1, S + 1, 32).astype(np.int32)
    got = jax.device_get(look(histories, lengths))
    for b in range(32):
        n, tokens = _brute_request(list(histories[b, :lengths[b]]), L, K)
        assert int(got.length[b]) == n, b
        kept = int(np.sum(got.probs[b] > 0))
        assert list(got.tokens[b, :kept]) == tokens, b


def test_request_match_repeats_a_period_that_reaches_the_present():
    """7 1 2 3 1 2 3 1 2: the match of the last five tokens starts at slot 6; what followed it (3 1 2)
    runs into the present and goes on with period 3."""
    m = request_match(np.array([7, 1, 2, 3, 1, 2, 3, 1, 2, 0, 0], np.int32), 9, 8, 5)
    assert int(m.length) == 5
    assert list(m.tokens) == [3, 1, 2, 3, 1] and bool(np.all(m.probs > 0))


def test_store_keeps_the_newest_answers_within_its_bound_and_its_capacity():
    store = suffix_store.build([[1, 2], [3, 4, 5]], max_tokens=8)
    bigger = store.add([[6, 7, 8]])
    assert [list(s) for s in bigger.sequences] == [[3, 4, 5], [6, 7, 8]]
    assert bigger.capacity == store.capacity == 8 and bigger.count == 6
    with pytest.raises(ValueError, match="capacity"):
        suffix_store.build([[1] * 10], capacity=8)


# ---------------------------------------------------------------- real SmolLM2, greedy

def test_suffix_drafts_are_lossless_on_smollm2_chains_and_trees(smollm, chat_prompts):
    """The shipped store plus each row's own text, K = 1, 3, 5 fixed and a 16-node tree: batch 1 and a
    batch of 4 prompts of different lengths give plain greedy decoding's tokens."""
    import jaxspec
    from jaxspec.drafters import shipped
    from jaxspec.tree import Tree

    drafter = shipped(smollm, "suffix")
    short = smollm.tokenizer.apply_chat_template([{"role": "user", "content": "Count to twenty."}],
                                                 add_generation_prompt=True)
    prompts = chat_prompts + [short]
    assert len({len(p) for p in prompts}) == 4 and drafter.store.size > 1_000_000
    plain = jaxspec.generate(smollm, prompts, max_new_tokens=48).tokens
    arms = [dict(num_draft_tokens=k) for k in (1, 3, 5)] + [dict(tree=Tree(budget=16, depth=4))]
    for arm in arms:
        for rows in ([0], [0, 1, 2, 3]):
            out = jaxspec.generate(smollm, [prompts[i] for i in rows], max_new_tokens=48, drafter=drafter,
                                   adaptive=False, **arm)
            assert out.tokens == [plain[i] for i in rows], f"{arm}, batch {len(rows)}"
            assert out.stats.mean_accepted_length > 1.2, arm          # the drafts do get kept


def test_answers_added_online_are_drafted_later_without_a_recompile():
    import jaxspec
    from jaxspec.drafters import Suffix, SuffixConfig

    from .conftest import tiny_model

    m = tiny_model()
    prompts = [[5, 9, 2, 7], [3, 1, 4, 1, 5, 9, 2]]
    plain = jaxspec.generate(m, prompts, max_new_tokens=24).tokens
    drafter = Suffix(cfg=SuffixConfig(online_tokens=256))
    kw = dict(max_new_tokens=24, drafter=drafter, num_draft_tokens=4, adaptive=False)
    before = jaxspec.generate(m, prompts, **kw)
    drafter.add(before.tokens)
    after = jaxspec.generate(m, prompts, **kw)
    assert before.tokens == after.tokens == plain
    assert after.stats.compile_seconds == 0.0                  # the online store kept its shape
    assert after.stats.mean_accepted_length > before.stats.mean_accepted_length
    assert after.stats.mean_accepted_length >= 4.0             # the answers are in the store now
    drafter.add([list(range(300))])                            # past online_tokens: the oldest go
    assert drafter.online.size <= 256 and len(drafter.online.sequences) == 0


def test_replay_takes_the_steps_the_speculative_loop_takes():
    """jaxspec.replay on plain greedy answers against the compiled loop itself, row by row (batch 1)."""
    import jaxspec
    from jaxspec.drafters import NGram, Suffix
    from jaxspec.replay import replay

    from .conftest import tiny_model

    m = tiny_model()
    prompts = [[5, 9, 2, 7], [3, 1, 4, 1, 5, 9, 2], [8, 8, 1]]
    answers = jaxspec.generate(m, prompts, max_new_tokens=40).tokens
    store = suffix_store.build([answers[1][:20], [9, 2, 7, 5]])
    for drafter in (NGram(), Suffix(store)):
        replayed = replay(drafter, [p + a for p, a in zip(prompts, answers)], [len(p) for p in prompts], 3)
        for i, p in enumerate(prompts):
            out = jaxspec.generate(m, [p], max_new_tokens=40, drafter=drafter, num_draft_tokens=3, adaptive=False)
            assert out.tokens[0] == answers[i]
            assert int(replayed.steps[i]) == out.stats.target_steps, (drafter, i)
        assert replayed.mean_accepted_length > 1.0
