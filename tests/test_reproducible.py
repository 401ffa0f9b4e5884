"""Seeded runs repeat: sampled decoding with adaptive K gives the same tokens in two processes, and
the step costs the policy uses can be pinned."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import jaxspec
from jaxspec import costs
from jaxspec.drafters import NGram

from .conftest import tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A tiny target and a random EAGLE head whose recorded held-out acceptance makes speculation pay, so
# the adaptive policy's choice of K (from the step costs) decides which random numbers are drawn.
RUN = """
import json, jax, numpy as np, jaxspec
from jaxspec.drafters import Eagle
from jaxspec.heads import EagleConfig, init_eagle_params
from tests.conftest import TINY, tiny_model
cfg = EagleConfig.for_target(TINY, draft_vocab_size=TINY.vocab_size, feature_layers=(0, 1))
head = Eagle(init_eagle_params(cfg, jax.random.PRNGKey(3), scale=0.3), cfg,
             {"heldout_acceptance": {"per_position_acceptance": [0.9]}})
out = jaxspec.generate(tiny_model(), [[1, 2, 3, 1, 2, 3, 1, 2], [7, 8, 9]], max_new_tokens=40, drafter=head,
                       num_draft_tokens=4, sampling=jaxspec.Sampling(temperature=0.7), seed=11)
print(json.dumps({"tokens": out.tokens, "steps_per_k": out.stats.steps_per_k,
                  "step_costs": out.stats.step_costs}))
"""


def _run_in_new_process(cache_dir) -> dict:
    env = {**os.environ, "JAXSPEC_CACHE": str(cache_dir), "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-c", RUN], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_two_processes_same_seed_sampled_adaptive_eagle_give_the_same_tokens(tmp_path):
    first = _run_in_new_process(tmp_path)
    assert os.path.isfile(tmp_path / costs.COSTS_FILE)          # the first process measured and kept its costs
    second = _run_in_new_process(tmp_path)
    assert second["tokens"] == first["tokens"]
    assert second["step_costs"] == first["step_costs"] and second["steps_per_k"] == first["steps_per_k"]
    assert sum(n for k, n in first["steps_per_k"].items() if int(k) > 0) > 0   # it did speculate


def test_pinned_step_costs_decide_the_policy_and_kept_costs_outlive_the_process_cache():
    m, prompt = tiny_model(), [[1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2]]
    with pytest.warns(UserWarning, match="decoding plainly"):
        dear = jaxspec.generate(m, prompt, max_new_tokens=12, drafter=NGram(), num_draft_tokens=3,
                                step_costs={0: 1.0, 1: 50.0, 2: 60.0, 3: 70.0})      # K = 1 is not an arm
    assert dear.stats.decoded_plainly and dear.stats.step_costs == {0: 1.0, 2: 60.0, 3: 70.0}
    cheap = jaxspec.generate(m, prompt, max_new_tokens=12, drafter=NGram(), num_draft_tokens=3,
                             step_costs={"0": 1.0, "1": 1.01, "2": 1.02, "3": 1.03})   # as read back from JSON
    assert cheap.stats.steps_per_k[3] > 0 and cheap.tokens == dear.tokens
    with pytest.raises(ValueError, match="missing \\[3\\]"):
        jaxspec.generate(m, prompt, max_new_tokens=4, drafter=NGram(), num_draft_tokens=3,
                         step_costs={0: 1.0, 2: 1.0})
    measured = jaxspec.generate(m, [[4, 5]], max_new_tokens=6, drafter=NGram(), num_draft_tokens=3).stats
    costs.clear()                                               # a new process: only the cost file is left
    again = jaxspec.generate(m, [[6, 7, 8]], max_new_tokens=6, drafter=NGram(), num_draft_tokens=3).stats
    assert again.step_costs == measured.step_costs and again.compile_seconds == 0.0
    costs.clear(disk=True)
    assert not os.path.exists(os.path.join(os.environ["JAXSPEC_CACHE"], costs.COSTS_FILE))
    assert np.isfinite(list(measured.step_costs.values())).all()


def test_cost_timing_runs_the_calls_own_programs_and_donates_their_caches(monkeypatch):
    """A cold adaptive call compiles the prompts' pass and the speculative loop once each, nothing for
    the timing alone (its plain steps are the loop's K = 0 arm without the drafter's sync), and every
    timed call gives up its copy of the KV cache as the loop does (undonated, the cache was copied
    every call: K = 3 looked 20% cheaper than it ran at batch 16)."""
    import jax

    from jaxspec import generation
    from jaxspec.decode import programs
    from jaxspec.drafters import Eagle
    from jaxspec.heads import EagleConfig, init_eagle_params

    from .conftest import TINY
    calls, real = [], generation.per_step

    def recording(prepare, steps):
        def prepared(n):
            calls.append(prepare(n))
            return calls[-1]
        return real(prepared, steps)

    monkeypatch.setattr(generation, "per_step", recording)
    monkeypatch.setattr(programs, "_PROGRAMS", programs._PROGRAMS.__class__())    # a cold process
    costs.clear(disk=True)
    cfg = EagleConfig.for_target(TINY, draft_vocab_size=TINY.vocab_size)
    eagle = Eagle(init_eagle_params(cfg, jax.random.PRNGKey(1)), cfg)
    before = dict(programs.TRACES)
    out = jaxspec.generate(tiny_model(), [[1, 2, 3]], max_new_tokens=16, drafter=eagle, num_draft_tokens=2)
    traced = {k: n - before.get(k, 0) for k, n in programs.TRACES.items() if n - before.get(k, 0)}
    assert traced == {"prefill": 1, "speculative": 1}, traced
    assert out.stats.cost_timing_seconds > 0 and sorted(out.stats.step_costs) == [0, 2]
    assert all(len(c.args) == 17 for c in calls)
    plain = [c for c in calls if not bool(c.args[14])]          # sync off: the reference's plain steps
    assert len(plain) >= 3 and len(calls) >= 3 * len(plain)      # and each of K = 0 and 2 as often
    for call in calls:
        assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(call.args[5]) if x.ndim >= 2)
        assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(call.args[:5]))
