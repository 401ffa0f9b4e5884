"""The speculative loop is lossless: greedy equals plain decoding token for token, sampling
draws from the target's own distribution; plus statistics, EOS handling and bad input."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from scipy import stats

import jaxspec
from jaxspec.bench import make_drafter
from jaxspec.config import ModelConfig
from jaxspec.drafters import MTP, DraftModel, Eagle, NGram, truncated
from jaxspec.heads import EagleConfig, MTPConfig, init_eagle_params, init_mtp_params
from jaxspec.sampling import Sampling, probs_from_logits, row_params

from .conftest import TINY, tiny_model

# ---------------------------------------------------------------- real SmolLM2, greedy


@pytest.fixture(scope="module")
def plain_answers(smollm, chat_prompts):
    return chat_prompts, jaxspec.generate(smollm, chat_prompts, max_new_tokens=64).tokens


@pytest.mark.parametrize("K", [1, 3, 5])
@pytest.mark.parametrize("kind", ["ngram", "truncated", "eagle", "mtp", "draft"])
def test_greedy_lossless_on_smollm2(smollm, plain_answers, kind, K):
    prompts, expected = plain_answers
    drafter = (DraftModel(truncated(smollm, 4)) if kind == "truncated"
               else make_drafter(kind, smollm))             # eagle, mtp, draft: shipped in checkpoints/
    out = jaxspec.generate(smollm, prompts, max_new_tokens=64, drafter=drafter, num_draft_tokens=K, adaptive=False)
    assert len({len(p) for p in prompts}) == 3
    for i in range(len(prompts)):
        assert out.tokens[i] == expected[i], f"row {i} differs from plain decoding"
    assert all(len(t) == 64 for t in out.tokens)
    s = out.stats
    assert 1.0 <= s.mean_accepted_length <= K + 1 and len(s.per_position_acceptance) == K
    assert s.target_steps < 64                    # fewer target passes than tokens


# ---------------------------------------------------------------- tiny models

def test_self_drafting_accepts_everything():
    m = tiny_model()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9]]
    plain = jaxspec.generate(m, prompts, max_new_tokens=25).tokens
    out = jaxspec.generate(m, prompts, max_new_tokens=25, drafter=DraftModel(m), num_draft_tokens=4, adaptive=False)
    assert out.tokens == plain
    assert out.stats.acceptance_rate == 1.0 and out.stats.per_position_acceptance == [1.0] * 4
    assert out.stats.mean_accepted_length == 5.0
    assert out.stats.target_steps == 5            # 1 from prefill + 5 steps x 5 tokens, capped at 25


def test_eos_inside_an_accepted_block_ends_the_row():
    m = tiny_model()
    plain = jaxspec.generate(m, [[4, 5, 6]], max_new_tokens=30).tokens[0]
    eos = plain[7]
    m.tokenizer.eos_token_ids = (eos,)
    try:
        out = jaxspec.generate(m, [[4, 5, 6], [1, 2]], max_new_tokens=30, drafter=DraftModel(m),
                               num_draft_tokens=5, adaptive=False)
        ref = jaxspec.generate(m, [[4, 5, 6], [1, 2]], max_new_tokens=30)
    finally:
        m.tokenizer.eos_token_ids = ()
    assert out.tokens[0] == plain[:plain.index(eos) + 1]   # accepted drafts after EOS are dropped
    assert out.tokens == ref.tokens


def test_exact_max_new_tokens_per_row():
    m = tiny_model()
    out = jaxspec.generate(m, [[1, 2], [3, 4, 5]], max_new_tokens=[7, 13], drafter=DraftModel(m),
                           num_draft_tokens=5, adaptive=False)
    assert [len(t) for t in out.tokens] == [7, 13]


def test_seeds():
    m = tiny_model()
    d = DraftModel(tiny_model(seed=1))
    s = Sampling(temperature=1.0)
    run = lambda seed: jaxspec.generate(m, [[1, 2, 3]] * 3, max_new_tokens=12, sampling=s, drafter=d,
                                        num_draft_tokens=3, adaptive=False, seed=seed).tokens
    assert run(4) == run(4) and run(4) != run(5)


# joint distribution of the first three tokens: speculative sampling vs the exact target law
V8 = ModelConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                 num_kv_heads=1, head_dim=8, max_position_embeddings=64)
ROWS = 24_000


def _exact_joint(model, prompt, sampling):
    """P(t1, t2, t3) under plain sampling with the processed probabilities, all 8^3 sequences. One causal
    pass over the 64 sequences prompt + [a, b] holds every law needed: t1's at the prompt's last
    position, t2's after a, t3's after (a, b)."""
    pairs = np.array([(a, b) for a in range(8) for b in range(8)], np.int32)          # [64, 2]
    ids = np.concatenate([np.tile(np.asarray(prompt, np.int32), (64, 1)), pairs], axis=1)
    logits = model.logits(ids)[:, len(prompt) - 1:]                                   # [64, 3, V]
    probs = np.asarray(probs_from_logits(logits, row_params(sampling, 64)), np.float64)
    p1, p2, p3 = probs[0, 0], probs[::8, 1], probs[:, 2].reshape(8, 8, 8)             # [a], [a, b], [a, b, c]
    return (p1[:, None, None] * p2[:, :, None] * p3).reshape(-1)


def assert_follows_law(rows: list, exact: np.ndarray, who) -> None:
    """The first 3 tokens of ROWS sampled rows against the exact joint law [512]: nothing outside its
    support, chi-square p > 1e-3 and total variation < 0.05."""
    counts = np.bincount(np.array([t[0] * 64 + t[1] * 8 + t[2] for t in rows]), minlength=512)
    assert counts[exact == 0].sum() == 0, f"{who}: sequences outside the allowed set"
    keep = exact * ROWS >= 5
    expected, observed = exact[keep] * ROWS, counts[keep].astype(float)
    pvalue = stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue
    tvd = 0.5 * np.abs(counts / ROWS - exact).sum()
    assert pvalue > 1e-3 and tvd < 0.05, f"{who}: p={pvalue:.2e}, TVD={tvd:.3f}"


@pytest.mark.parametrize("sampling", [Sampling(temperature=1.0), Sampling(temperature=0.9, top_k=4),
                                      Sampling(temperature=1.2, top_p=0.8)], ids=["t1", "topk", "topp"])
def test_sampled_speculative_matches_target_distribution(sampling):
    target = tiny_model(V8, seed=2, scale=0.8)
    prompt = [1, 5, 2]
    exact = _exact_joint(target, prompt, sampling)
    mtp_cfg = MTPConfig.for_target(V8, num_modules=2, draft_vocab_size=V8.vocab_size)
    mtp = MTP(init_mtp_params(mtp_cfg, jax.random.PRNGKey(4), scale=0.5), mtp_cfg)
    eagle_cfg = EagleConfig.for_target(V8, draft_vocab_size=V8.vocab_size)
    eagle = Eagle(init_eagle_params(eagle_cfg, jax.random.PRNGKey(5), scale=0.5), eagle_cfg)
    for drafter in (NGram(), DraftModel(tiny_model(V8, seed=3, scale=0.8)), mtp, eagle):
        out = jaxspec.generate(target, [prompt] * ROWS, max_new_tokens=3, sampling=sampling,
                               drafter=drafter, num_draft_tokens=2, adaptive=False, seed=11)
        assert_follows_law(out.tokens, exact, drafter)
        if not isinstance(drafter, NGram):
            assert 0 < out.stats.acceptance_rate < 1     # the draft really differs from the target


@pytest.mark.parametrize("sampling", [Sampling(temperature=1.5, top_k=3), Sampling(temperature=1.5, top_p=0.5),
                                      Sampling(temperature=1.5, min_p=0.3)], ids=["topk", "topp", "minp"])
def test_every_speculative_token_is_in_the_allowed_set(sampling):
    m = tiny_model()
    params = row_params(sampling, 1)
    for drafter in (NGram(), DraftModel(tiny_model(seed=1))):
        out = jaxspec.generate(m, [[1, 2, 3, 1, 2], [7, 8]], max_new_tokens=20, sampling=sampling,
                               drafter=drafter, num_draft_tokens=3, adaptive=False, seed=2)
        for prompt, row in zip([[1, 2, 3, 1, 2], [7, 8]], out.tokens):
            logits = m.logits([prompt + row])[:, len(prompt) - 1:-1]       # causal: one pass per row
            allowed = np.asarray(probs_from_logits(logits, params))[0] > 0  # [len(row), V]
            for j, tok in enumerate(row):
                assert allowed[j, tok], f"{drafter}: token {tok} outside the {sampling} set"


def test_ngram_proposes_the_continuation_of_the_latest_match():
    from jaxspec.drafters.base import Context
    hist = np.zeros((1, 32), np.int32)
    seq = [5, 6, 7, 8, 1, 5, 6, 9, 2, 5, 6]           # "5 6" last seen before 9, earlier before 7
    hist[0, :len(seq)] = seq
    ctx = Context(last=np.array([6]), history=hist, history_len=np.array([len(seq)]), sampling={},
                  features=None)
    tokens, probs, _ = NGram(max_ngram=2, min_ngram=1).propose({}, (), ctx, None, 4)
    assert probs is None
    assert np.asarray(tokens).tolist() == [[9, 2, 5, 6]]


def test_bad_speculative_input():
    m = tiny_model()
    with pytest.raises(ValueError, match="num_draft_tokens"):
        jaxspec.generate(m, [[1, 2]], max_new_tokens=4, drafter=NGram(), num_draft_tokens=0, adaptive=False)
    other_vocab = tiny_model(ModelConfig(**{**TINY.__dict__, "vocab_size": 100}))
    with pytest.raises(ValueError, match="vocabulary size 100"):
        jaxspec.generate(m, [[1, 2]], max_new_tokens=4, drafter=DraftModel(other_vocab))
    with pytest.raises(ValueError, match="min_ngram"):
        NGram(max_ngram=1, min_ngram=2)
    with pytest.raises(ValueError, match="drafter"):
        jaxspec.generate(m, [[1, 2]], max_new_tokens=4, drafter="ngram")
    with pytest.raises(ValueError, match="K\\+1"):
        jaxspec.generate(m, [[1] * 500], max_new_tokens=10, drafter=NGram(), num_draft_tokens=5, adaptive=False)


def test_draft_model_for_another_tokenizer(smollm, tmp_path):
    """Same vocabulary size, different token table: refused before any compute."""
    import tokenizers

    backend = tokenizers.Tokenizer.from_str(smollm.tokenizer.backend.to_str())
    backend.add_tokens(["<zz-extra>"])                      # ids shift for the tail of the table
    other = jaxspec.model.Model(config=smollm.config, params=smollm.params,
                                tokenizer=type(smollm.tokenizer)(backend, eos_token_ids=(2,)))
    assert other.config.vocab_size == smollm.config.vocab_size
    with pytest.raises(ValueError, match="another tokenizer"):
        jaxspec.generate(smollm, [[1, 2]], max_new_tokens=4, drafter=DraftModel(truncated(other, 2)))


def test_a_drafter_that_breaks_the_protocol_gets_a_clear_error():
    class WideDraft(NGram):                       # proposes one token too many
        def propose(self, params, state, ctx, key, num_draft):
            tokens, probs, state = super().propose(params, state, ctx, key, num_draft + 1)
            return tokens, probs, state

    class GrowingState(NGram):                    # its state changes shape from step to step
        def init(self, params, prompts, lengths, capacity, features):
            return jax.numpy.zeros((1,))

        def commit(self, params, state, ctx, num_accepted):
            return jax.numpy.concatenate([state, state])

    m = tiny_model()
    with pytest.raises(ValueError, match="WideDraft.propose must return tokens int32\\[1, 3\\]"):
        jaxspec.generate(m, [[1, 2, 3]], max_new_tokens=4, drafter=WideDraft(), num_draft_tokens=3, adaptive=False)
    with pytest.raises(ValueError, match="GrowingState.commit changed its state"):
        jaxspec.generate(m, [[1, 2, 3]], max_new_tokens=4, drafter=GrowingState(), num_draft_tokens=3,
                         adaptive=False)
