"""The training loop on a tiny target, for EAGLE and MTP heads: they learn, resume after a kill is exact,
corrupt checkpoints fail clearly (data-parallel steps: tests/test_sharding.py)."""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy
import pytest

from jaxspec.drafters import MTP, DraftModel, Eagle
from jaxspec.heads import EagleConfig, MTPConfig, init_eagle_params, init_mtp_params
from jaxspec.heads.mtp import BLOCK_KEYS
from jaxspec.model import Model
from jaxspec.models import init_params, layer_params
from jaxspec.train import data, loop
from jaxspec.train.acceptance import acceptance, heldout_prompts
from jaxspec.models import lm_head_rows
from jaxspec.train.eagle import train_eagle
from jaxspec.train.draft import draft_config, projected_embeddings, train_draft
from jaxspec.train.mtp import train_mtp

from .conftest import TINY, ByteTokenizer

LAYERS = (0, 1, 2)
CHAIN = dataclasses.replace(TINY, hidden_size=TINY.vocab_size)


def chain_model() -> Model:
    """A tiny target whose greedy text is predictable: one-hot embeddings, an output head that maps
    token v to perm[v], small random layers. An untrained head (its output rows copied from the
    target) predicts the token the target already emitted, so acceptance starts near zero."""
    V = CHAIN.vocab_size
    params = init_params(CHAIN, jax.random.PRNGKey(0), scale=0.02)
    perm = np.random.default_rng(1).permutation(V)
    params["embed"] = jnp.eye(V)
    params["lm_head"] = jnp.asarray(np.eye(V)[:, perm] * 4.0, jnp.float32)
    return Model(CHAIN, params, ByteTokenizer(), "chain")
EAGLE_KW = dict(draft_vocab_size=64, ttt_steps=3, feature_layers=LAYERS, tokens_per_batch=512, progress=False)
MTP_KW = dict(num_modules=2, draft_vocab_size=64, feature_layers=LAYERS, tokens_per_batch=512, progress=False)
DRAFT_SHAPE = dict(hidden_size=32, num_layers=1, head_dim=8, num_kv_heads=2)
DRAFT_KW = dict(**DRAFT_SHAPE, feature_layers=LAYERS, tokens_per_batch=512, progress=False)
TRAINERS = {"eagle": (train_eagle, EAGLE_KW, Eagle), "mtp": (train_mtp, MTP_KW, MTP),
            "draft": (train_draft, DRAFT_KW, DraftModel),
            "eagle-tied": (train_eagle, {**EAGLE_KW, "tied_head": True}, Eagle)}
KINDS = ["eagle", "mtp", "draft"]


def untrained(kind: str, m: Model, d2t):
    """A head as its trainer initialises it (output rows or blocks copied from the target)."""
    if kind.startswith("eagle"):
        cfg = EagleConfig.for_target(CHAIN, 64, LAYERS, tied_head=kind == "eagle-tied")
        return Eagle(init_eagle_params(cfg, jax.random.PRNGKey(0), d2t=d2t, lm_head=lm_head_rows(m.params, d2t)), cfg)
    if kind == "mtp":
        cfg = MTPConfig.for_target(CHAIN, 2, 64)
        block = {k: layer_params(m.params, -1)[k] for k in BLOCK_KEYS}
        return MTP(init_mtp_params(cfg, jax.random.PRNGKey(0), d2t=d2t, block=block), cfg)
    cfg = draft_config(CHAIN, **DRAFT_SHAPE)
    params = {**init_params(cfg, jax.random.PRNGKey(0), scale=0.02), "embed": projected_embeddings(m.params["embed"], 32)}
    return DraftModel(Model(cfg, params, m.tokenizer, "untrained"))


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    prompts = root / "prompts.jsonl"
    rng = np.random.default_rng(0)
    prompts.write_text("".join(json.dumps({"prompt": " ".join(rng.choice(["ab", "cd", "ef", "gh", "ij"], 6))})
                               + "\n" for _ in range(80)))
    m = chain_model()
    out = str(root / "data")
    data.make_data(m, str(prompts), out, num_prompts=64, heldout=8, max_new_tokens=24, batch_size=16,
                   shard_size=32, progress=False)
    return m, out, str(prompts)


