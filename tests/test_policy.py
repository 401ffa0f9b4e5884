"""Adaptive speculation (jaxspec/policy.py): the choice rule, and that switching K between steps,
K = 0 included, keeps generation lossless for every drafter (tiny random models)."""
from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import jaxspec
from jaxspec import policy
from jaxspec.decode import programs
from jaxspec.drafters import MTP, DraftModel, Eagle, NGram, truncated
from jaxspec.heads import EagleConfig, MTPConfig, init_eagle_params, init_mtp_params
from jaxspec.sampling import Sampling

from .conftest import TINY, tiny_model
from .test_speculative import V8, _exact_joint

KS = (0, 1, 2, 5)
GEN = importlib.import_module("jaxspec.generation")


ONE = jnp.zeros((1,), jnp.int32)           # one row in context 0
LIVE = jnp.asarray([True])


def _after(steps, K, n, prior=(0.5,)):
    est = policy.init_estimate(prior)
    for _ in range(steps):
        est = policy.update(est, jnp.int32(K), jnp.asarray([n], jnp.int32), LIVE, ONE)
    return est


def _choose(est, costs):
    return KS[int(policy.choose(est, KS, jnp.asarray(costs), ONE, LIVE))]


def test_choice_follows_acceptance_and_costs():
    costs = [1.0, 1.3, 1.6, 2.5]
    assert policy.candidates(5) == (0, 2, 5) and policy.candidates(1) == (0, 1) and policy.candidates(8) == (0, 2, 4, 8)
    assert policy.candidates(2) == (0, 2) and policy.candidates(3) == (0, 2, 3)
    high, low = _after(20, 5, 5), _after(20, 5, 0)        # every draft kept / none kept
    assert float(high.accepted[0] / high.trials[0]) > 0.95 and float(low.accepted[0] / low.trials[0]) < 0.05
    assert _choose(high, costs) == 5 and _choose(low, costs) == 0
    # nothing accepted: drafts that cost 3-10% of a step do not pay; at partial acceptance they do
    assert _choose(low, [1.0, 1.03, 1.05, 1.1]) == 0
    assert _choose(_after(20, 5, 2), [1.0, 1.01, 1.02, 1.05]) > 0
    # partial acceptance: n accepted of K means n + 1 trials (the rejected one counts)
    est = _after(1, 5, 2)
    assert float(est.accepted[0]) == pytest.approx(policy.DECAY * 0.5 * policy.PRIOR_TRIALS + 2)
    assert float(est.trials[0]) == pytest.approx(policy.DECAY * policy.PRIOR_TRIALS + 3)
    # the adaptive loop runs when some context's prior makes some K pay (K=1 at a=0.5: 1.5 tokens for
    # 1.3 steps), or when a K = 0 step costs about a plain step, so that only probes are at stake
    sync = [1.1] + costs[1:]                                               # the drafter's sync costs 10%
    assert policy.speculation_can_pay(KS, sync, [0.5]) and not policy.speculation_can_pay(KS, sync, [0.2])
    assert policy.speculation_can_pay(KS, sync, [0.0, 0.2, 0.6])           # one context is enough
    assert policy.speculation_can_pay(KS, costs, [0.2])                    # free sync: probes decide
    # a K = 0 cost over the tolerance by less than two standard errors of its measurement gets the loop
    assert policy.speculation_can_pay(KS, [1.07] + costs[1:], [0.2], errors=[0.015, 0, 0, 0])
    assert not policy.speculation_can_pay(KS, [1.07] + costs[1:], [0.2], errors=[0.005, 0, 0, 0])
    assert not policy.speculation_can_pay(KS, [1.0, 2.0, 3.1, 6.5], [0.99])  # even full acceptance loses


