"""Offline replay of drafters that read only the text (NGram, Suffix) over held-out data shards, per
prompt pool: the accepted length greedy speculative decoding would get, without running the target
(jaxspec.replay). The suffix store is built from other shards, so no test answer is in it.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

from jaxspec import shards
from jaxspec.drafters import NGram, Suffix, SuffixConfig, suffix_store
from jaxspec.replay import replay

from .data import read_shard, select_shards, shard_pools


def greedy_examples(data_dir: str, names: list[str]) -> dict[str, tuple[list, list]]:
    """{pool: (prompt + answer token ids, prompt lengths)} of the greedy answers in shards `names`."""
    pools = shard_pools(data_dir)
    out: dict[str, tuple[list, list]] = {}
    for name in names:
        with np.load(os.path.join(data_dir, name)) as z:
            temps = z["temperature"] if "temperature" in z else np.zeros(len(z["lengths"]))
            pool_ids = z["pool"] if "pool" in z else np.zeros(len(z["lengths"]), int)
        for seq, plen, t, p in zip(*read_shard(data_dir, name), temps, pool_ids):
            if t == 0:
                seqs, plens = out.setdefault(pools[name][int(p)], ([], []))
                seqs.append(seq)
                plens.append(plen)
    return out


def make_replay_drafter(spec: str, store: suffix_store.SuffixStore):
    """'ngram' | 'suffix' | 'suffix:RULE' (suffix.RULES) | 'suffix:none' (the row's own text only)."""
    name, _, arg = spec.partition(":")
    if name == "ngram":
        return NGram()
    if name == "suffix":
        return Suffix(None) if arg == "none" else Suffix(store, SuffixConfig(rule=arg or "score"))
    raise ValueError(f"replay takes ngram, suffix, suffix:RULE or suffix:none, not {spec!r}")


def run_replay(data_dir: str, test_spec: str, store_spec: str, drafters: list[str], k: int) -> dict:
    """Mean accepted length per (pool, drafter) at K = k, with the store's size and build time."""
    t0 = time.perf_counter()
    store = suffix_store.build(shards.answers(data_dir, select_shards(data_dir, store_spec)))
    result = {"data": data_dir, "test_shards": test_spec, "store_shards": store_spec, "k": k,
              "store_tokens": store.size, "store_mib": round(store.nbytes / 2**20, 1),
              "store_build_seconds": round(time.perf_counter() - t0, 2), "pools": {}}
    for pool, (seqs, plens) in greedy_examples(data_dir, select_shards(data_dir, test_spec)).items():
        row = {"answers": len(seqs), "answer_tokens": int(sum(len(s) - p for s, p in zip(seqs, plens)))}
        for spec in drafters:
            r = replay(make_replay_drafter(spec, store), seqs, plens, k)
            row[spec] = round(r.mean_accepted_length, 3)
        result["pools"][pool] = row
        print(json.dumps({pool: row}))
    return result