@pytest.mark.parametrize("kind", KINDS + ["eagle-tied"])
def test_training_lowers_loss_and_raises_acceptance(tiny_data, tmp_path, kind):
    m, data_dir, prompts = tiny_data
    trainer, kw, _ = TRAINERS[kind]
    held = heldout_prompts(m, data_dir, prompts, 8)
    cfg = loop.TrainConfig(steps=120, lr=3e-3, warmup=10, save_every=60, eval_every=60, log_every=10)
    drafter = trainer(m, data_dir, str(tmp_path / kind), cfg, eval_prompts=held, eval_tokens=24, **kw)
    records = loop.read_metrics(str(tmp_path / kind))
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[-1] < 0.8 * losses[0]
    assert {"lr", "tokens_per_s", "top1_j", "loss_j", "grad_norm"} <= set(records[0])
    assert [r["step"] for r in records if "eval" in r] == [60, 120]

    d2t = drafter.head_params["d2t"] if kind != "draft" else None
    before = acceptance(m, untrained(kind, m, d2t), held, 24)["mean_accepted_length"]
    after = acceptance(m, drafter, held, 24)["mean_accepted_length"]
    print(f"tiny {kind} mean accepted length: untrained {before:.2f}, trained {after:.2f}")
    assert after > before + 1.0
    assert drafter.metadata.heldout_acceptance["step"] == 120
    assert drafter.metadata.target_fingerprint == m.fingerprint
    assert drafter.metadata.training["train_seconds"] > 0
    assert os.path.getsize(tmp_path / kind / "training.png") > 10_000
    if kind.startswith("eagle"):                   # a tied head stores no output rows: it reads the target's
        stored = safetensors.numpy.load_file(str(tmp_path / kind / "params.safetensors"))
        assert ("lm_head" in stored) == (kind == "eagle") and drafter.cfg.tied_head == (kind == "eagle-tied")


def _losses(out_dir) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in loop.read_metrics(out_dir) if "loss" in r]


@pytest.mark.parametrize("kind", KINDS)
def test_resume_after_kill_continues_exactly(tiny_data, tmp_path, kind):
    m, data_dir, _ = tiny_data
    train, kw, head = TRAINERS[kind]
    cfg = loop.TrainConfig(steps=8, lr=3e-3, warmup=2, save_every=3, eval_every=0, log_every=1)
    whole, killed = str(tmp_path / "whole"), str(tmp_path / "killed")
    train(m, data_dir, whole, cfg, **kw)

    def kill(step, record):
        if step == 5:                                  # after step 5, before any save of it
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        train(m, data_dir, killed, cfg, on_step=kill, **kw)
    assert [s for s, _ in _losses(killed)] == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="--resume"):
        train(m, data_dir, killed, cfg, **kw)
    with pytest.raises(ValueError, match="settings differ"):
        train(m, data_dir, killed, dataclasses.replace(cfg, lr=1e-3), resume=True, **kw)
    resaved = dataclasses.replace(cfg, save_every=2)        # how often a run saves may change on resume
    early = train(m, data_dir, killed, resaved, resume=True, until=6, **kw)   # from the step-3 save
    assert early.metadata.training["steps"] == 6 and early.metadata.training["schedule_steps"] == 8
    train(m, data_dir, killed, cfg, resume=True, **kw)
    assert _losses(killed) == _losses(whole)                          # steps 4..8 identical
    params = lambda d: d.model.params if kind == "draft" else d.head_params
    a, b = params(head.load(whole)), params(head.load(killed))
    assert jax.tree.all(jax.tree.map(np.array_equal, a, b))