def test_estimates_are_kept_per_context():
    """Rows in context 1 accept everything, rows in context 0 nothing: each context learns its own
    rate, and the batch speculates only when no active row would be slowed (its worst row decides)."""
    est = policy.init_estimate((0.5, 0.5, 0.5))
    context, live = jnp.asarray([0, 1]), jnp.asarray([True, True])
    for _ in range(20):
        est = policy.update(est, jnp.int32(5), jnp.asarray([0, 5], jnp.int32), live, context)
    a = est.accepted / est.trials
    assert float(a[0]) < 0.05 and float(a[1]) > 0.95 and float(a[2]) == 0.5      # context 2 never seen
    costs = jnp.asarray([1.0, 1.3, 1.6, 2.5])
    pick = lambda rows: KS[int(policy.choose(est, KS, costs, jnp.asarray(rows), jnp.ones(len(rows), bool)))]
    assert pick([0]) == 0 and pick([1]) == 5 and pick([1, 1, 1]) == 5
    assert pick([0, 1, 1]) == 0 and pick([0, 0, 0, 1]) == 0          # one row that keeps nothing: plain
    # a finished row does not count, either way
    live = lambda rows, active: KS[int(policy.choose(est, KS, costs, jnp.asarray(rows), jnp.asarray(active)))]
    assert live([0, 1], [True, False]) == 0 and live([0, 1], [False, True]) == 5


def test_probes_wait_for_their_expected_loss():
    """At K = 0 a probe with the best K > 0 comes after loss / PROBE_BUDGET plain steps, loss being
    the probe's cost less the plain steps its expected tokens would take (Leviathan eq. 1)."""
    costs = jnp.asarray([1.0, 1.3, 1.6, 2.5])

    def run(prior, steps=120):
        est, chosen = policy.init_estimate(prior), []
        for _ in range(steps):
            k = _choose(est, costs)
            chosen.append(k)
            est = policy.update(est, jnp.int32(k), jnp.asarray([0], jnp.int32), LIVE, ONE)   # every draft rejected
        return [i for i, k in enumerate(chosen) if k], chosen

    probes, chosen = run((0.15,))                 # K=1 at a=0.15: 1.15 tokens for 1.3 steps, a 0.15-step loss
    assert all(chosen[i] == 1 for i in probes)
    assert probes[0] == 8                         # ceil(0.15 / 0.02)
    gaps = np.diff(probes)
    assert len(gaps) >= 3 and np.all(gaps[1:] >= gaps[:-1]) and gaps[-1] > gaps[0]   # rejections: waits grow
    # until the estimate sinks below PROBE_FLOOR and probing stops (gaps of ~13 steps would go on)
    assert probes[-1] < 100 and run((0.0,))[0] == []
    # an estimate just below break-even is probed after MIN_WAIT steps (1.29 tokens for 1.3 steps)
    assert run((0.29,))[0][0] == policy.MIN_WAIT
    # the probe takes the best K > 0: K=2 gives 1.39 tokens for 1.55 steps at a=0.3, K=1 1.3 for 1.5
    est = policy.init_estimate((0.3,))._replace(plain_run=jnp.int32(policy.MAX_WAIT))
    assert _choose(est, [1.0, 1.5, 1.55, 3.0]) == 2
    # no probe while some active row sits below the floor: the probe could not lift the batch's worst row
    est = policy.init_estimate((0.0, 0.2))._replace(plain_run=jnp.int32(policy.MAX_WAIT))
    probe = lambda rows: KS[int(policy.choose(est, KS, costs, jnp.asarray(rows), jnp.ones(len(rows), bool)))]
    assert probe([1, 1]) == 1 and probe([0, 1]) == 0


