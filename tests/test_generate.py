"""generate(): compile reuse, limits, sampling settings and bad input (tiny random model)."""
from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxspec
from jaxspec.decode import programs
from jaxspec.decode.programs import TRACES
from jaxspec.sampling import Sampling

from .conftest import tiny_model


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()


def test_same_bucket_does_not_recompile(tiny):
    jaxspec.generate(tiny, [[1, 2, 3], [4, 5, 6, 7, 8]], max_new_tokens=10)
    before = TRACES["autoregressive"], TRACES["prefill"]
    out = jaxspec.generate(tiny, [[9, 9, 9, 9, 9, 9, 9], [3, 1]], max_new_tokens=12,
                           sampling=Sampling(temperature=0.8, top_k=5))
    assert (TRACES["autoregressive"], TRACES["prefill"]) == before
    assert out.stats.compile_seconds == 0.0
    assert [len(t) for t in out.tokens] == [12, 12]
    s = out.stats                                    # the prompt pass and the loop are timed apart
    assert s.prefill_seconds > 0 and s.decode_seconds > 0
    assert s.decode_tokens == 2 * 11 and s.target_steps == 11            # the first token comes from the prompt pass
    jaxspec.generate(tiny, [list(range(40))], max_new_tokens=10)  # a new bucket compiles
    assert (TRACES["autoregressive"], TRACES["prefill"]) == (before[0] + 1, before[1] + 1)


def test_greedy_batch_rows_equal_single_rows(tiny):
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [12]]
    batched = jaxspec.generate(tiny, prompts, max_new_tokens=20).tokens
    for p, row in zip(prompts, batched):
        assert jaxspec.generate(tiny, [p], max_new_tokens=20).tokens[0] == row


def test_live_attention_batches_equal_single_rows(tiny):
    """From LIVE_ATTENTION_MIN_BATCH rows on, decode steps attend only over the slots in use (here 3
    blocks of 64 in a 272-slot cache): greedy rows still equal the same prompts decoded one at a time
    (full attention), plain and speculative (fixed and adaptive K)."""
    from jaxspec.drafters import NGram
    from jaxspec.decode.batch import LIVE_ATTENTION_MIN_BATCH
    prompts = [[(7 * i + j) % 90 + 1 for j in range(5 + 17 * i)] for i in range(LIVE_ATTENTION_MIN_BATCH + 1)]
    single = [jaxspec.generate(tiny, [p], max_new_tokens=12).tokens[0] for p in prompts]
    assert max(len(p) for p in prompts) > 128 and len({tuple(r) for r in single}) > 1
    assert jaxspec.generate(tiny, prompts, max_new_tokens=12).tokens == single
    for adaptive in (False, True):
        out = jaxspec.generate(tiny, prompts, max_new_tokens=12, drafter=NGram(), num_draft_tokens=3,
                               adaptive=adaptive)
        assert out.tokens == single


def test_per_row_limits_and_eos(tiny):
    out = jaxspec.generate(tiny, [[1, 2], [3, 4]], max_new_tokens=[3, 9])
    assert [len(t) for t in out.tokens] == [3, 9]
    first = out.tokens[1]
    tiny.tokenizer.eos_token_ids = (first[4],)       # make the 5th token an end-of-sequence
    try:
        stopped = jaxspec.generate(tiny, [[3, 4]], max_new_tokens=9).tokens[0]
    finally:
        tiny.tokenizer.eos_token_ids = ()
    assert stopped == first[:first.index(first[4]) + 1]


def test_seeds_and_top_k_membership(tiny):
    prompts = [[1, 2, 3]] * 4
    s = Sampling(temperature=1.5, top_k=3)
    a = jaxspec.generate(tiny, prompts, max_new_tokens=16, sampling=s, seed=1).tokens
    b = jaxspec.generate(tiny, prompts, max_new_tokens=16, sampling=s, seed=1).tokens
    c = jaxspec.generate(tiny, prompts, max_new_tokens=16, sampling=s, seed=2).tokens
    assert a == b and a != c
    for row in a:  # every token lies in the 3 most likely under the model given its own history
        logits = np.asarray(tiny.logits([[1, 2, 3] + row]))[0, 2:-1]
        for j, tok in enumerate(row):
            assert tok in np.argsort(-logits[j])[:3]


def test_top_p_membership(tiny):
    s = Sampling(temperature=1.0, top_p=0.3)
    row = jaxspec.generate(tiny, [[5, 6]], max_new_tokens=12, sampling=s, seed=3).tokens[0]
    all_logits = np.asarray(tiny.logits([[5, 6] + row]))[0, 1:-1]
    for logits, tok in zip(all_logits, row):
        p = np.exp(logits - logits.max()); p /= p.sum()
        order = np.argsort(-p)
        nucleus = order[:int(np.searchsorted(np.cumsum(p[order]), 0.3)) + 1]
        assert tok in nucleus


