"""How much of what the target says a draft vocabulary holds.

A head drafts only tokens of its draft vocabulary (train/vocab.py: the Vd most frequent answer tokens
of the training data), so the share of the target's own tokens outside it bounds acceptance from
above. Coverage is measured on the target's greedy answers to evaluation prompts of each source (the
answers are only counted, never trained on) and, for each pool of the training data, on shards left
out of the frequency count.
"""
from __future__ import annotations

import json
import os

import numpy as np

from jaxspec.tokenizer import prompt_ids

from .data import iter_examples, read_pool_index, read_shard, shard_names, shard_pools
from .vocab import draft_vocabulary

PLOT = "coverage.png"


def coverage(d2t: np.ndarray, answers: list) -> float:
    """Share of the tokens in `answers` (lists of token ids) that lie in the draft vocabulary d2t."""
    tokens = np.concatenate([np.asarray(a, np.int64) for a in answers]) if answers else np.zeros(0, np.int64)
    return float(np.isin(tokens, d2t).mean()) if len(tokens) else float("nan")


def eval_answers(model, eval_path: str, per_source: int = 20, max_new_tokens: int = 128,
                 cache_path: str | None = None) -> dict[str, list[list[int]]]:
    """The target's greedy answers to `per_source` prompts of each source of eval_path (spread over the
    source's rows, as `jaxspec bench --source` takes them); kept in cache_path for the next call."""
    from jaxspec import generate
    from jaxspec.bench import read_prompts

    key = {"fingerprint": model.fingerprint, "file": os.path.basename(eval_path), "per_source": per_source,
           "max_new_tokens": max_new_tokens}
    if cache_path and os.path.isfile(cache_path):
        with open(cache_path) as f:
            cached = json.load(f)
        if cached.get("key") == key:
            return cached["answers"]
    with open(eval_path) as f:
        sources = sorted({json.loads(line).get("source", "") for line in f if line.strip()})
    answers = {}
    for source in sources:
        texts = read_prompts(eval_path, per_source, source)
        ids = [prompt_ids(model.tokenizer, t) for t in texts]
        answers[source] = generate(model, ids, max_new_tokens=max_new_tokens).tokens
    if cache_path:
        os.makedirs(os.path.dirname(os.path.abspath(cache_path)), exist_ok=True)
        with open(cache_path, "w") as f:
            json.dump({"key": key, "answers": answers}, f)
    return answers


def data_answers_by_pool(data_dir: str, names: list[str]) -> dict[str, list[np.ndarray]]:
    """The stored answers of the shards `names`, grouped by prompt pool."""
    pool_names = shard_pools(data_dir)
    out: dict[str, list[np.ndarray]] = {}
    for name in names:
        seqs, plens = read_shard(data_dir, name)
        with np.load(os.path.join(data_dir, name)) as z:
            pools = read_pool_index(z, len(seqs))
        for ids, p, q in zip(seqs, plens, pools):
            out.setdefault(pool_names[name][q], []).append(ids[p:])
    return out


def vocab_report(model, data_dir: str, sizes, eval_path: str, per_source: int = 20, max_new_tokens: int = 128,
                 out_dir: str | None = None, every: int = 8, provenance: dict | None = None) -> dict:
    """Coverage of draft vocabularies of each size in `sizes`: on each eval source, and per data pool on every
    `every`-th shard (counted out of a vocabulary made from the other shards). -> {"sizes", "eval":
    {source: [share per size]}, "data": {pool: [...]}, "answer_tokens": ...}; writes coverage.json and a
    plot to out_dir, with `provenance` ({"date", "machine", "command"}: how it was made) merged in."""
    V = model.config.vocab_size
    names = shard_names(data_dir)
    kept_out = names[every - 1::every]
    counted = [n for n in names if n not in kept_out]
    answers = eval_answers(model, eval_path, per_source, max_new_tokens,
                           os.path.join(out_dir, "eval-answers.json") if out_dir else None)
    held = data_answers_by_pool(data_dir, kept_out)
    report = {"sizes": [int(s) for s in sizes], "eval": {s: [] for s in answers}, "data": {p: [] for p in held},
              "eval_answer_tokens": {s: int(sum(map(len, a))) for s, a in answers.items()},
              "data_answer_tokens": sum(len(ids) - p for ids, p in iter_examples(data_dir)),
              "kept_out_shards": len(kept_out), **(provenance or {})}
    for size in sizes:
        d2t, _ = draft_vocabulary(data_dir, V, int(size), names=counted)
        for s, a in answers.items():
            report["eval"][s].append(round(coverage(d2t, a), 4))
        for p, a in held.items():
            report["data"][p].append(round(coverage(d2t, a), 4))
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "coverage.json"), "w") as f:
            json.dump(report, f, indent=1)
        plot_coverage(report, os.path.join(out_dir, PLOT))
    return report


def plot_coverage(report: dict, path: str) -> str | None:
    """The coverage of each eval source and data pool against Vd -> path (None without matplotlib)."""
    from .plots import pyplot, save
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for s, shares in report["eval"].items():
        ax.plot(report["sizes"], shares, "o-", label=f"eval: {s}")
    for p, shares in report["data"].items():
        ax.plot(report["sizes"], shares, "x--", alpha=0.6, label=f"data kept out: {p}")
    ax.axhline(0.98, color="gray", lw=0.8, ls=":", label="98%")
    ax.set(xscale="log", xlabel="draft vocabulary size Vd", ylabel="share of the target's answer tokens",
           title="draft vocabulary coverage", ylim=(min(0.7, ax.get_ylim()[0]), 1.0))
    ax.set_xticks(report["sizes"], [str(s) for s in report["sizes"]])
    ax.set_xticks([], minor=True)                          # log-scale minor labels would overprint the sizes
    ax.legend(fontsize=7)
    return save(fig, path)
