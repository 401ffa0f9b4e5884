"""train/joint.py: one pass of the target feeds EAGLE, MTP and the draft model; a run resumes exactly
from its own state, and from its committed fallback when that state is gone (train/fallback.py)."""
from __future__ import annotations

import copy
import json
import os
import shutil

import jax
import numpy as np
import pytest

from jaxspec.bench.report import compare_markdown, report
from jaxspec.drafters import MTP, DraftModel, Eagle
from jaxspec.train import fallback, loop
from jaxspec.train.compare import compare_runs, write_comparison
from jaxspec.train.curve import run_curve, write_curve
from jaxspec.train.draft import draft_setup
from jaxspec.train.eagle import eagle_setup
from jaxspec.train.joint import JointConfig, evaluate_fallback, run_dir, train_heads
from jaxspec.train.mtp import mtp_setup

from .test_train_loop import DRAFT_SHAPE, LAYERS, tiny_data  # noqa: F401  (the fixture)

KINDS = ("eagle", "mtp", "draft")


def _setups(model, data_dir):
    return [eagle_setup(model, data_dir, 64, 3, LAYERS, tied_head=True),
            mtp_setup(model, data_dir, 2, 64, LAYERS),
            draft_setup(model, data_dir, feature_layers=LAYERS, **DRAFT_SHAPE)]


def _run(model, data_dir, tmp_path, name: str, until=None, bf16: bool = False, optimizer: str = "adamw"):
    cfg = JointConfig(name=name, steps=6, lrs={"eagle": 3e-3, "mtp": 3e-3, "draft": 3e-3}, warmup=2,
                      tokens_per_batch=512, save_every=2, log_every=1, rewarm=3, bf16=bf16, optimizer=optimizer)
    outs = {kind: str(tmp_path / name / kind) for kind in KINDS}
    return train_heads(model, data_dir, _setups(model, data_dir), outs, cfg, str(tmp_path / name / "fallback"),
                       until=until, progress=False)


def _records(name: str, kind: str) -> list[dict]:
    return [r for r in loop.read_metrics(os.path.join(run_dir(name), kind)) if "loss" in r]


def test_joint_run_trains_every_head_and_resumes_exactly(tiny_data, tmp_path):  # noqa: F811
    """Every head learns from the shared pass (bfloat16 operands); a run stopped after step 3 and run again
    computes what the uninterrupted run did (its own Orbax state: same losses to 1e-5)."""
    model, data_dir, _ = tiny_data
    drafters = _run(model, data_dir, tmp_path, "whole", bf16=True)
    assert isinstance(drafters["eagle"], Eagle) and isinstance(drafters["mtp"], MTP)
    assert isinstance(drafters["draft"], DraftModel)
    for kind in KINDS:
        losses = [r["loss"] for r in _records("whole", kind)]
        assert len(losses) == 6 and losses[-1] < losses[0], (kind, losses)
        assert drafters[kind].metadata.training["joint"] and drafters[kind].metadata.training["steps"] == 6
    _run(model, data_dir, tmp_path, "stopped", until=3, bf16=True)
    assert [r["step"] for r in _records("stopped", "eagle")] == [1, 2, 3]
    _run(model, data_dir, tmp_path, "stopped", bf16=True)
    for kind in KINDS:
        np.testing.assert_allclose([r["loss"] for r in _records("stopped", kind)],
                                   [r["loss"] for r in _records("whole", kind)], rtol=0, atol=1e-5, err_msg=kind)


def test_a_run_whose_cache_is_gone_resumes_from_the_fallback(tiny_data, tmp_path):  # noqa: F811
    """Killed after step 3 (its fallback written), its $JAXSPEC_CACHE folder deleted: the run continues
    from the fallback's step with the same learning rates and batches; its step-4 loss is the
    uninterrupted run's up to the bfloat16 rounding of the parameters."""
    model, data_dir, _ = tiny_data
    _run(model, data_dir, tmp_path, "ref")
    _run(model, data_dir, tmp_path, "lost", until=3)
    folder = tmp_path / "lost" / "fallback"
    index = json.loads((folder / "run.json").read_text())
    assert index["step"] == 3 and sorted(index["settings"]) == sorted(KINDS)
    assert all((folder / f"{kind}.safetensors").stat().st_size > 0 for kind in KINDS)
    shutil.rmtree(run_dir("lost"))
    _run(model, data_dir, tmp_path, "lost")
    for kind in KINDS:
        ref, got = _records("ref", kind), _records("lost", kind)
        assert [r["step"] for r in got] == [4, 5, 6], kind
        assert [r["lr"] for r in got] == [r["lr"] for r in ref[3:]], kind          # the schedule continues
        np.testing.assert_allclose(got[0]["loss"], ref[3]["loss"], rtol=2e-2, err_msg=kind)