def test_a_tree_is_taken_where_it_pays_and_probed_rarely_where_it_costs_more():
    """Arms: K in 0, 1, 2, 5 and a Tree of depth 5. Before any tree step its expected tokens are the
    K = 5 chain's; after, its own steps' mean. Where verifying the tree costs far more than the chain
    (this CPU: 32 nodes ~ 3.9 plain steps) the chain is chosen, with a tree probe every few tens of
    steps; where it costs about as much (an accelerator), a tree that keeps more is chosen."""
    tree = jaxspec.Tree(budget=32, depth=5, top_k=4)
    arms = KS + (tree,)
    pick = lambda est, costs: arms[int(policy.choose(est, arms, jnp.asarray(costs, jnp.float32), ONE, LIVE))]

    def run(costs, tree_tokens, chain_accepted=2, steps=200):
        est, chosen = _after(10, 5, chain_accepted), []
        for _ in range(steps):
            arm = pick(est, costs)
            chosen.append(arm)
            if arm == tree:
                est = policy.update_tree(est, jnp.asarray([tree_tokens - 1], jnp.int32), LIVE, ONE)
            else:
                est = policy.update(est, jnp.int32(arm), jnp.asarray([min(chain_accepted, arm)], jnp.int32), LIVE, ONE)
        return chosen

    cpu = run([1.0, 1.3, 1.6, 2.3, 3.9], tree_tokens=3.6)          # the tree keeps 0.6 more, at 1.6 more steps
    probes = [i for i, arm in enumerate(cpu) if arm == tree]
    assert 2 <= len(probes) <= 12 and all(cpu[i] in (1, 2, 5) for i in range(len(cpu)) if i not in probes), probes
    gpu = run([1.0, 1.02, 1.04, 1.1, 1.15], tree_tokens=3.6)         # verifying 33 tokens ~ one
    assert gpu.count(tree) > 150
    # no tree evidence yet: the tree counts as the K = 5 chain, so a costlier tree is not taken first
    assert pick(_after(10, 5, 2), [1.0, 1.3, 1.6, 2.3, 3.9]) != tree
    assert not policy.speculation_can_pay(arms, [1.1, 2.0, 3.0, 7.0, 8.0], [0.5])


def test_ngram_context_is_its_match_length_and_priors_come_from_metadata():
    from jaxspec.drafters.base import Context
    history = jnp.asarray([[5, 6, 7, 8, 5, 6, 7, 0], [1, 2, 3, 4, 9, 9, 9, 9], [4, 1, 2, 3, 2, 0, 0, 0]])
    length = jnp.asarray([7, 4, 5])                          # last tokens: 5 6 7 | 1 2 3 4 | 4 1 2 3 2
    ctx = Context(history[jnp.arange(3), length - 1], history, length, {}, jnp.zeros((0, 3, 1, 4)))
    ng = NGram(max_ngram=3)
    assert ng.context({}, (), ctx).tolist() == [3, 0, 1]
    assert ng.prior_acceptance == (0.0, 0.4, 0.6, 0.8) and NGram(4, 2).prior_acceptance[-1] == 0.8
    meta = {"heldout_acceptance": {"per_position_acceptance": [0.31, 0.1]}}
    ecfg = EagleConfig.for_target(TINY, draft_vocab_size=TINY.vocab_size)
    params = init_eagle_params(ecfg, jax.random.PRNGKey(1))
    assert Eagle(params, ecfg, meta).prior_acceptance == (0.31,) and Eagle(params, ecfg).prior_acceptance == (0.5,)


def _drafters():
    ecfg = EagleConfig.for_target(TINY, draft_vocab_size=TINY.vocab_size)
    mcfg = MTPConfig.for_target(TINY, num_modules=2, draft_vocab_size=TINY.vocab_size)
    return {"ngram": NGram(), "draft": DraftModel(truncated(tiny_model(), 1)),
            "eagle": Eagle(init_eagle_params(ecfg, jax.random.PRNGKey(1)), ecfg),
            "mtp": MTP(init_mtp_params(mcfg, jax.random.PRNGKey(2), scale=0.5), mcfg)}


@pytest.fixture
def scrambled_k(monkeypatch):
    """Every K of the loop in a scrambled order: the step's K is a hash of the policy state, and
    fixed costs under which speculation can pay (no timing)."""
    fake = lambda model, drafter, ks, *a: {"costs": np.linspace(1.0, 2.2, len(ks)).astype(np.float32),
                                           "errors": np.zeros(len(ks), np.float32), "seconds": 0.0}
    monkeypatch.setattr(GEN, "step_costs", fake)
    monkeypatch.setattr(programs, "_PROGRAMS", programs._PROGRAMS.__class__())   # none traced with the real choice
    monkeypatch.setattr(policy, "choose", lambda est, ks, costs, context, active: (
        jnp.floor(est.trials.sum() * 13.7) + est.plain_run + est.since_tree).astype(jnp.int32) % len(ks))


