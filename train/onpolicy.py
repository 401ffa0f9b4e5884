"""On-policy distillation of the draft model (DistillSpec, Zhou et al., ICLR 2024; GKD, Agarwal et al. 2024).

A draft trained only on the target's answers sees, when it drafts, prefixes it would have written
itself. Each round here lets the current draft write answers to fresh training prompts (a data part
whose writer is the draft, train/data.py), computes the target's distributions over those answers
(the feature cache), and fine-tunes the draft on all rounds so far with the total-variation loss,
which is what the acceptance of a sampled draft token measures (1 - TV(p, q), Leviathan et al. 2023).
"""
from __future__ import annotations

import os

from jaxspec.drafters import DraftModel

from .data import MANIFEST, heldout_indices, make_data, read_manifest
from .draft import train_draft


def onpolicy_rounds(model, draft_path: str, data_dir: str, out_dir: str, train_cfg, rounds: int = 1,
                    prompts_per_round: int = 512, mix="train.jsonl=0.2,train-mix.jsonl:code=0.4,train-mix.jsonl:chat=0.4",
                    prompts_dir: str | None = None, sampled_fraction: float = 0.5, temperature: float = 1.0,
                    max_new_tokens: int = 256, batch_size: int = 64, shard_size: int = 256, heldout: int = 16,
                    loss: str = "tv", seed: int = 1, keep_out: str | None = None, eval_prompts=None,
                    eval_tokens: int = 64,
                    progress: bool = True, **train_kw) -> DraftModel:
    """`rounds` rounds of (the latest draft answers prompts_per_round new prompts; fine-tune it on every
    round's answers for train_cfg.steps steps). Round r's draft goes to out_dir/round-r (resumable: a
    finished round is kept); the data parts go to data_dir, never on the prompts held out by the data folder
    keep_out (where eval_prompts come from). -> the last round's draft."""
    if rounds < 1 or prompts_per_round < 1:
        raise ValueError(f"rounds and prompts_per_round must be >= 1, got {rounds}, {prompts_per_round}")
    current = draft_path
    for r in range(rounds):
        round_dir = os.path.join(out_dir, f"round-{r}")
        if os.path.isfile(os.path.join(round_dir, DraftModel.METADATA)):
            current = round_dir
            continue
        writer = DraftModel.load(current)
        writer.check_target(model)
        exists = os.path.isfile(os.path.join(data_dir, MANIFEST))
        make_data(model, mix, data_dir, num_prompts=prompts_per_round, heldout=heldout,
                  max_new_tokens=max_new_tokens, batch_size=batch_size, shard_size=shard_size, seed=seed + r,
                  sampled_fraction=sampled_fraction, temperature=temperature, prompts_dir=prompts_dir,
                  new_part=exists and not _written_by(data_dir, writer), writer=writer.model,
                  exclude=heldout_indices(keep_out) if keep_out else None, progress=progress)
        train_draft(model, data_dir, round_dir, train_cfg, init=current, loss=loss, seed=seed + r,
                    eval_prompts=eval_prompts, eval_tokens=eval_tokens, progress=progress,
                    resume=os.path.isdir(round_dir), **train_kw)
        current = round_dir
    return DraftModel.load(current)


def _written_by(data_dir: str, writer: DraftModel) -> bool:
    """Whether the data's last part was written by this draft (a round killed before its training)."""
    last = read_manifest(data_dir)["parts"][-1]["settings"]
    return last.get("writer", {}).get("fingerprint") == writer.model.fingerprint
