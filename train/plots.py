"""A picture of a training run from its metrics.jsonl: loss, top-1 agreement per draft position and
held-out acceptance length against step."""
from __future__ import annotations

import os

from jaxspec.plotting import pyplot

from .loop import read_metrics

PLOT = "training.png"


def save(fig, path: str) -> str:
    """Lay out, write and close a figure; -> path."""
    import matplotlib.pyplot as plt
    for ax in fig.axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_run(run_dir: str, out_dir: str | None = None) -> str | None:
    """Write training.png of the run logged in run_dir to out_dir (default run_dir); -> its path (None when
    matplotlib is not installed)."""
    out_dir = out_dir or run_dir
    plt = pyplot(f"{PLOT} of {out_dir}")
    if plt is None:
        return None
    records = read_metrics(run_dir)
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval" in r]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    steps = [r["step"] for r in train]
    axes[0].plot(steps, [r["loss"] for r in train])
    axes[0].set(title="training loss (weighted sum over draft steps)", xlabel="step")
    if train and "top1_j" in train[0]:
        for j in range(len(train[0]["top1_j"])):
            axes[1].plot(steps, [r["top1_j"][j] for r in train], label=f"draft step {j + 1}")
        axes[1].legend()
    axes[1].set(title="top-1 agreement with the target", xlabel="step", ylim=(0, 1))
    if evals:
        axes[2].plot([r["step"] for r in evals], [r["eval"]["mean_accepted_length"] for r in evals], "o-")
    axes[2].set(title="held-out mean accepted length (K=5, greedy)", xlabel="step")
    return save(fig, os.path.join(out_dir, PLOT))


def plot_curve(folder: str, curve: list[dict], tokens_per_step: int, baselines: dict | None = None) -> str | None:
    """curve.png beside a joint run's fallback: each head's held-out mean accepted length (K=5, greedy)
    against the step (and the tokens it had trained on) from its curve.jsonl records, and each baseline
    ({drafter name: its mean accepted length on the same prompts}) as a dashed line (a shipped head's
    dotted, in its head's colour); -> its path."""
    plt = pyplot(f"curve.png of {folder}")
    if plt is None or not curve:
        return None
    points = sorted(curve, key=lambda r: r["step"])
    fig, ax = plt.subplots(figsize=(6.5, 4))
    colors = {}
    for kind in [k for k, v in points[-1].items() if isinstance(v, dict) and "mean_accepted_length" in v]:
        got = [(r["step"], r[kind]["mean_accepted_length"]) for r in points if kind in r]
        colors[kind] = ax.plot(*zip(*got), "o-", label=kind)[0].get_color()
    baseline_lines(ax, baselines or {}, colors)
    ax.set(title="held-out mean accepted length (K=5, greedy)", xlabel=f"step ({tokens_per_step:,} tokens each)",
           xlim=(0, None))
    counted = [r for r in points if r.get("trained_on", {}).get("steps")]
    if counted:             # answer tokens trained on grow about linearly with the step
        per_step = counted[-1]["trained_on"]["answer_tokens"] / counted[-1]["trained_on"]["steps"]
        top = ax.secondary_xaxis("top", functions=(lambda s: s * per_step / 1e6, lambda m: m * 1e6 / per_step))
        top.set_xlabel("answer tokens trained on (millions, about)")
    ax.legend()
    return save(fig, os.path.join(folder, "curve.png"))


def baseline_lines(ax, baselines: dict, colors: dict) -> None:
    """Each baseline {drafter name: mean accepted length} as a horizontal line: a shipped head's dotted in its
    head's colour (colors: {kind: colour}), NGram's and Suffix's dashed."""
    for name, value in baselines.items():
        head = name.removeprefix("shipped ")
        style = ({"linestyle": ":", "color": colors.get(head, "tab:gray")} if name != head else
                 {"linestyle": "--", "color": "gray" if name == "ngram" else "black"})
        ax.axhline(value, linewidth=1, label=name, **style)
