"""Sharded generation (jaxspec/sharding.py) on 8 host devices, in a subprocess (the device count is
fixed when JAX starts): the same tokens as one device on meshes (8, 1), (4, 2), (2, 4)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import pytest

from jaxspec.sharding import make_mesh, param_spec, parse_mesh

from .conftest import child_env

HERE = os.path.dirname(os.path.abspath(__file__))


def test_partition_rules_split_what_divides_and_replicate_the_rest():
    mesh = make_mesh(1, 1)
    assert parse_mesh("data=1").shape == {"data": 1, "model": 1}
    with pytest.raises(ValueError, match="data=D,model=M"):
        parse_mesh("rows=2")
    with pytest.raises(ValueError, match="needs 4 devices"):
        make_mesh(2, 2, devices=jax.devices()[:1] * 2)

    class Fake:                                   # a mesh of model = 4 for the rules alone
        shape = {"data": 2, "model": 4}
    fake = Fake()
    # SmolLM2: 9 query and 3 key/value heads stay whole on 4 devices; widths and vocabulary split
    assert param_spec("wq", (576, 9, 64), fake) == jax.sharding.PartitionSpec(None, None, None)
    assert param_spec("wk", (576, 3, 64), fake) == jax.sharding.PartitionSpec(None, None, None)
    assert param_spec("w_gate", (576, 1536), fake) == jax.sharding.PartitionSpec(None, "model")
    assert param_spec("w_down", (30, 1536, 576), fake) == jax.sharding.PartitionSpec(None, "model", None)
    assert param_spec("embed", (49152, 576), fake) == jax.sharding.PartitionSpec("model", None)
    assert param_spec("wq", (32, 8, 4), fake) == jax.sharding.PartitionSpec(None, "model", None)
    assert param_spec("norm", (576,), fake) == jax.sharding.PartitionSpec(None)
    assert mesh.shape == {"data": 1, "model": 1}


REAL_TEST = "test_sharded_adaptive_drafters_on_smollm2"


@pytest.fixture(scope="module")
def sharded(request):
    """tests/sharded_generate.py on 8 host devices: {"tiny": ...}, and "real" (SmolLM2 and its shipped
    drafters, adaptive) when that test is selected too: one subprocess starts JAX once for both."""
    real = any(item.name == REAL_TEST for item in request.session.items)
    env = child_env(devices=8)
    done = subprocess.run([sys.executable, os.path.join(HERE, "sharded_generate.py")] + (["real"] if real else []),
                          env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check_greedy(sharded: dict) -> None:
    for name, runs in sharded["greedy"].items():
        assert set(runs) == {"one", *sharded["meshes"]}
        for shape, rows in runs.items():
            for i, (a, b) in enumerate(zip(runs["one"], rows)):
                assert a == b or sharded["top2_gap"][f"{name} {shape} row {i}"] < 1e-3, (name, shape, i)


def test_sharded_greedy_generation_gives_the_single_device_tokens(sharded):
    """Plain decoding, every drafter (K = 3) and an EAGLE tree on (8, 1) and (2, 4), 8 greedy rows of 8
    prompt lengths (in one batch with the same prompts sampled); a row may depart only where the
    single-device top-2 logits lie within 1e-3 (a float near-tie)."""
    _check_greedy(sharded["tiny"])


def test_sharded_sampling_repeats_with_the_seed(sharded):
    for name, runs in sharded["tiny"]["sampled"].items():
        assert all(rows == runs["one"] for rows in runs.values()), name


def test_rows_stay_on_their_device(sharded):
    """On a (8, 1) mesh no row's work crosses devices: the compiled loops hold all-reduces for batch-wide
    decisions and nothing that gathers rows (per-row indexing through jaxspec/rowwise.py). Before it,
    each loop held 6-128 all-gathers from per-row scatters and gathers."""
    found = sharded["tiny"]["collectives"]
    assert set(found) == {"plain", "ngram", "draft", "eagle", "mtp", "eagle tree"}
    assert all(kinds == [] for kinds in found.values()), found


@pytest.mark.slow
def test_sharded_adaptive_drafters_on_smollm2(sharded):
    """SmolLM2's shipped EAGLE (with a tree offered), MTP, draft model and NGram, adaptive, and EAGLE and
    MTP at K = 2 fixed, on (8, 1), (4, 2), (2, 4): greedy rows equal one device's, the same arms taken,
    sampled rows repeat with the seed, no row crossing devices. Adaptive EAGLE on (4, 2) used to abort in
    XLA's collectives; sampled EAGLE and MTP drafts on (2, 4) used to differ (heads/eagle.to_target_logits)."""
    real = sharded["real"]
    assert set(real["greedy"]) == {"eagle", "mtp", "draft", "ngram", "eagle K=2", "mtp K=2"}
    assert real["meshes"] == ["(8, 1)", "(4, 2)", "(2, 4)"]
    _check_greedy(real)
    for name, arms in real["arms"].items():                     # the same arms as one device took ...
        assert all(steps == arms["one"] for steps in arms.values()), (name, arms)
    for name in ("eagle", "mtp", "draft"):     # ... switching between arms (costs pinned at the prior's break-even)
        steps = real["arms"][name]["one"]
        assert sum(n > 0 for n in steps.values()) >= 2, (name, steps)
    for name, runs in real["sampled"].items():
        assert all(rows == runs["one"] for rows in runs.values()), name
    assert all(kinds == [] for kinds in real["collectives"].values()), real["collectives"]