def test_checkpoint_round_trip_is_exact_and_corruption_is_reported(tiny_data, tmp_path):
    settings = {"kind": "test"}
    params = {"w": jax.random.normal(jax.random.PRNGKey(0), (5, 7)), "b": jnp.arange(3, dtype=jnp.float32)}
    opt = loop.make_optimizer(loop.TrainConfig(steps=10, warmup=1))
    state = jax.device_put({"params": params, "opt_state": opt.init(params), "step": jnp.int32(7)})
    run = loop.Run(str(tmp_path / "run"), settings, resume=False)
    run.save(state)
    run.close()
    blank = jax.tree.map(jnp.zeros_like, state)
    restored = loop.Run(str(tmp_path / "run"), settings, resume=True).restore(blank)
    for x, y in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        assert x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
    assert jax.tree.structure(state) == jax.tree.structure(restored)

    # truncate every stored array file of that checkpoint: resuming must say what is wrong
    step_dir = tmp_path / "run" / loop.CKPT / "7"
    files = [p for p in step_dir.rglob("*") if p.is_file() and p.stat().st_size > 64]
    assert files
    for p in files:
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    with pytest.raises(ValueError, match="cannot be read"):
        loop.Run(str(tmp_path / "run"), settings, resume=True).restore(blank)


def test_answer_only_mask_starts_where_drafts_reach_the_answer(tiny_data):
    from jaxspec.train.batches import FeatureBatches
    from jaxspec.train.features import cache_features

    m, data_dir, _ = tiny_data
    feat_dir = cache_features(m, data_dir, LAYERS, progress=False)
    every, answers = (FeatureBatches(data_dir, feat_dir, 512, answer_only=a) for a in (False, True))
    prompt_len = {tuple(ids.tolist()): p for ids, p in data.iter_examples(data_dir)}
    b_all, b_ans = every.batch(0), answers.batch(0)
    assert np.array_equal(b_all["tokens"], b_ans["tokens"])
    for row, m_all, m_ans in zip(b_all["tokens"], b_all["mask"], b_ans["mask"]):
        n = int(m_all.sum()) + 1                          # example length
        if n > 1:
            p = prompt_len[tuple(row[:n].tolist())]
            assert m_ans.tolist() == [p - 2 <= t < n - 1 for t in range(len(row))]


def test_feature_cache_pads_rows_to_few_shapes_and_matches_the_target(tiny_data, tmp_path, monkeypatch):
    from jaxspec.cache import init_cache
    from jaxspec.models.llama import forward_hidden
    from jaxspec.train import features

    m, data_dir, _ = tiny_data
    shapes, real = [], features._hidden_jit
    monkeypatch.setattr(features, "_hidden_jit", lambda p, tokens, cfg, layers: shapes.append(tokens.shape)
                        or real(p, tokens, cfg, layers))
    local = tmp_path / "data"                                   # a copy: the module's cache stays untouched
    local.mkdir()
    for name in os.listdir(data_dir):
        if name.endswith(".npz") or name.endswith(".json"):
            (local / name).write_bytes(open(os.path.join(data_dir, name), "rb").read())
    feat_dir = features.cache_features(m, str(local), LAYERS, tokens_per_batch=576, progress=False)
    rows = [b for b, _ in shapes]
    assert all(b & (b - 1) == 0 or b == 576 // T for b, T in shapes), shapes
    assert len(set(shapes)) < len(shapes)                      # shapes repeat across shards and groups
    # every example's cached rows equal the target's own hidden states for it alone (bfloat16)
    stored = features.load_features(feat_dir, data.shard_names(str(local)))[1]
    seqs = data.read_shard(str(local), data.shard_names(str(local))[1])[0]
    start = sum(len(s) for s in seqs[:3])
    ids = jnp.asarray(seqs[3])[None]
    x, hidden, _ = forward_hidden(m.params, ids, init_cache(m.config, 1, ids.shape[1], jnp.float32), m.config, LAYERS)
    want = jnp.concatenate([hidden, x[None]], axis=0)[:, 0].transpose(1, 0, 2)
    got = features.bits_to_float(stored[start:start + len(seqs[3])])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want.astype(jnp.bfloat16).astype(jnp.float32)),
                               rtol=1e-2, atol=1e-2)
    assert sum(rows) > sum(1 for _ in data.iter_examples(str(local)))     # some groups were padded


