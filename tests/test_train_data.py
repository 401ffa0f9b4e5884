"""Self-distilled data: shards, resume after a kill, settings guard, reading back."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import jaxspec
from jaxspec.train import data

from .conftest import tiny_model


@pytest.fixture()
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"source": "t", "prompt": f"question number {i} " + "x" * (i % 7)}) + "\n"
                            for i in range(40)))
    return str(path)


def _shards(d):
    return sorted(f for f in os.listdir(d) if f.startswith("shard-"))


def test_make_data_resume_and_read(tmp_path, prompt_file):
    m = tiny_model()
    out = str(tmp_path / "data")
    kw = dict(num_prompts=20, heldout=4, max_new_tokens=6, batch_size=4, shard_size=8, progress=False)
    manifest = data.make_data(m, prompt_file, out, **kw)
    assert _shards(out) == ["shard-00000.npz", "shard-00001.npz", "shard-00002.npz"]
    examples = list(data.iter_examples(out))
    assert len(examples) == 20
    texts = data.read_prompt_file(prompt_file)
    assert manifest["version"] == 2 and len(manifest["parts"]) == 1
    heldout = set(manifest["parts"][0]["heldout"]["prompts.jsonl"])
    seen = set()
    for name in _shards(out):
        with np.load(os.path.join(out, name)) as z:
            seen |= set(z["prompt_index"].tolist())
    assert len(heldout) == 4 and not heldout & seen and len(seen) == 20
    # each stored answer is the target's own greedy answer to its chat-templated prompt
    with np.load(os.path.join(out, "shard-00001.npz")) as z:
        i, plen = int(z["prompt_index"][0]), int(z["prompt_lengths"][0])
        first = z["tokens"][:z["lengths"][0]].astype(int).tolist()
    ids = m.tokenizer.apply_chat_template([{"role": "user", "content": texts[i]}], add_generation_prompt=True)
    assert first[:plen] == ids
    assert first[plen:] == jaxspec.generate(m, [ids], max_new_tokens=6).tokens[0]

    # a kill loses at most the shard in progress: remove one, resume, only it is made again
    before = open(os.path.join(out, "shard-00000.npz"), "rb").read()
    os.remove(os.path.join(out, "shard-00001.npz"))
    open(os.path.join(out, "shard-00001.npz.tmp.npz"), "wb").write(b"partial")   # a half-written file
    calls = []
    real = jaxspec.generate
    try:
        jaxspec.generate = lambda *a, **k: calls.append(1) or real(*a, **k)
        data.make_data(m, prompt_file, out, **kw)
    finally:
        jaxspec.generate = real
    assert len(calls) == 2                                  # 8 prompts / batch 4: only shard 1 again
    assert open(os.path.join(out, "shard-00000.npz"), "rb").read() == before
    assert [e[0].tolist() for e in data.iter_examples(out)] == [e[0].tolist() for e in examples]
    assert data.summary(out)["examples"] == 20


def test_every_generate_call_has_the_same_rows(tmp_path, prompt_file, monkeypatch):
    m = tiny_model()
    calls, real = [], jaxspec.generate
    monkeypatch.setattr(jaxspec, "generate", lambda model, prompts, **k: calls.append(len(prompts))
                        or real(model, prompts, **k))
    out = str(tmp_path / "data")
    data.make_data(m, prompt_file, out, num_prompts=10, heldout=2, max_new_tokens=5, batch_size=4, shard_size=8,
                   progress=False)
    assert calls == [4, 4, 4]                          # shard 1's two prompts padded to the call's 4 rows
    assert data.summary(out)["examples"] == 10
    seqs, plens = data.read_shard(out, "shard-00001.npz")
    assert len(seqs) == 2
    for ids, p in zip(seqs, plens):                    # padding changed no answer
        assert ids[p:].tolist() == real(m, [ids[:p].tolist()], max_new_tokens=5).tokens[0]


def test_more_prompts_extend_the_data(tmp_path, prompt_file):
    m = tiny_model()
    kw = dict(heldout=4, max_new_tokens=4, batch_size=4, shard_size=8, progress=False)
    out, fresh = str(tmp_path / "data"), str(tmp_path / "fresh")
    data.make_data(m, prompt_file, out, num_prompts=12, **kw)          # shard 1 holds 4 of its 8 prompts
    first = open(os.path.join(out, "shard-00000.npz"), "rb").read()
    manifest = data.make_data(m, prompt_file, out, num_prompts=20, **kw)
    assert manifest["parts"][-1]["settings"]["num_prompts"] == 20
    assert open(os.path.join(out, "shard-00000.npz"), "rb").read() == first      # kept, not made again
    data.make_data(m, prompt_file, fresh, num_prompts=20, **kw)
    assert _shards(out) == _shards(fresh) == ["shard-00000.npz", "shard-00001.npz", "shard-00002.npz"]
    for name in _shards(out):
        with np.load(os.path.join(out, name)) as a, np.load(os.path.join(fresh, name)) as b:
            assert a["prompt_index"].tolist() == b["prompt_index"].tolist()
            assert a["tokens"].tolist() == b["tokens"].tolist()
    with pytest.raises(ValueError, match="not shrink"):
        data.make_data(m, prompt_file, out, num_prompts=16, **kw)
    with pytest.raises(ValueError, match="keeps out other prompts"):
        data.make_data(m, prompt_file, out, num_prompts=20, **{**kw, "heldout": 5})
    with pytest.raises(ValueError, match="--new-part"):
        data.make_data(m, prompt_file, out, num_prompts=20, **{**kw, "max_new_tokens": 5})


def test_settings_guard_and_bad_input(tmp_path, prompt_file):
    m = tiny_model()
    out = str(tmp_path / "data")
    data.make_data(m, prompt_file, out, num_prompts=8, heldout=2, max_new_tokens=4, shard_size=8, progress=False)
    with pytest.raises(ValueError, match="other settings"):
        data.make_data(m, prompt_file, out, num_prompts=8, heldout=2, max_new_tokens=5, shard_size=8,
                       progress=False)
    with pytest.raises(ValueError, match="holds only 38 unused prompts"):
        data.make_data(m, prompt_file, str(tmp_path / "d2"), num_prompts=100, heldout=2, progress=False)
    with pytest.raises(ValueError, match="not found"):
        data.make_data(m, str(tmp_path / "none.jsonl"), out, progress=False)
    with open(os.path.join(out, "shard-00000.npz"), "wb") as f:
        f.write(b"not a zip")
    with pytest.raises(ValueError, match="shard-00000"):
        list(data.iter_examples(out))
    with pytest.raises(ValueError, match="no data shards"):
        list(data.iter_examples(str(tmp_path)))


def test_draft_vocabulary_takes_the_most_frequent_answer_tokens(tmp_path):
    from jaxspec.train.vocab import draft_vocabulary

    out = str(tmp_path / "d")
    os.makedirs(out)
    seqs = [([1, 2, 3], [7, 7, 7, 5]), ([9], [5, 7, 4])]     # (prompt, answer): prompt tokens do not count
    tokens = np.concatenate([np.asarray(p + a, np.uint16) for p, a in seqs])
    np.savez(os.path.join(out, "shard-00000.npz"), tokens=tokens,
             lengths=np.asarray([7, 4], np.int32), prompt_lengths=np.asarray([3, 1], np.int32))
    d2t, coverage = draft_vocabulary(out, 10, 2)
    assert d2t.tolist() == [7, 5] and coverage == pytest.approx(6 / 7)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        draft_vocabulary(out, 10, 11)


@pytest.fixture()
def prompt_dir(tmp_path):
    """Two prompt files: plain.jsonl (30 rows) and mixed.jsonl (24 code rows, 36 chat rows)."""
    d = tmp_path / "prompts"
    d.mkdir()
    (d / "plain.jsonl").write_text("".join(json.dumps({"prompt": f"sum {i} and {i + 1}"}) + "\n" for i in range(30)))
    (d / "mixed.jsonl").write_text("".join(
        json.dumps({"kind": "code" if i % 5 < 2 else "chat", "prompt": f"{'def f' if i % 5 < 2 else 'tell me'} {i}"})
        + "\n" for i in range(60)))
    return str(d)


def test_a_mix_draws_each_pool_by_weight_and_keeps_pools_apart(prompt_dir):
    from jaxspec.train.prompts import parse_mix, pool_orders, stream

    mix = parse_mix("plain.jsonl=1,mixed.jsonl:code=2,mixed.jsonl:chat=2")
    assert mix == {"plain.jsonl": 0.2, "mixed.jsonl:code": 0.4, "mixed.jsonl:chat": 0.4}
    held, order, texts = pool_orders(mix, prompt_dir, seed=3, heldout=2, excluded={})
    items = stream(mix, order, seed=3, n=40)
    assert stream(mix, order, seed=3, n=25) == items[:25]          # more prompts continue the same draws
    counts = {p: sum(q == p for q, _ in items) for p in mix}
    assert counts["plain.jsonl"] < counts["mixed.jsonl:code"] and counts["plain.jsonl"] < counts["mixed.jsonl:chat"]
    for pool, i in items:                                           # each prompt is of its pool's kind
        kind = pool.partition(":")[2]
        assert {"code": texts["mixed.jsonl"][i].startswith("def"), "chat": texts["mixed.jsonl"][i].startswith("tell"),
                "": True}[kind]
        assert i not in held[pool]
    assert len({(p.partition(":")[0], i) for p, i in items}) == 40   # no prompt twice
    with pytest.raises(ValueError, match="mixed.jsonl:code"):
        stream(mix, order, seed=3, n=200)                           # 22 unused code prompts
    with pytest.raises(ValueError, match="weight"):
        parse_mix("plain.jsonl=0")
    with pytest.raises(ValueError, match="no row of kind"):
        pool_orders({"mixed.jsonl:math": 1.0}, prompt_dir, 0, 0, {})


def test_sampled_answers_are_the_last_quarter_of_each_shard_and_reproducible(tmp_path, prompt_dir):
    m = tiny_model()
    kw = dict(num_prompts=16, heldout=2, max_new_tokens=6, batch_size=4, shard_size=8, sampled_fraction=0.25,
              temperature=0.7, prompts_dir=prompt_dir, progress=False)
    mix = "plain.jsonl=1,mixed.jsonl:code=1,mixed.jsonl:chat=1"
    out, again = str(tmp_path / "a"), str(tmp_path / "b")
    manifest = data.make_data(m, mix, out, **kw)
    data.make_data(m, mix, again, **kw)
    texts = {f: data.read_prompt_file(os.path.join(prompt_dir, f)) for f in ("plain.jsonl", "mixed.jsonl")}
    pools = list(manifest["parts"][0]["settings"]["mix"])
    sampled_rows = 0
    for name in _shards(out):
        with np.load(os.path.join(out, name)) as z, np.load(os.path.join(again, name)) as y:
            assert z["tokens"].tolist() == y["tokens"].tolist()     # same seeds, same answers
            temps, pool, index = z["temperature"], z["pool"], z["prompt_index"]
            assert sorted(temps.tolist()) == [0.0] * 6 + [0.7 * np.float32(1)] * 2
            seqs, plens = data.read_shard(out, name)
        for ids, p, t, q, i in zip(seqs, plens, temps, pool, index):
            prompt = m.tokenizer.apply_chat_template(
                [{"role": "user", "content": texts[pools[q].partition(":")[0]][i]}], add_generation_prompt=True)
            assert ids[:p].tolist() == prompt
            greedy = jaxspec.generate(m, [prompt], max_new_tokens=6).tokens[0]
            if t == 0:
                assert ids[p:].tolist() == greedy
            else:
                sampled_rows += 1
                assert len(ids) > p
    assert sampled_rows == 4
    counts = data.summary(out)
    assert counts["sampled_answers"] == 4 and sum(c["examples"] for c in counts["pools"].values()) == 16


def test_a_version_1_folder_gains_a_new_part_on_unused_prompts(tmp_path, prompt_dir):
    m = tiny_model()
    out = str(tmp_path / "data")
    plain = os.path.join(prompt_dir, "plain.jsonl")
    data.make_data(m, plain, out, num_prompts=8, heldout=2, max_new_tokens=4, batch_size=4, shard_size=8,
                   progress=False)
    # rewrite the manifest as the first data maker wrote it (version 1), shards untouched
    part = data.read_manifest(out)["parts"][0]
    s = part["settings"]
    v1 = {"settings": {"target": s["target"], "fingerprint": s["fingerprint"], "prompts_file": "plain.jsonl",
                       "num_prompts": 8, "max_new_tokens": 4, "max_prompt_tokens": s["max_prompt_tokens"],
                       "seed": 0, "shard_size": 8, "sampling": "greedy"},
          "heldout_prompt_indices": part["heldout"]["plain.jsonl"]}
    with open(os.path.join(out, data.MANIFEST), "w") as f:
        json.dump(v1, f)
    first = open(os.path.join(out, "shard-00000.npz"), "rb").read()
    old_prompts = set(np.load(os.path.join(out, "shard-00000.npz"))["prompt_index"].tolist())
    with pytest.raises(ValueError, match="other settings"):
        data.make_data(m, "plain.jsonl=1,mixed.jsonl:code=1", out, num_prompts=8, heldout=2, max_new_tokens=4,
                       batch_size=4, shard_size=8, prompts_dir=prompt_dir, progress=False)
    manifest = data.make_data(m, "plain.jsonl=1,mixed.jsonl:code=1", out, num_prompts=12, heldout=2,
                              max_new_tokens=4, batch_size=4, shard_size=8, prompts_dir=prompt_dir, new_part=True,
                              progress=False)
    assert [p["first_shard"] for p in manifest["parts"]] == [0, 1]
    assert open(os.path.join(out, "shard-00000.npz"), "rb").read() == first
    assert _shards(out) == ["shard-00000.npz", "shard-00001.npz", "shard-00002.npz"]
    new_plain = set()
    for name in ("shard-00001.npz", "shard-00002.npz"):
        with np.load(os.path.join(out, name)) as z:
            new_plain |= {i for q, i in zip(z["pool"].tolist(), z["prompt_index"].tolist()) if q == 0}
    assert new_plain and not new_plain & (old_prompts | set(v1["heldout_prompt_indices"]))
    counts = data.summary(out)
    assert counts["examples"] == 20 and set(counts["pools"]) == {"plain.jsonl", "mixed.jsonl:code"}
    # the held-out prompts of a check alternate between the last part's pools
    from jaxspec.train.acceptance import heldout_prompts
    held = heldout_prompts(m, out, prompt_dir, 4)
    part = manifest["parts"][1]["heldout"]
    plain_t = data.read_prompt_file(os.path.join(prompt_dir, "plain.jsonl"))
    mixed_t = data.read_prompt_file(os.path.join(prompt_dir, "mixed.jsonl"))
    expect = [plain_t[part["plain.jsonl"][0]], mixed_t[part["mixed.jsonl:code"][0]],
              plain_t[part["plain.jsonl"][1]], mixed_t[part["mixed.jsonl:code"][1]]]
    assert held == [m.tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
                    for t in expect]
    assert expect[1].startswith("def f") and expect[0].startswith("sum")


def test_coverage_counts_answer_tokens_inside_the_draft_vocabulary(tmp_path, prompt_dir):
    from jaxspec.train.coverage import coverage, vocab_report
    from jaxspec.train.vocab import draft_vocabulary

    assert coverage(np.asarray([3, 5]), [[3, 3, 4], [5]]) == pytest.approx(3 / 4)
    m = tiny_model()
    out = str(tmp_path / "data")
    data.make_data(m, "plain.jsonl=1,mixed.jsonl:code=1", out, num_prompts=16, heldout=2, max_new_tokens=6,
                   batch_size=4, shard_size=4, prompts_dir=prompt_dir, progress=False)
    evalf = tmp_path / "eval.jsonl"
    evalf.write_text("".join(json.dumps({"source": s, "prompt": f"{s} question {i}"}) + "\n"
                             for s in ("math", "code") for i in range(5)))
    r = vocab_report(m, out, [2, m.config.vocab_size], str(evalf), per_source=3, max_new_tokens=5,
                     out_dir=str(tmp_path / "cov"), every=2)
    assert set(r["eval"]) == {"math", "code"} and r["kept_out_shards"] == 2
    assert all(v[-1] == 1.0 for v in r["eval"].values())          # the whole vocabulary holds every token
    assert all(0.0 <= v[0] <= v[-1] for v in list(r["eval"].values()) + list(r["data"].values()))
    ans = json.load(open(tmp_path / "cov" / "eval-answers.json"))["answers"]
    ids = m.tokenizer.apply_chat_template([{"role": "user", "content": "math question 0"}], add_generation_prompt=True)
    assert ans["math"][0] == jaxspec.generate(m, [ids], max_new_tokens=5).tokens[0]
    d2t, _ = draft_vocabulary(out, m.config.vocab_size, 2, names=["shard-00000.npz", "shard-00002.npz"])
    assert r["eval"]["math"][0] == round(coverage(d2t, ans["math"]), 4)   # counted on the other shards only
    assert (tmp_path / "cov" / "coverage.png").read_bytes()[:4] == b"\x89PNG"
