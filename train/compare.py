"""Joint runs side by side (`jaxspec train compare`): the same heads, data and seed under different settings
(an optimizer, a learning rate) see the same batch at step k (train/batches.py), so their logged metrics at a
step are a paired comparison. In a run's first epoch every batch is new to the head before its step, so a
step's top-1 agreement and loss are held-out figures (progressive validation), with no extra decoding.
"""
from __future__ import annotations

import json
import os

import numpy as np

from jaxspec.plotting import pyplot

from .joint import run_dir
from .loop import read_metrics
from .plots import save

KINDS = ("eagle", "mtp", "draft")


def _first(value) -> float:
    """A logged metric: the first draft step's value of a per-step list, or the scalar."""
    return float(value[0]) if isinstance(value, list) else float(value)


def _records(name: str, kind: str, until: int) -> dict:
    """{step: record} of one head of one run, steps <= until (the last record of a step wins)."""
    return {r["step"]: r for r in read_metrics(os.path.join(run_dir(name), kind))
            if "loss" in r and r["step"] <= until}


def compare_runs(names: list[str], until: int, window: int) -> dict:
    """Each head the runs share, at the steps all of them logged (<= until): first-draft-step top-1 and loss per
    step, and their means over the last `window` of those steps, with each run's median seconds per step.
    -> {"until", "window", "heads": {kind: {"steps": [...], "runs": {name: {...}}}}}."""
    heads = {}
    for kind in KINDS:
        logs = {name: _records(name, kind, until) for name in names}
        if not all(logs.values()):
            continue
        steps = sorted(set.intersection(*(set(log) for log in logs.values())))
        last = [s for s in steps if s > (steps[-1] if steps else 0) - window]     # the last len(last) of steps
        runs = {}
        for name, log in logs.items():
            top1 = [_first(log[s]["top1_j"]) for s in steps]
            loss = [_first(log[s]["loss_j"]) for s in steps]
            logged = sorted(log)                        # a record's seconds span the steps since the one before
            per_step = [log[s]["seconds"] / (s - before) for before, s in zip([0] + logged[:-1], logged)]
            runs[name] = {"top1_first": [round(x, 4) for x in top1], "loss_first": [round(x, 4) for x in loss],
                          "window_top1_first": round(float(np.mean(top1[len(steps) - len(last):])), 4),
                          "window_loss_first": round(float(np.mean(loss[len(steps) - len(last):])), 4),
                          "median_seconds_per_step": round(float(np.median(per_step)), 2)}
        heads[kind] = {"steps": steps, "window_steps": [last[0], last[-1]] if last else [], "runs": runs}
    if not heads:
        raise ValueError(f"no head was logged by every one of the runs {names} (in {os.path.dirname(run_dir('x'))})")
    return {"runs": list(names), "until": until, "window": window, "heads": heads}


def plot_comparison(result: dict, path: str) -> str | None:
    """Each head's first-draft-step top-1 against the step, one line per run; -> path."""
    plt = pyplot(path)
    if plt is None:
        return None
    kinds = list(result["heads"])
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.5 * len(kinds), 3.6), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        head = result["heads"][kind]
        for name, r in head["runs"].items():
            ax.plot(head["steps"], r["top1_first"], label=name, linewidth=1)
        ax.set(title=f"{kind}: top-1 of the first draft token", xlabel="step (a new batch each)", ylim=(0, None))
        ax.legend()
    return save(fig, path)


def write_comparison(result: dict, out: str) -> tuple[str, str | None]:
    """OUT.json and OUT.png; -> their paths."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    return out + ".json", plot_comparison(result, out + ".png")
