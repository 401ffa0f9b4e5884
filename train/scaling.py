"""A data-scaling curve: the EAGLE head trained on 1/8, 1/4, 1/2 and all of the data, the same schedule per
token (each run sees its data `epochs` times: steps in proportion to its tokens), and its held-out
acceptance, so we know whether more data would still pay.

Subsets take every n-th shard (shard i is in fraction f when i % round(1/f) == 0), so each subset has
the mix of the whole, and a smaller subset lies inside every larger one.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os

from .data import read_shard, shard_names
from .eagle import train_eagle

PLOT = "scaling.png"


def subset(names: list[str], fraction: float) -> list[str]:
    """Every round(1/fraction)-th shard of `names` (all of them for fraction 1)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fractions must lie in (0, 1], got {fraction}")
    return names[::max(1, round(1 / fraction))]


def scaling_curve(model, data_dir: str, out_dir: str, train_cfg, fractions=(0.125, 0.25, 0.5, 1.0),
                  epochs: float = 1.0, tokens_per_batch: int = 4096, eval_prompts=None, eval_tokens: int = 64,
                  progress: bool = True, provenance: dict | None = None, **eagle_kw) -> dict:
    """Train one EAGLE head per fraction (out_dir/frac-F, resumable) for ceil(epochs * tokens / tokens_per_batch)
    steps (train_cfg.steps is ignored, its other settings kept, warm-up capped at a tenth of the steps). -> {"runs": [{"fraction",
    "shards", "answer_tokens", "tokens", "steps", "mean_accepted_length", "per_position_acceptance"}],
    **provenance}; written to out_dir/scaling.json with a plot."""
    names = shard_names(data_dir)
    runs = []
    for f in sorted(fractions):
        chosen = subset(names, f)
        tokens = answer = 0
        for name in chosen:
            seqs, plens = read_shard(data_dir, name)
            tokens += sum(len(s) for s in seqs)
            answer += sum(len(s) - p for s, p in zip(seqs, plens))
        steps = max(2, math.ceil(epochs * tokens / tokens_per_batch))
        cfg = dataclasses.replace(train_cfg, steps=steps, warmup=min(train_cfg.warmup, steps // 10),
                                  save_every=min(train_cfg.save_every, steps))
        run_dir = os.path.join(out_dir, f"frac-{f:g}")
        done = os.path.isfile(os.path.join(run_dir, "head.json"))
        head = train_eagle(model, data_dir, run_dir, cfg, tokens_per_batch=tokens_per_batch, shards=chosen,
                           eval_prompts=eval_prompts, eval_tokens=eval_tokens, progress=progress,
                           resume=os.path.isdir(os.path.join(run_dir, "ckpt")), **eagle_kw) if not done else None
        if head is None:
            from jaxspec.drafters import Eagle
            head = Eagle.load(run_dir)
        acc = head.metadata.heldout_acceptance or {}
        runs.append({"fraction": f, "shards": len(chosen), "answer_tokens": answer, "tokens": tokens, "steps": steps,
                     "mean_accepted_length": acc.get("mean_accepted_length"),
                     "per_position_acceptance": acc.get("per_position_acceptance")})
        result = {"data": os.path.basename(os.path.normpath(data_dir)), "epochs": epochs,
                  "tokens_per_batch": tokens_per_batch, "runs": runs, **(provenance or {})}
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "scaling.json"), "w") as fh:
            json.dump(result, fh, indent=1)
    plot_scaling(result, os.path.join(out_dir, PLOT))
    return result


def plot_scaling(result: dict, path: str) -> str | None:
    """Held-out acceptance against answer tokens trained on -> path (None without matplotlib)."""
    from .plots import pyplot, save
    plt = pyplot()
    if plt is None:
        return None
    runs = [r for r in result["runs"] if r["mean_accepted_length"] is not None]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    x = [r["answer_tokens"] for r in runs]
    axes[0].plot(x, [r["mean_accepted_length"] for r in runs], "o-")
    axes[0].set(xscale="log", xlabel="answer tokens trained on", ylabel="held-out mean accepted length (K=5)",
                title=f"EAGLE head: data scaling ({result['epochs']:g} epoch(s) each)")
    for j in range(len(runs[0]["per_position_acceptance"]) if runs else 0):
        axes[1].plot(x, [r["per_position_acceptance"][j] for r in runs], "o-", label=f"draft {j + 1}")
    axes[1].set(xscale="log", xlabel="answer tokens trained on", ylabel="acceptance", title="per draft position")
    if runs:
        axes[1].legend(fontsize=8)
    return save(fig, path)
