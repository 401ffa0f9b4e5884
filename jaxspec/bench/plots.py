"""The bench's pictures: speedup by batch size, acceptance by draft position, trees against chains."""
from __future__ import annotations

import os

from ..plotting import pyplot


def plot(r: dict, out_dir: str) -> list:
    """speedup.png: speedup over plain per decoder (one panel per temperature: bars for one batch
    size, lines over batch sizes for several); acceptance.png: acceptance by draft position per fixed
    speculative decoder (batch 1 or the smallest); trees.png when trees ran. -> the files written."""
    plt = pyplot(f"the plots of {out_dir}")
    if plt is None:
        return []
    files = [_speedups(plt, r, os.path.join(out_dir, "speedup.png"))]
    first = min(r["runs"], key=lambda run: (run["batch"], run["temperature"]))
    files.append(_acceptance(plt, first, os.path.join(out_dir, "acceptance.png")))
    if r.get("trees"):
        files.append(plot_trees(first, os.path.join(out_dir, "trees.png")))
    return files


def _speedups(plt, r: dict, path: str) -> str:
    temps = sorted({run["temperature"] for run in r["runs"]})
    fig, axes = plt.subplots(1, len(temps), figsize=(6 * len(temps), 4), squeeze=False)
    for ax, temp in zip(axes[0], temps):
        runs = sorted((run for run in r["runs"] if run["temperature"] == temp), key=lambda run: run["batch"])
        names = [name for name in runs[0]["decoders"] if name != "plain"]
        if len(runs) == 1:                                  # one batch size: a bar per decoder
            ax.barh(names, [runs[0]["decoders"][name]["speedup"] for name in names])
            ax.axvline(1.0, color="gray", linestyle="--", linewidth=1)
            ax.invert_yaxis()
            ax.set(xlabel="speedup over plain decoding", title=f"batch {runs[0]['batch']}, temperature {temp}")
            ax.tick_params(axis="y", labelsize=7)
            continue
        batches = [run["batch"] for run in runs]
        for name in names:
            ax.plot(batches, [run["decoders"][name]["speedup"] for run in runs], marker="o", label=name)
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set(xlabel="batch size", ylabel="speedup over plain decoding", title=f"temperature {temp}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _acceptance(plt, run: dict, path: str) -> str:
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, d in run["decoders"].items():
        if d.get("per_position_acceptance") and not d.get("adaptive"):
            acc = d["per_position_acceptance"]
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="draft position", ylabel="fraction of steps whose draft was kept", ylim=(0, 1),
           title=f"acceptance by position (batch {run['batch']}, temperature {run['temperature']})")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_trees(run: dict, path: str) -> str:
    """Mean accepted length per target pass against tree budget N, one line per drafter, its K chain
    drawn at N = K (the fixed decoders of one run)."""
    import matplotlib.pyplot as plt                       # plot() made sure it is there

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = set()                                            # the budgets and Ks drawn
    for drafter in sorted({name.split(" ")[0] for name, d in run["decoders"].items() if d.get("tree")}):
        fixed = {name: d for name, d in run["decoders"].items() if name.split(" ")[0] == drafter and not d["adaptive"]}
        trees = sorted((d["tree"]["budget"], d["mean_accepted_length"]) for d in fixed.values() if d.get("tree"))
        chains = sorted((d["K"], d["mean_accepted_length"]) for d in fixed.values() if not d.get("tree"))
        xs |= {n for n, _ in trees + chains}
        line, = ax.plot(*zip(*trees), marker="o", label=f"{drafter} tree")
        if chains:
            ax.plot(*zip(*chains), marker="s", linestyle=":", color=line.get_color(), label=f"{drafter} chain (N = K)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(xs), [str(n) for n in sorted(xs)])
    ax.set(xlabel="draft tokens verified per pass (tree budget N, or K)", ylabel="mean accepted length per pass",
           title=f"trees against chains (batch {run['batch']}, temperature {run['temperature']})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