def test_rows_go_over_data_and_weights_over_model(sharded):
    specs = sharded["tiny"]["specs"]
    assert any("'data'" in s for s in specs["plain (8, 1)"])
    for name in ("plain", "eagle", "draft"):
        assert any("'model'" in s for s in specs[f"{name} (2, 4)"]), (name, specs[f"{name} (2, 4)"])
        assert any("'data'" in s for s in specs[f"{name} (2, 4)"])


from .test_train_loop import tiny_data  # noqa: E402,F401  (the fixture: self-distilled data of a tiny target)


@pytest.mark.slow                       # several JAX processes: make test, not make test-fast
def test_sharded_training_matches_one_device_and_resumes_on_another_mesh(tiny_data, tmp_path):  # noqa: F811
    """EAGLE steps with the batch over "data" and weights and optimizer state over "model": the losses
    equal one device's within 1e-5 on (8, 1), (4, 2) and (2, 4); a run stopped after step 2 on (4, 2)
    resumes on (8, 1) and on (1, 1) and its step 3 equals the uninterrupted run's. MTP and draft-model
    steps with the batch over every device (the default mesh) equal one device's too."""
    import numpy as np

    _, data_dir, _ = tiny_data
    env = child_env(devices=8)
    done = subprocess.run([sys.executable, os.path.join(HERE, "sharded_train.py"), data_dir, str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    ref = dict((s, v) for s, v in runs["(1, 1)"])
    assert sorted(ref) == [1, 2, 3]
    for shape in ("(8, 1)", "(4, 2)", "(2, 4)"):
        got = dict((s, v) for s, v in runs[shape])
        assert sorted(got) == [1, 2]
        np.testing.assert_allclose([got[1], got[2]], [ref[1], ref[2]], rtol=1e-6, atol=1e-5, err_msg=shape)
    for shape in ("(8, 1)", "(1, 1)"):
        got = dict((s, v) for s, v in runs[f"resumed on {shape}"])
        assert sorted(got) == [1, 2, 3]
        np.testing.assert_allclose(got[3], ref[3], rtol=1e-6, atol=1e-5, err_msg=shape)
    for kind in ("mtp", "draft"):
        one, split = runs[f"{kind} (1, 1)"], runs[f"{kind} default"]
        assert [s for s, _ in split] == [s for s, _ in one] == [1, 2], kind
        # float32 sums over 8 shards in another order: the draft's loss (~50) moves by 2e-7 relative
        np.testing.assert_allclose([v for _, v in split], [v for _, v in one], rtol=1e-6, atol=1e-5, err_msg=kind)


@pytest.mark.slow                       # several JAX processes: make test, not make test-fast
def test_two_processes_generate_and_train_as_one(tiny_data, tmp_path):  # noqa: F811
    """jax.distributed on localhost (CPU collectives over gloo), two processes of 2 devices each:
    greedy generation on the 4-device mesh, plain and EAGLE (adaptive: the step costs are process 0's),
    gives one process's tokens in both, and one EAGLE step the one-device loss. (Every other drafter on a
    mesh: test_sharded_greedy_generation_gives_the_single_device_tokens.)"""
    import socket

    import numpy as np

    import jaxspec
    from jaxspec.train import loop

    from .conftest import tiny_model
    from .sharded_generate import PROMPTS, drafters
    from .test_train_loop import TRAINERS, chain_model

    _, data_dir, _ = tiny_data
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = child_env()                                          # distributed_run.py adds 2 devices
    script, out = os.path.join(HERE, "distributed_run.py"), str(tmp_path / "run")
    procs = [subprocess.Popen([sys.executable, script, str(i), str(port), data_dir, out], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=1200)
        assert p.returncode == 0, stderr[-3000:]
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    for name in ("plain", "eagle"):
        one = jaxspec.generate(tiny_model(), PROMPTS, max_new_tokens=12, drafter=drafters()[name],
                               num_draft_tokens=3).tokens
        assert results[0]["tokens"][name] == results[1]["tokens"][name] == one, name
    train, kw, _ = TRAINERS["eagle"]
    cfg = loop.TrainConfig(steps=1, lr=3e-3, warmup=0, save_every=1, eval_every=0, log_every=1)
    train(chain_model(), data_dir, str(tmp_path / "one"), cfg, **kw)
    ref = [r["loss"] for r in loop.read_metrics(str(tmp_path / "one")) if "loss" in r]
    assert len(ref) == 1 and results[0]["losses"] == results[1]["losses"]
    np.testing.assert_allclose(results[0]["losses"], ref, rtol=0, atol=1e-5)
