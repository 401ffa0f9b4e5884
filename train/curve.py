"""A joint run's held-out curve as a result file (`jaxspec train curve`): each evaluation of its fallback
(FALLBACK/curve.jsonl: mean accepted length at K = 5, greedy, on the run's held-out prompts) with what the
heads had trained on and the hours of this machine it took, from a profiled step (`jaxspec train
profile-heads`): one step of a head costs the target's features plus its own step, so a head's hours are
what training it alone would take and the run's the three heads' together (one target pass)."""
from __future__ import annotations

import json
import os

from jaxspec.plotting import pyplot

from .fallback import INDEX
from .joint import BASELINES, CURVE
from .loop import read_jsonl
from .plots import baseline_lines, save

KINDS = ("eagle", "mtp", "draft")


def step_seconds(profile: dict) -> dict:
    """A `train profile-heads` result -> seconds of one step: {"features", kind: the head's own step, "joint"}."""
    parts = profile["parts"]
    seconds = {"features": parts["target features"]["seconds"]}
    seconds.update({kind: parts[f"{kind} step"]["seconds"] for kind in KINDS if f"{kind} step" in parts})
    seconds["joint"] = sum(seconds.values())
    return {k: round(v, 3) for k, v in seconds.items()}


def run_curve(fallback_dir: str, profile_path: str) -> dict:
    """-> {"run", "model", "step_profile", "seconds_per_step", "baselines", "points"}: per evaluated step,
    each head's mean accepted length and hours ({kind: h, "joint": h}) at the profiled step's seconds."""
    path = os.path.join(fallback_dir, CURVE)
    if not os.path.isfile(path):
        raise ValueError(f"{fallback_dir} has no {CURVE}: evaluate the run first (train heads --evaluate-fallback)")
    with open(profile_path) as f:
        profile = json.load(f)
    seconds = step_seconds(profile)
    with open(os.path.join(fallback_dir, INDEX)) as f:
        model = json.load(f)["target"]
    base_path = os.path.join(fallback_dir, BASELINES)
    base = {}
    if os.path.isfile(base_path):
        with open(base_path) as f:
            base = {name: r["mean_accepted_length"] for name, r in json.load(f)["drafters"].items()}
    points = []
    for r in sorted(read_jsonl(path), key=lambda r: r["step"]):
        heads = {kind: r[kind]["mean_accepted_length"] for kind in KINDS if kind in r}
        hours = {kind: round(r["step"] * (seconds["features"] + seconds[kind]) / 3600, 3) for kind in heads}
        hours["joint"] = round(r["step"] * seconds["joint"] / 3600, 3)
        points.append({"step": r["step"], "trained_on": r.get("trained_on"), "hours": hours, **heads})
    return {"run": os.path.basename(os.path.normpath(fallback_dir)), "model": model, "step_profile": profile_path,
            "profiled_on": profile.get("provenance", {}).get("machine", "?"), "seconds_per_step": seconds,
            "baselines": base, "points": points}


def plot_hours(result: dict, path: str) -> str | None:
    """OUT.png: each head's held-out mean accepted length against its hours, the baselines as lines."""
    plt = pyplot(path)
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    colors = {}
    for kind in KINDS:
        got = [(p["hours"][kind], p[kind]) for p in result["points"] if kind in p]
        if got:
            colors[kind] = ax.plot(*zip(*got), "o-", label=kind)[0].get_color()
    baseline_lines(ax, result["baselines"], colors)
    ax.set(title=f"{result['run']}: held-out mean accepted length (K=5, greedy)",
           xlabel=f"hours training the head alone ({result['profiled_on']}, profiled step)", xlim=(0, None))
    ax.legend(fontsize=8)
    return save(fig, path)


def write_curve(result: dict, out: str) -> list[str]:
    """OUT.json (the result) and OUT.png beside it -> the paths written."""
    stem = os.path.splitext(out)[0]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    picture = plot_hours(result, stem + ".png")
    return [stem + ".json"] + ([picture] if picture else [])