@pytest.mark.parametrize("kwargs, match", [
    ({"prompts": [[1, 2], []]}, "prompt 1 is empty"),
    ({"prompts": []}, "non-empty list"),
    ({"prompts": [[1, 999]]}, "outside"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": 600}, "cache capacity"),
    ({"max_new_tokens": 8, "max_cache_len": 9}, "cache capacity"),
    ({"sampling": "greedy"}, "sampling"),
])
def test_bad_generate_input_fails_before_compute(tiny, kwargs, match):
    args = {"prompts": [[1, 2, 3]], "max_new_tokens": 4, **kwargs}
    before = sum(TRACES.values())
    with pytest.raises(ValueError, match=match):
        jaxspec.generate(tiny, args.pop("prompts"), **args)
    assert sum(TRACES.values()) == before


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"min_p": 2.0}, "min_p"),
])
def test_bad_sampling(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sampling(**kwargs)


def test_bad_model_sources(tmp_path):
    with pytest.raises(ValueError, match="smollm2-135m-instruct"):
        jaxspec.load("no-such-model")
    with pytest.raises(ValueError, match="not found"):
        jaxspec.load(str(tmp_path / "missing.gguf"))
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    with pytest.raises(ValueError, match="GGUF"):
        jaxspec.load(str(corrupt))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="neither"):
        jaxspec.load(str(tmp_path / "empty"))


@pytest.mark.slow
def test_truncated_real_gguf(tmp_path):
    from jaxspec.loading.registry import resolve_named
    data = open(resolve_named("smollm2-135m-instruct"), "rb").read(4_000_000)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data)
    with pytest.raises(ValueError, match="cut.gguf"):
        jaxspec.load(str(cut))


def test_compiled_programs_are_bounded(tiny, monkeypatch):
    """Least recently used programs are dropped past MAX_PROGRAMS (each holds many memory maps)."""
    monkeypatch.setattr(programs, "MAX_PROGRAMS", 4)
    monkeypatch.setattr(programs, "_PROGRAMS", programs._PROGRAMS.__class__())
    for n in (3, 40, 100):                                   # three prompt buckets: a prefill and a loop each
        jaxspec.generate(tiny, [[5] * n], max_new_tokens=4)
    assert programs.held() == 4
    before = TRACES["autoregressive"]
    jaxspec.generate(tiny, [[1, 2, 3]], max_new_tokens=4)    # the first bucket was dropped: traced again
    assert TRACES["autoregressive"] == before + 1
    jaxspec.generate(tiny, [[7] * 100], max_new_tokens=4)   # still held
    assert TRACES["autoregressive"] == before + 1


def test_bfloat16_weights_activations_and_cache_decode_losslessly():
    """The dtype accelerators get (jaxspec.load's default there): a bfloat16 target and draft model, chain
    and tree, give the bfloat16 target's plain greedy tokens. (EAGLE and MTP heads in bfloat16 stop
    XLA CPU with "Unsupported element type for DotThunk: BF16 x BF16 = F32"; they run in bfloat16
    on accelerators only.)"""
    import jax.numpy as jnp

    from jaxspec.drafters import DraftModel, NGram
    from jaxspec.model import Model

    from .conftest import TINY, tiny_model

    bf16 = lambda m: Model(TINY, jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), m.params), m.tokenizer, "bf16")
    target = bf16(tiny_model())
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [7, 8, 9]]
    plain = jaxspec.generate(target, prompts, max_new_tokens=16).tokens
    for drafter in (NGram(), DraftModel(bf16(tiny_model(seed=1)))):
        for tree in (None, jaxspec.Tree(8, 3, 2)):
            out = jaxspec.generate(target, prompts, max_new_tokens=16, drafter=drafter, num_draft_tokens=3,
                                   adaptive=False, tree=tree)
            assert out.tokens == plain, (drafter, tree)


@pytest.mark.parametrize("kind", ["plain", "ngram", "eagle adaptive", "ngram tree"])
def test_streaming_hands_over_every_pass_in_order_and_nothing_else(kind):
    """stream=f gets the prompts' pass's token per row, then one call per target pass with each row's
    new tokens ([] for a finished row): joined, exactly the returned tokens, EOS and limits included."""
    from jaxspec.drafters import Eagle, NGram
    from jaxspec.heads import EagleConfig, init_eagle_params
    from jaxspec.tree import Tree

    from .conftest import TINY
    m, prompts = tiny_model(), [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5], [7, 7, 7, 7, 7, 7, 7]]
    ecfg = EagleConfig.for_target(TINY, draft_vocab_size=TINY.vocab_size)
    kw = {"plain": {}, "ngram": {"drafter": NGram(), "adaptive": False},
          "eagle adaptive": {"drafter": Eagle(init_eagle_params(ecfg, jax.random.PRNGKey(1)), ecfg),
                             "step_costs": {0: 1.0, 2: 1.1, 3: 1.2}},
          "ngram tree": {"drafter": NGram(), "adaptive": False, "tree": Tree(6, 3, 2)}}[kind]
    passes = []
    out = jaxspec.generate(m, prompts, max_new_tokens=[20, 9, 14], num_draft_tokens=3, stream=passes.append, **kw)
    assert passes[0] == [[t[0]] for t in out.tokens] and len(passes) == out.stats.target_steps + 1
    assert [sum((p[b] for p in passes), []) for b in range(3)] == out.tokens
    assert out.tokens == jaxspec.generate(m, prompts, max_new_tokens=[20, 9, 14]).tokens


def test_more_draft_tokens_than_can_pay_is_refused():
    from jaxspec.drafters import NGram
    with pytest.raises(ValueError, match="more than can pay.*K <= 16"):
        jaxspec.generate(tiny_model(), [[1, 2, 3]], max_new_tokens=4, drafter=NGram(), num_draft_tokens=17)