def test_a_fallback_linked_to_its_shipped_heads_reads_their_parameters(tiny_data, tmp_path):  # noqa: F811
    """Heads saved at the fallback's step (--until) hold its parameters: `train link-fallback` drops the
    fallback's copies and it reads the same bfloat16 values from the heads (the draft model from its Hugging
    Face folder); a head replaced since, or one of another step, is refused."""
    from jaxspec.cli import main

    model, data_dir, _ = tiny_data
    drafters = _run(model, data_dir, tmp_path, "ship", until=3)
    folder, settings = tmp_path / "ship" / "fallback", json.loads((tmp_path / "ship" / "fallback" / "run.json").read_text())["settings"]
    own = fallback.read(str(folder), settings)
    shutil.copytree(folder, tmp_path / "own")
    seen = {kind: d.metadata.data["trained_on"] for kind, d in drafters.items()}      # what the 3 steps held
    assert all(s == seen["eagle"] and s["steps"] == 3 and 0 < s["answer_tokens"] < s["tokens"] for s in seen.values())
    heads = {kind: str(tmp_path / "ship" / kind) for kind in KINDS}
    for kind in KINDS:                                  # each head keeps the run's log and settings
        assert [r["step"] for r in loop.read_metrics(heads[kind]) if "loss" in r] == [1, 2, 3], kind
        assert os.path.exists(os.path.join(heads[kind], loop.SETTINGS)), kind
    assert main(["train", "link-fallback", str(folder)] + [a for k in KINDS for a in (f"--{k}", heads[k])]) == 0
    assert not any((folder / f"{kind}.safetensors").exists() for kind in KINDS)
    linked = fallback.read(str(folder), settings)
    assert linked["step"] == own["step"] == 3
    for kind in KINDS:
        assert sorted(linked["params"][kind]) == sorted(own["params"][kind]), kind
        for name, value in own["params"][kind].items():
            np.testing.assert_array_equal(linked["params"][kind][name], value, err_msg=f"{kind} {name}")
    _run(model, data_dir, tmp_path, "other", until=2)
    with pytest.raises(ValueError, match="does not hold the parameters"):
        fallback.link(str(tmp_path / "own"), {"eagle": str(tmp_path / "other" / "eagle")})
    changed = drafters["eagle"]
    changed.state = jax.tree.map(lambda x: x * 1.5 if x.dtype == np.float32 else x, changed.state)
    changed.save(heads["eagle"])
    with pytest.raises(ValueError, match="not the one the fallback"):
        fallback.read(str(folder), settings)


def test_a_run_resumed_from_a_linked_fallback_keeps_the_runs_log(tiny_data, tmp_path):  # noqa: F811
    """A new machine (the run's $JAXSPEC_CACHE folder gone) resuming from a fallback linked to shipped heads
    starts its log from the heads' copy: the written heads' log holds every step and their training time
    counts the steps run before the move."""
    model, data_dir, _ = tiny_data
    _run(model, data_dir, tmp_path, "moved", until=3)
    fallback.link(str(tmp_path / "moved" / "fallback"), {kind: str(tmp_path / "moved" / kind) for kind in KINDS})
    before = {kind: _records("moved", kind) for kind in KINDS}
    shutil.rmtree(run_dir("moved"))
    drafters = _run(model, data_dir, tmp_path, "moved")
    for kind in KINDS:
        got = _records("moved", kind)
        assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6] and got[:3] == before[kind], kind
        assert drafters[kind].metadata.training["train_seconds"] == round(sum(r["seconds"] for r in got), 1), kind
        shipped = [r["step"] for r in loop.read_metrics(str(tmp_path / "moved" / kind)) if "loss" in r]
        assert shipped == [1, 2, 3, 4, 5, 6], kind