def test_onpolicy_round_trains_the_draft_on_its_own_answers(tiny_data, tmp_path):
    from jaxspec.train.onpolicy import onpolicy_rounds

    m, data_dir, prompts = tiny_data
    held = heldout_prompts(m, data_dir, prompts, 8)
    start = str(tmp_path / "start")                     # a briefly distilled draft (off-policy, KL)
    train_draft(m, data_dir, start, loop.TrainConfig(steps=20, lr=3e-3, warmup=2, save_every=20, eval_every=0),
                **DRAFT_KW)
    before = acceptance(m, DraftModel.load(start), held, 24)["mean_accepted_length"]
    cfg = loop.TrainConfig(steps=60, lr=3e-3, warmup=5, save_every=30, eval_every=0, log_every=5)
    onpolicy_data, out = str(tmp_path / "onpolicy-data"), str(tmp_path / "onpolicy")
    kw = dict(rounds=1, prompts_per_round=32, mix="prompts.jsonl", prompts_dir=os.path.dirname(prompts),
              sampled_fraction=0.25, max_new_tokens=24, batch_size=16, shard_size=32, heldout=2,
              keep_out=data_dir, eval_prompts=held, eval_tokens=24, feature_layers=LAYERS, tokens_per_batch=512,
              progress=False)
    drafter = onpolicy_rounds(m, start, onpolicy_data, out, cfg, **kw)
    after = acceptance(m, drafter, held, 24)["mean_accepted_length"]
    print(f"tiny on-policy draft: mean accepted length {before:.2f} -> {after:.2f}")
    assert after > before + 0.3
    assert drafter.metadata.training["loss"] == "tv" and drafter.metadata.training["init"] == start
    losses = [r["loss"] for r in loop.read_metrics(os.path.join(out, "round-0")) if "loss" in r]
    assert losses[-1] < 0.8 * losses[0]
    # the answers are the starting draft's own (greedy rows), on prompts the acceptance check never sees
    writer = DraftModel.load(start).model
    part = data.read_manifest(onpolicy_data)["parts"][0]
    assert part["settings"]["writer"]["fingerprint"] == writer.fingerprint
    kept_out = data.heldout_indices(data_dir)["prompts.jsonl"]
    with np.load(os.path.join(onpolicy_data, "shard-00000.npz")) as z:
        assert not set(z["prompt_index"].tolist()) & kept_out
        temps = z["temperature"].tolist()
    seqs, plens = data.read_shard(onpolicy_data, "shard-00000.npz")
    greedy = [(s, p) for s, p, t in zip(seqs, plens, temps) if t == 0]
    assert len(greedy) == 24
    for ids, p in greedy[:4]:
        assert ids[p:].tolist() == jaxspec_generate(writer, [ids[:p].tolist()], max_new_tokens=24).tokens[0]
    # a finished round is kept: calling again trains nothing more
    records = loop.read_metrics(os.path.join(out, "round-0"))
    again = onpolicy_rounds(m, start, onpolicy_data, out, cfg, **kw)
    assert loop.read_metrics(os.path.join(out, "round-0")) == records
    assert jax.tree.all(jax.tree.map(np.array_equal, again.model.params, drafter.model.params))


def jaxspec_generate(*a, **k):
    import jaxspec
    return jaxspec.generate(*a, **k)


