"""Acceptance checks during training: real speculative decoding through jaxspec.generate."""
from __future__ import annotations

import json
import os

import numpy as np

from .data import MANIFEST, read_prompt_file


def heldout_prompts(model, data_dir: str, prompts_path: str, limit: int) -> list[list[int]]:
    """The first `limit` held-out prompts recorded in the data manifest, chat-templated token ids."""
    with open(os.path.join(data_dir, MANIFEST)) as f:
        manifest = json.load(f)
    if os.path.basename(prompts_path) != manifest["settings"]["prompts_file"]:
        raise ValueError(f"the data in {data_dir} was made from {manifest['settings']['prompts_file']}, "
                         f"not {prompts_path}")
    texts = read_prompt_file(prompts_path)
    return [model.tokenizer.apply_chat_template([{"role": "user", "content": texts[i]}],
                                                add_generation_prompt=True)
            for i in manifest["heldout_prompt_indices"][:limit]]


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