def test_a_fallback_is_measured_as_it_stands_onto_its_curve(tiny_data, tmp_path, monkeypatch):  # noqa: F811
    """evaluate_fallback: each head of the committed fallback at its step, measured by acceptance() with the
    drafter its parameters make (the head the run wrote at that step, up to bfloat16), one line per call
    in FALLBACK/curve.jsonl."""
    import jaxspec.drafters
    from jaxspec.train import acceptance as measured
    model, data_dir, _ = tiny_data
    drafters = _run(model, data_dir, tmp_path, "curve", until=3)
    cfg = JointConfig(name="curve", steps=6, lrs={"eagle": 3e-3, "mtp": 3e-3, "draft": 3e-3}, warmup=2,
                      tokens_per_batch=512, save_every=2, log_every=1, rewarm=3, bf16=False)
    prompts, seen = [[3, 4, 5, 6, 7, 8], [9, 8, 7, 6]], []
    real = measured.acceptance
    monkeypatch.setattr(measured, "acceptance", lambda m, d, p, n: seen.append(d) or real(m, d, p, n))
    # the model ships an EAGLE head (here the one the run wrote) besides its suffix store
    monkeypatch.setattr(jaxspec.drafters, "shipped_kinds", lambda m: ["eagle", "suffix"])
    monkeypatch.setattr(jaxspec.drafters, "shipped", lambda m, kind: drafters[kind])
    folder = str(tmp_path / "curve" / "fallback")
    point = evaluate_fallback(model, data_dir, _setups(model, data_dir), cfg, folder, prompts, eval_tokens=12)
    assert point["step"] == 3 and point["written"] and len(seen) == 3 + 3     # the heads, NGram, Suffix, shipped EAGLE
    assert point["trained_on"] == drafters["eagle"].metadata.data["trained_on"]
    assert [type(d).__name__ for d in seen[3:]] == ["NGram", "Suffix", "Eagle"]
    base = json.load(open(os.path.join(tmp_path, "curve", "fallback", "baselines.json")))
    assert base["drafters"]["ngram"] == real(model, seen[3], prompts, 12)
    assert base["drafters"]["shipped eagle"] == real(model, drafters["eagle"], prompts, 12)
    for kind, drafter in zip(KINDS, seen):
        assert point[kind] == real(model, drafters[kind], prompts, 12), kind
        leaves = [jax.tree.leaves(d.params_for(model)) for d in (drafter, drafters[kind])]
        for got, want in zip(*leaves):
            np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=1e-2, atol=1e-6)
    evaluate_fallback(model, data_dir, _setups(model, data_dir), cfg, folder, prompts, eval_tokens=12)
    assert len(seen) == 6 + 3                                          # the baselines were kept, not measured again
    other = copy.copy(drafters["eagle"])                               # another EAGLE head ships: measured again
    other.state = jax.tree.map(lambda x: x * 2, other.state)
    monkeypatch.setattr(jaxspec.drafters, "shipped", lambda m, kind: other)
    evaluate_fallback(model, data_dir, _setups(model, data_dir), cfg, folder, prompts, eval_tokens=12)
    assert len(seen) == 9 + 3 + 3 and seen[-1] is other
    lines = [json.loads(x) for x in open(os.path.join(folder, "curve.jsonl"))]
    assert [x["step"] for x in lines] == [3, 3, 3] and lines[0] == lines[1] == lines[2]
    assert open(os.path.join(folder, "curve.png"), "rb").read()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no fallback"):
        evaluate_fallback(model, data_dir, _setups(model, data_dir), cfg, str(tmp_path / "none"), prompts)