@pytest.mark.parametrize("kind", ["ngram", "draft", "eagle", "mtp"])
def test_adaptive_greedy_is_lossless_while_k_switches(kind, scrambled_k):
    m = tiny_model()
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6, 7], [9] * 12, [3, 8]]
    plain = jaxspec.generate(m, prompts, max_new_tokens=40).tokens
    out = jaxspec.generate(m, prompts, max_new_tokens=40, drafter=_drafters()[kind], num_draft_tokens=5)
    assert out.tokens == plain
    used = {k for k, n in out.stats.steps_per_k.items() if n}
    assert 0 in used and len(used) >= 3, out.stats.steps_per_k     # plain steps and speculative steps
    assert sum(out.stats.steps_per_k.values()) == out.stats.target_steps


def test_self_drafting_accepts_everything_across_plain_steps(scrambled_k):
    """The target as its own draft model, K switching: plain steps leave the draft cache behind and
    the next propose feeds what they added (drafters.base.catch_up); any slot it got wrong would
    make a draft differ from the target's greedy token."""
    m = tiny_model()
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6, 7], [3, 8]]
    out = jaxspec.generate(m, prompts, max_new_tokens=60, drafter=DraftModel(m), num_draft_tokens=5)
    assert out.tokens == jaxspec.generate(m, prompts, max_new_tokens=60).tokens
    assert out.stats.steps_per_k[0] >= 3 and out.stats.acceptance_rate == 1.0, out.stats.steps_per_k


def test_adaptive_sampling_keeps_the_target_distribution(scrambled_k):
    """The joint law of the first three tokens (24,000 rows) while K switches between steps."""
    target = tiny_model(V8, seed=2, scale=0.8)
    prompt, rows, sampling = [1, 5, 2], 24_000, Sampling(temperature=1.0)
    exact = _exact_joint(target, prompt, sampling)
    out = jaxspec.generate(target, [prompt] * rows, max_new_tokens=3, sampling=sampling,
                           drafter=DraftModel(tiny_model(V8, seed=3, scale=0.8)), num_draft_tokens=2, seed=5)
    assert len({k for k, n in out.stats.steps_per_k.items() if n}) >= 2, out.stats.steps_per_k
    counts = np.bincount([t[0] * 64 + t[1] * 8 + t[2] for t in out.tokens], minlength=512)
    keep = exact * rows >= 5
    expected, observed = exact[keep] * rows, counts[keep].astype(float)
    pvalue = stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue
    tvd = 0.5 * np.abs(counts / rows - exact).sum()
    assert counts[exact == 0].sum() == 0 and pvalue > 1e-3 and tvd < 0.05, (pvalue, tvd)


def test_plain_decoding_when_speculation_cannot_pay(monkeypatch):
    fake = {"costs": np.asarray([1.1, 3.5, 7.0], np.float32), "errors": np.zeros(3, np.float32), "seconds": 0.0}
    monkeypatch.setattr(GEN, "step_costs", lambda *a, **k: fake)
    m = tiny_model()
    with pytest.warns(UserWarning, match="NGram: no draft length is expected to pay.*decoding plainly"):
        out = jaxspec.generate(m, [[1, 2, 3]], max_new_tokens=10, drafter=NGram(), num_draft_tokens=5)
    assert out.tokens == jaxspec.generate(m, [[1, 2, 3]], max_new_tokens=10).tokens
    assert out.stats.steps_per_k == {0: out.stats.target_steps} and out.stats.acceptance_rate is None
    assert out.stats.note == ("decoded plainly; on this machine a step of K=2 costs 3.50, more than the 3 tokens it "
                              "can emit, K=5 costs 7.00, more than the 6 tokens it can emit (plain steps; per-token "
                              "acceptance); the drafter's prior acceptance is at most 0.80"), out.stats.note
    assert not jaxspec.generate(m, [[1, 2, 3]], max_new_tokens=10, drafter=NGram(), num_draft_tokens=5,
                                adaptive=False).stats.decoded_plainly
