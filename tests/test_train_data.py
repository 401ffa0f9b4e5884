"""Self-distilled data: shards, resume after a kill, settings guard, reading back."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import jaxspec
from train import data

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
    heldout = set(manifest["heldout_prompt_indices"])
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
    assert manifest["settings"]["num_prompts"] == 20
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


def test_settings_guard_and_bad_input(tmp_path, prompt_file):
    m = tiny_model()
    out = str(tmp_path / "data")
    data.make_data(m, prompt_file, out, num_prompts=8, heldout=2, max_new_tokens=4, shard_size=8, progress=False)
    with pytest.raises(ValueError, match="other settings"):
        data.make_data(m, prompt_file, out, num_prompts=8, heldout=2, max_new_tokens=5, shard_size=8,
                       progress=False)
    with pytest.raises(ValueError, match="num_prompts"):
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
    from train.vocab import draft_vocabulary

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
