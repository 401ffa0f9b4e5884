"""Acceptance checks during training: real speculative decoding through jaxspec.generate."""
from __future__ import annotations

import os

import numpy as np

from jaxspec.tokenizer import prompt_ids

from .data import read_manifest
from .prompts import pool_file, read_prompt_file


def heldout_prompts(model, data_dir: str, prompts_dir: str, limit: int) -> list[list[int]]:
    """`limit` held-out prompts of the data's last part, chat-templated token ids, taken from its pools in
    turn (so a mixed part checks math, code and chat alike). prompts_dir: the folder of the prompt files
    (or one of those files)."""
    if os.path.isfile(prompts_dir):
        prompts_dir = os.path.dirname(os.path.abspath(prompts_dir))
    part = read_manifest(data_dir)["parts"][-1]
    held = [part["heldout"][pool] for pool in part["settings"]["mix"]]
    chosen = [(pool, idx[r]) for r in range(max(map(len, held), default=0))
              for pool, idx in zip(part["settings"]["mix"], held) if r < len(idx)][:limit]
    texts = {}
    for pool, _ in chosen:
        if pool_file(pool) not in texts:
            texts[pool_file(pool)] = read_prompt_file(os.path.join(prompts_dir, pool_file(pool)))
    return [prompt_ids(model.tokenizer, texts[pool_file(pool)][i]) for pool, i in chosen]


def acceptance(model, drafter, prompts: list[list[int]], max_new_tokens: int = 64, num_draft_tokens: int = 5,
               batch_size: int = 8) -> dict:
    """Greedy speculative decoding of `prompts` -> mean accepted length and per-position acceptance
    (token-weighted over batches)."""
    from jaxspec import generate

    steps, mal, per_pos = 0, 0.0, np.zeros(num_draft_tokens)
    for b in range(0, len(prompts), batch_size):
        s = generate(model, prompts[b:b + batch_size], max_new_tokens=max_new_tokens, drafter=drafter,
                     num_draft_tokens=num_draft_tokens, adaptive=False).stats
        steps += s.target_steps
        mal += s.mean_accepted_length * s.target_steps
        per_pos += np.asarray(s.per_position_acceptance) * s.target_steps
    return {"mean_accepted_length": round(mal / max(steps, 1), 4),
            "per_position_acceptance": [round(float(a), 4) for a in per_pos / max(steps, 1)]}
