"""The data shards `jaxspec train data` writes (shard-*.npz: the examples' tokens end to end, their
lengths and prompt lengths), read by the suffix store at run time and by train/ for training."""
from __future__ import annotations

import os

import numpy as np


def shard_names(data_dir: str) -> list[str]:
    """The complete data shards in `data_dir`, in order."""
    if not os.path.isdir(data_dir):
        raise ValueError(f"data folder not found: {data_dir}")
    names = sorted(f for f in os.listdir(data_dir) if f.startswith("shard-") and f.endswith(".npz")
                   and ".tmp" not in f)
    if not names:
        raise ValueError(f"{data_dir} holds no data shards: run `jaxspec train data` first")
    return names


def read_shard(data_dir: str, name: str) -> tuple[list[np.ndarray], list[int]]:
    """-> (token ids int32[T] per example, prompt length per example)."""
    try:
        with np.load(os.path.join(data_dir, name)) as z:
            tokens, lengths, plens = z["tokens"], z["lengths"], z["prompt_lengths"]
    except Exception as e:
        raise ValueError(f"cannot read data shard {name} in {data_dir}: {e}") from e
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int)
    return [tokens[s:s + n].astype(np.int32) for s, n in zip(starts, lengths)], [int(p) for p in plens]


def answers(data_dir: str, names: list[str] | None = None) -> list[np.ndarray]:
    """The answers (tokens after each prompt) of the shards `names` (default: all) of a data folder."""
    out = []
    for name in names or shard_names(data_dir):
        examples, prompt_lengths = read_shard(data_dir, name)
        out += [ids[p:] for ids, p in zip(examples, prompt_lengths)]
    return out