def test_scaling_curve_trains_each_fraction_for_the_same_epochs(tiny_data, tmp_path):
    from jaxspec.train.scaling import scaling_curve, subset

    names = [f"shard-{i:05d}.npz" for i in range(8)]
    assert subset(names, 1) == names and subset(names, 0.25) == names[::4]
    assert set(subset(names, 0.125)) <= set(subset(names, 0.25)) <= set(subset(names, 0.5))
    with pytest.raises(ValueError, match="fractions"):
        subset(names, 0)
    m, data_dir, prompts = tiny_data
    held = heldout_prompts(m, data_dir, prompts, 4)
    cfg = loop.TrainConfig(steps=10, lr=3e-3, warmup=2, save_every=50, eval_every=0, log_every=1)  # steps: set per run
    kw = {k: v for k, v in EAGLE_KW.items() if k != "tokens_per_batch"}
    result = scaling_curve(m, data_dir, str(tmp_path / "sc"), cfg, fractions=(0.5, 1.0), epochs=2.0,
                           tokens_per_batch=512, eval_prompts=held, eval_tokens=16, **kw)
    half, whole = result["runs"]
    assert (half["shards"], whole["shards"]) == (1, 2)
    for r in result["runs"]:                              # the same passes over each subset
        assert r["steps"] == -(-2 * r["tokens"] // 512)
        assert r["mean_accepted_length"] >= 1.0 and len(r["per_position_acceptance"]) == 5
        trained = json.load(open(tmp_path / "sc" / f"frac-{r['fraction']:g}" / "train_settings.json"))
        assert trained["train"]["steps"] == r["steps"]
    assert whole["tokens"] > 1.5 * half["tokens"]
    assert (tmp_path / "sc" / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    again = scaling_curve(m, data_dir, str(tmp_path / "sc"), cfg, fractions=(0.5, 1.0), epochs=2.0,
                          tokens_per_batch=512, eval_prompts=held, eval_tokens=16, **kw)
    assert again["runs"] == result["runs"]               # finished runs are read back, not trained again


def test_seen_counts_what_the_batches_held_across_epochs(tiny_data):
    """A head's metadata says what it trained on: batches.seen(steps) against the examples found in the
    batches of those steps themselves (their rows matched to the data's examples)."""
    from jaxspec.train.batches import FeatureBatches

    m, data_dir, _ = tiny_data
    batches = FeatureBatches(data_dir, None, 256, seed=3)
    prompt_len = {tuple(ids.tolist()): p for ids, p in data.iter_examples(data_dir)}
    n = batches.batches_per_epoch
    for steps in (0, 1, n - 1, n, n + 2, 2 * n):
        examples = tokens = answers = 0
        for k in range(steps):
            for row in batches.batch(k)["tokens"]:
                length = next((L for L in range(len(row), 0, -1) if tuple(row[:L].tolist()) in prompt_len), 0)
                if length:
                    examples, tokens = examples + 1, tokens + length
                    answers += length - prompt_len[tuple(row[:length].tolist())]
        assert batches.seen(steps) == {"steps": steps, "epochs": round(steps / n, 3), "examples": examples,
                                       "tokens": tokens, "answer_tokens": answers}
    assert batches.seen(2 * n)["answer_tokens"] == 2 * data.summary(data_dir)["answer_tokens"]


@pytest.mark.parametrize("kind", KINDS)
def test_shards_restrict_training_to_the_chosen_data_shards(tiny_data, tmp_path, kind):
    """select_shards (`--shards`) names shards by index; every trainer then reads only those."""
    m, data_dir, _ = tiny_data
    names = data.shard_names(data_dir)
    assert data.select_shards(data_dir, "1") == [names[1]] and data.select_shards(data_dir, "0-1,1") == names[:2]
    for bad, message in (("7", "has no shard 7"), ("x", "indices and ranges"), (",", "names no shard")):
        with pytest.raises(ValueError, match=message):
            data.select_shards(data_dir, bad)
    trainer, kw, _ = TRAINERS[kind]
    cfg = loop.TrainConfig(steps=2, lr=3e-3, warmup=0, save_every=2, eval_every=0, log_every=1)
    trained = trainer(m, data_dir, str(tmp_path / kind), cfg, shards=[names[1]], **kw)
    settings = json.load(open(tmp_path / kind / "train_settings.json"))
    assert settings["shards"] == [names[1]]
    seqs, plens = data.read_shard(data_dir, names[1])
    assert settings["examples"] == len(seqs)
    described = trained.metadata.data                    # the head says which data it saw, not the folder's
    assert described["shards"] == [names[1]] and described["examples"] == len(seqs) < data.summary(data_dir)["examples"]
    assert described["answer_tokens"] == sum(len(s) - p for s, p in zip(seqs, plens))
    assert TRAINERS[kind][2].load(str(tmp_path / kind)).metadata.data == described


def test_a_run_resumes_after_the_model_config_gains_fields_at_their_defaults():
    """A run's settings recorded before ModelConfig gained fields (Gemma 3's) still match; a changed
    field does not."""
    import dataclasses

    from jaxspec.config import ModelConfig
    from train.loop import settings_changed
    cfg = dataclasses.asdict(ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
                                         num_heads=4, num_kv_heads=2, head_dim=8))
    recorded = {k: v for k, v in cfg.items() if k not in ("local_layers", "sliding_window", "rope_local_theta",
                                                          "query_scale")}
    assert settings_changed({"config": recorded, "train": {"steps": 10}}, {"config": cfg, "train": {"steps": 10}}) == []
    assert settings_changed({"config": recorded}, {"config": {**cfg, "local_layers": (0,)}}) == ["config"]


def test_a_run_resumes_after_the_train_config_gains_fields_at_their_defaults():
    """A run recorded before TrainConfig had `optimizer` resumes with AdamW, not with Muon."""
    from train.loop import TrainConfig, settings_changed
    recorded = {k: v for k, v in dataclasses.asdict(TrainConfig(steps=10, warmup=1)).items() if k != "optimizer"}
    now = lambda **kw: {"train": dataclasses.asdict(TrainConfig(steps=10, warmup=1, **kw))}
    assert settings_changed({"train": recorded}, now()) == []
    assert settings_changed({"train": recorded}, now(optimizer="muon")) == ["train"]
    with pytest.raises(ValueError, match="optimizer"):
        TrainConfig(optimizer="sgd")


def test_muon_orthogonalises_the_update_of_every_weight_matrix_only():
    """Muon (Jordan et al. 2024) replaces a matrix's update by its orthogonalised momentum (Newton-Schulz):
    from a gradient whose singular values span 100x, the first update is near -U V^T (its singular values
    span at most about 2x: the quintic's coefficients leave them in roughly [0.7, 1.2]), at AdamW's update
    RMS of 0.2 x lr (Liu et al. 2025), while AdamW's sign step is no orthogonal matrix. Weights in the heads'
    layouts count as the matrices they are: a query map [E, H, D] as [E, H*D], each layer of a stacked
    [L, E, F] alone. A vector, a stacked norm and a vocabulary table get Adam's sign-like step under both
    (Muon's is Nesterov's: larger on the first step, still the same size for every entry)."""
    from train.loop import TrainConfig, make_optimizer
    rng = np.random.default_rng(0)

    def ill_conditioned():
        u, _ = np.linalg.qr(rng.normal(size=(48, 16)))
        v, _ = np.linalg.qr(rng.normal(size=(16, 16)))
        return u @ np.diag(np.logspace(0, -2, 16)) @ v.T, u @ v.T           # the gradient, its U V^T

    (g_q, polar_q), (g_0, polar_0), (g_1, polar_1) = ill_conditioned(), ill_conditioned(), ill_conditioned()
    grad = {"wq": g_q.reshape(48, 4, 4), "layers": {"w_up": np.stack([g_0, g_1]), "attn_norm": rng.normal(size=(2, 16))},
            "embed": rng.normal(size=(48, 16)), "b": rng.normal(size=16)}
    grad = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), grad)
    params = jax.tree.map(jnp.zeros_like, grad)
    for name in ("muon", "adamw"):
        opt = make_optimizer(TrainConfig(steps=10, warmup=0, lr=0.1, weight_decay=0.0, clip=1e9, optimizer=name))
        update, _ = opt.update(grad, opt.init(params), params)
        for w, polar in ((update["wq"].reshape(48, 16), polar_q), (update["layers"]["w_up"][0], polar_0),
                         (update["layers"]["w_up"][1], polar_1)):
            w = np.asarray(w)
            s = np.linalg.svd(w, compute_uv=False)
            cosine = -np.sum(w * polar) / np.linalg.norm(w) / np.linalg.norm(polar)
            if name == "muon":
                assert s.max() / s.min() <= 2.2 and cosine > 0.97, (s, cosine)
                assert 0.12 <= np.sqrt(np.mean(w ** 2)) / 0.1 <= 0.25
            else:
                assert s.max() / s.min() >= 4.0 and cosine < 0.9, (s, cosine)
        for vector in (update["b"], update["layers"]["attn_norm"], update["embed"]):
            step = np.abs(np.asarray(vector))
            np.testing.assert_allclose(step, step.flat[0], rtol=1e-4)
            assert step.flat[0] == pytest.approx(0.1, rel=1e-3) if name == "adamw" else step.flat[0] > 0.1
