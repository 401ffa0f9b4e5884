"""Reduced draft vocabulary (EAGLE-3): the target tokens heads predict most often in the data."""
from __future__ import annotations

import numpy as np

from .data import iter_examples


def draft_vocabulary(data_dir: str, vocab_size: int, draft_vocab_size: int,
                     names: list[str] | None = None) -> tuple[np.ndarray, float]:
    """-> (d2t int32[Vd]: draft id -> target id, most frequent answer tokens first, ties (unseen
    answer tokens included) broken by prompt frequency; coverage: the fraction of answer tokens
    inside the draft vocabulary). names: count only these shards (default all)."""
    if not 1 <= draft_vocab_size <= vocab_size:
        raise ValueError(f"draft_vocab_size must lie in [1, {vocab_size}], got {draft_vocab_size}")
    counts = np.zeros(vocab_size, np.int64)
    prompt_counts = np.zeros(vocab_size, np.int64)
    for ids, prompt_len in iter_examples(data_dir, names):
        counts += np.bincount(ids[prompt_len:], minlength=vocab_size)
        prompt_counts += np.bincount(ids[:prompt_len], minlength=vocab_size)
    order = np.lexsort((-prompt_counts, -counts))[:draft_vocab_size]
    total = counts.sum()
    return order.astype(np.int32), float(counts[order].sum() / total) if total else 0.0