def test_a_runs_curve_counts_hours_from_a_profiled_step_into_benchmarks(tmp_path):
    """`train curve`: each evaluated step of a fallback's curve.jsonl with the hours its steps take at a profiled
    step's seconds (a head: the target's features plus its own step; the run: all parts), rendered by the
    BENCHMARKS.md report with its picture."""
    folder = str(tmp_path / "runs" / "r")
    fallback.write(folder, 7200, {"eagle": {"w": np.ones((2, 2), np.float32)}}, {"eagle": {"lr": 1}}, "tiny")
    with pytest.raises(ValueError, match="evaluate the run first"):
        run_curve(folder, "unused.json")
    seen = {"steps": 7200, "epochs": 1.5, "examples": 10, "tokens": 3000, "answer_tokens": 2000}
    with open(os.path.join(folder, "curve.jsonl"), "w") as f:
        f.write(json.dumps({"step": 3600, "eagle": {"mean_accepted_length": 1.25}, "mtp": {"mean_accepted_length": 1.5}}))
        f.write("\n" + json.dumps({"step": 7200, "trained_on": seen, "eagle": {"mean_accepted_length": 1.75},
                                    "mtp": {"mean_accepted_length": 2.0}}) + "\n")
    profile = {"provenance": {"machine": "2 CPU cores"},
               "parts": {"target features": {"seconds": 3.0}, "eagle step": {"seconds": 6.0}, "mtp step": {"seconds": 1.0}}}
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    result = run_curve(folder, str(tmp_path / "profile.json"))
    assert result["seconds_per_step"] == {"features": 3.0, "eagle": 6.0, "mtp": 1.0, "joint": 10.0}
    assert [p["hours"] for p in result["points"]] == [{"eagle": 9.0, "mtp": 4.0, "joint": 10.0},
                                                     {"eagle": 18.0, "mtp": 8.0, "joint": 20.0}]
    assert result["points"][1]["trained_on"] == seen and result["baselines"] == {}
    written = write_curve({**result, "date": "2026-01-04", "command": "jaxspec train curve R"}, str(tmp_path / "c.json"))
    assert [os.path.basename(p) for p in written] == ["c.json", "c.png"]
    text = report([written[0]])
    assert "## 2026-01-04: training run r, held-out curve" in text and "![c.png](" in text
    assert "| 3600 | - | - | 1.25 | 1.50 | 9.0, 4.0 | 10.0 |" in text
    assert "| 7200 | 1.5 | 2,000 | 1.75 | 2.00 | 18.0, 8.0 | 20.0 |" in text


def test_a_fallback_of_other_settings_is_refused(tmp_path):
    settings = {"eagle": {"lr": 1, "train": {"save_every": 3}}}
    fallback.write(str(tmp_path), 3, {"eagle": {"w": np.ones((2, 2), np.float32)}}, settings, "t")
    with pytest.raises(ValueError, match="settings differ in \\['lr'\\]"):
        fallback.read(str(tmp_path), {"eagle": {"lr": 2, "train": {"save_every": 3}}})
    with pytest.raises(ValueError, match="holds heads"):
        fallback.read(str(tmp_path), {"mtp": {"lr": 1, "train": {"save_every": 3}}})
    saved = fallback.read(str(tmp_path), {"eagle": {"lr": 1, "train": {"save_every": 9}}})
    assert saved["step"] == 3 and saved["params"]["eagle"]["w"].dtype == np.float32


def test_a_signal_stops_a_run_at_a_step_with_its_state_and_fallback_saved(tiny_data, tmp_path, monkeypatch):  # noqa: F811
    """SIGTERM (the end of a session) during step 3: the step finishes, every head's state and the fallback
    are saved at step 3, nothing is written as finished; run again, it goes on from step 4 to the end."""
    import signal

    from jaxspec.train import batches as batches_module
    model, data_dir, _ = tiny_data
    handler = signal.getsignal(signal.SIGTERM)
    real = batches_module.FeatureBatches.batch

    def batch(self, k):
        if k == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, k)

    monkeypatch.setattr(batches_module.FeatureBatches, "batch", batch)
    assert _run(model, data_dir, tmp_path, "signal") == {}
    assert signal.getsignal(signal.SIGTERM) is handler
    assert json.load(open(tmp_path / "signal" / "fallback" / "run.json"))["step"] == 3
    for kind in KINDS:
        assert [r["step"] for r in _records("signal", kind)] == [1, 2, 3], kind
        assert not os.path.exists(tmp_path / "signal" / kind), kind
    monkeypatch.setattr(batches_module.FeatureBatches, "batch", real)
    drafters = _run(model, data_dir, tmp_path, "signal")
    for kind in KINDS:
        assert [r["step"] for r in _records("signal", kind)] == [1, 2, 3, 4, 5, 6], kind
        assert drafters[kind].metadata.training["steps"] == 6, kind


def test_runs_of_two_optimizers_are_compared_on_the_same_batches(tiny_data, tmp_path):  # noqa: F811
    """The premise of `train compare`: runs of one seed see the same batch at each step, so before any update
    (step 1) AdamW and Muon log the same loss, and they part after it; the comparison reads those logs."""
    model, data_dir, _ = tiny_data
    _run(model, data_dir, tmp_path, "paired-adamw", until=3)
    _run(model, data_dir, tmp_path, "paired-muon", until=3, optimizer="muon")
    result = compare_runs(["paired-adamw", "paired-muon"], until=3, window=2)
    assert set(result["heads"]) == set(KINDS)
    for kind in KINDS:
        head = result["heads"][kind]
        assert head["steps"] == [1, 2, 3] and head["window_steps"] == [2, 3]
        adamw, muon = head["runs"]["paired-adamw"], head["runs"]["paired-muon"]
        assert adamw["loss_first"][0] == pytest.approx(muon["loss_first"][0], abs=1e-4), kind
        assert adamw["loss_first"][2] != pytest.approx(muon["loss_first"][2], abs=1e-4), kind
        logged = [r["top1_j"] for r in _records("paired-muon", kind)]
        assert muon["top1_first"] == [round(t[0] if isinstance(t, list) else t, 4) for t in logged]
    written, picture = write_comparison(result, str(tmp_path / "cmp" / "adamw-vs-muon"))
    assert json.load(open(written))["heads"]["eagle"]["steps"] == [1, 2, 3]
    table = compare_markdown(result, written, bins=3)
    for kind in KINDS:
        top1 = result["heads"][kind]["runs"]["paired-muon"]["top1_first"]
        assert f"| {kind} | paired-muon | " + " | ".join(f"{t:.3f}" for t in top1) in table
    assert picture is None or f"](cmp/{os.path.basename(picture)})" in table       # relative: its folder and name
    with pytest.raises(ValueError, match="no head was logged"):
        compare_runs(["paired-adamw", "never-ran"], until=3, window=2)


def test_the_joint_step_profile_counts_the_target_forward_and_times_each_head(tiny_data):  # noqa: F811
    """train/profile.profile_joint_step on a run's real batch: the target's features and one whole step per
    head. XLA's FLOP count of the features is the forward's 2 x (weight-matrix parameters) per token (Kaplan
    et al. 2020, the embedding lookup free), plus at most causal attention over the row (4 H D T per token
    and layer) and the elementwise work around it."""
    from jaxspec.train.profile import joint_markdown, profile_joint_step

    model, data_dir, _ = tiny_data
    cfg = JointConfig(name="profile", steps=6, lrs={"eagle": 3e-3, "mtp": 3e-3, "draft": 3e-3}, warmup=2,
                      tokens_per_batch=512, bf16=False)
    result = profile_joint_step(model, data_dir, _setups(model, data_dir), cfg, step=1, repeats=1)
    assert list(result["parts"]) == ["target features", "eagle step", "mtp step", "draft step"]
    c, s = model.config, result["settings"]
    tokens = s["rows"] * s["seq_len"]
    per_layer = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads) + 3 * c.hidden_size * c.intermediate_size
    matmuls = 2 * per_layer * c.num_layers * tokens
    attention = 4 * c.num_heads * c.head_dim * s["seq_len"] * c.num_layers * tokens
    assert matmuls <= result["parts"]["target features"]["gflop"] * 1e9 <= 1.5 * (matmuls + attention)
    for name, part in result["parts"].items():
        assert part["seconds"] > 0 and part["gflop"] > 0, name
    assert 0 < s["loss_positions"] <= tokens
    assert "joint step (sum)" in joint_markdown(result)


def test_the_train_commands_name_the_flags_a_missing_head_wants(capsys):
    """`train heads` without a head asks for --eagle OUT ..., `train profile-heads --heads ''` for --heads,
    `train link-fallback` without a head for the heads' folders."""
    from argparse import Namespace

    from jaxspec.cli import main
    from jaxspec.train.cli import _head_setups

    with pytest.raises(ValueError, match="--heads eagle,mtp,draft"):
        _head_setups(Namespace(data="d"), None, None, kinds=[])
    with pytest.raises(ValueError, match="--eagle OUT, --mtp OUT"):
        _head_setups(Namespace(data="d", eagle=None, mtp=None, draft=None), None, None)
    assert main(["train", "link-fallback", "somewhere"]) == 2
    assert "--eagle DIR, --mtp DIR, --draft DIR" in capsys.readouterr().err
