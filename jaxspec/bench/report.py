"""Result files to markdown: one bench run's tables, and BENCHMARKS.md from many result files
(bench, vocabulary coverage, data scaling, replay, training comparisons)."""
from __future__ import annotations

import json
import os
import time

import numpy as np

from .glance import glance, newest_first


def _acc(d: dict) -> str:
    if "acceptance_rate" not in d:
        return "1.00 | - | -"
    return (f"{d['mean_accepted_length']:.2f} | {d['acceptance_rate']:.2f} | "
            + " ".join(f"{a:.2f}" for a in d["per_position_acceptance"]))


def _times(d: dict, key: str) -> str:
    """A speedup, with the range over repeats when there were several: '0.98x (0.95-1.02)'."""
    reps = d.get(key + "s")
    spread = f" ({min(reps):.2f}-{max(reps):.2f})" if reps else ""
    return f"{d[key]:.2f}x{spread}"


def _rows(d: dict) -> str:
    """'20/20': greedy rows identical to plain decoding's; '-' when sampled (other random draws)."""
    return f"{d['rows_as_plain']}/{d['rows']}" if "rows" in d else "-"


def markdown(r: dict) -> str:
    source = f" of source {r['source']}" if r.get("source") else ""
    place = r.get("placement") or {}
    where = r["backend"] + (f" ({place['device_kind']}" + (f", mesh {place['mesh']}" if place.get("mesh") else "") + ")"
                            if place else "")
    lines = [f"Model {r['model']} on {where}, {r['prompts']} prompts{source}, up to {r['max_new_tokens']} new "
             "tokens. Speedup: tokens/s over plain decoding at the same batch size and sampling, same run, "
             "prompt pass included; decode: the same after each row's first token (the prompt pass apart); "
             f"{r.get('repeats', 1)} repeat(s), in brackets the range over repeats. "
             "Predicted: Leviathan et al. from the measured mean accepted length and step cost (drafting K + "
             "verifying K+1 tokens, timed alone, in plain steps), to compare with the decode speedup. Rows as "
             "plain: greedy rows whose tokens equal plain decoding's.\n"]
    for run in r["runs"]:
        lines += [f"\nBatch {run['batch']}, temperature {run['temperature']}:\n",
                  "| decoder | tokens/s | speedup | decode tokens/s | decode speedup | predicted | step cost "
                  "| mean accepted length | acceptance rate | per-position acceptance | K used (steps) | compile s "
                  "| rows as plain |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|"]
        for name, d in run["decoders"].items():
            pred = (f"{d['predicted_speedup']:.2f}x | {d['step_cost']:.2f}" if "predicted_speedup" in d
                    else "- | -")
            used = " ".join(f"{k}:{n}" for k, n in d.get("steps_per_k", {}).items() if n) or "-"
            lines.append(f"| {name} | {d['tokens_per_second']:.2f} | {_times(d, 'speedup')} | "
                         f"{d['decode_tokens_per_second']:.2f} | {_times(d, 'decode_speedup')} | {pred} | {_acc(d)} | "
                         f"{used} | {d['compile_seconds']:.1f} | {_rows(d)} |")
    if r.get("verify_costs"):
        lines += ["\nCost of one target pass over N + 1 tokens (a chain of K = N, or a tree of N nodes), batch 1, "
                  "in plain decode steps:\n", "| N | " + " | ".join(r["verify_costs"]) + " |",
                  "|---|" + "---:|" * len(r["verify_costs"]),
                  "| cost | " + " | ".join(f"{c:.2f}" for c in r["verify_costs"].values()) + " |"]
    if "transformers" in r:
        t = r["transformers"]
        lines += ["\nHugging Face transformers (torch, same weights), batch 1, greedy:\n",
                  "| decoder | tokens/s |", "|---|---:|"]
        lines += [f"| transformers {mode} | {t[mode]['tokens_per_second']:.2f} |" for mode in ("plain", "prompt_lookup")
                  if mode in t]
        if "jaxspec_plain_over_transformers_plain" in r:
            lines.append(f"\njaxspec plain / transformers plain: {r['jaxspec_plain_over_transformers_plain']:.2f}x; "
                         f"jaxspec best / transformers prompt lookup: {r['jaxspec_best_over_transformers_lookup']:.2f}x; "
                         f"same greedy tokens as jaxspec: {t['same_tokens_as_jaxspec']}.")
    if r.get("memory"):
        lines += [f"\nWhat each drafter adds at run time (batch 1, float32; the target has "
                  f"{r['target_parameters'] / 1e6:.1f}M parameters):\n",
                  "| drafter | extra parameters | extra weights MB | drafter state MB (cache of S slots) |",
                  "|---|---:|---:|---:|"]
        for name, m in r["memory"].items():
            lines.append(f"| {name} | {m['parameters'] / 1e6:.2f}M | {m['weight_bytes'] / 1e6:.1f} | "
                         f"{m['state_bytes'] / 1e6:.2f} (S={m['capacity']}) |")
    if "bandwidth" not in r:                          # written mid-sweep
        return "\n".join(lines) + "\n"
    b = r["bandwidth"]
    reach = (f"; plain decoding at batch 1 ({b['plain_decode_tokens_per_second']:.1f} tokens/s after the prompt) "
             f"reaches {100 * b['fraction_of_bound']:.0f}% of it"
             if b.get("fraction_of_bound") else "")
    lines.append(f"\nBandwidth bound: {b['read_bytes_per_second'] / 1e9:.1f} GB/s read / "
                 f"{b['weight_bytes_per_token'] / 1e6:.0f} MB of weights per token = "
                 f"{b['bound_tokens_per_second']:.1f} tokens/s{reach}.")
    return "\n".join(lines) + "\n"


def command_of(r: dict) -> str:
    """The `jaxspec bench` command line that made a result (as recorded, else rebuilt from its settings)."""
    if r.get("command"):
        return r["command"]
    first = r["runs"][0]["decoders"]
    drafters = sorted({name.split(" ")[0] for name in first if name != "plain"})
    parts = ["jaxspec bench", f"--model {r['model']}", f"--num-prompts {r['prompts']}",
             f"--max-new-tokens {r['max_new_tokens']}", f"--drafters {','.join(drafters)}",
             f"-k {','.join(map(str, r['ks']))}",
             f"--batch-sizes {','.join(str(b) for b in sorted({run['batch'] for run in r['runs']}))}",
             f"--temperatures {','.join(f'{t:g}' for t in sorted({run['temperature'] for run in r['runs']}))}"]
    parts += [f"--source {r['source']}"] if r.get("source") else []
    parts += [f"--trees {','.join(str(t['budget']) + ':' + str(t['depth']) + ':' + str(t['top_k']) for t in r['trees'])}"
              ] if r.get("trees") else []
    parts += ["--no-adaptive"] if not r.get("adaptive", True) else []
    parts += [f"--repeats {r['repeats']}"] if r.get("repeats", 1) > 1 else []
    return " ".join(parts)


def read_results(paths_: list) -> list:
    """(date, path, result) for each result file (its date, else the file's)."""
    results = []
    for path in paths_:
        with open(path) as f:
            r = json.load(f)
        results.append((r.get("date") or time.strftime("%Y-%m-%d", time.gmtime(os.path.getmtime(path))), path, r))
    return results


def report(paths_: list, title: str = "Benchmarks") -> str:
    """BENCHMARKS.md from result files, newest first (the table at a glance first): bench.json (`jaxspec bench`), coverage.json (`jaxspec
    train vocab`), scaling.json (`jaxspec train scaling`), replay.json (`jaxspec train replay`), comparisons (`jaxspec train
    compare`) and run curves (`jaxspec train curve`), each with its command, date and machine, then its tables (markdown)."""
    results = read_results(paths_)
    lines = [f"# {title}\n", "Generated by `jaxspec bench --report` from the result files below; every speed is "
             "a ratio measured within one run (`jaxspec bench`).\n", "## At a glance\n", glance(results)]
    for date, path, r in newest_first(results):
        machine = r.get("machine") or (r.get("placement") or {}).get("device_kind") or r.get("backend", "?")
        if "sizes" in r and "eval" in r:
            head, command, body = "draft-vocabulary coverage", r.get("command"), coverage_markdown(r)
        elif r.get("runs") and "fraction" in r["runs"][0]:
            head, command, body = "EAGLE data scaling", r.get("command"), scaling_markdown(r)
        elif "pools" in r and "store_shards" in r:
            head, command, body = "replay of text drafters on held-out answers", r.get("command"), replay_markdown(r)
        elif "heads" in r and "window" in r:
            head, command, body = "training runs compared on the same batches", r.get("command"), compare_markdown(r, path)
        elif "points" in r and "seconds_per_step" in r:
            head, command, body = f"training run {r['run']}, held-out curve", r.get("command"), curve_markdown(r, path)
        else:
            head = r["model"] + (f", {r['source']}" if r.get("source") else "")
            command, body = command_of(r), markdown(r)
        lines += [f"\n## {date}: {head}\n",
                  (f"`{command}` on {machine}.\n" if command else f"On {machine} (command not recorded).\n"), body]
    return "\n".join(lines)


def coverage_markdown(r: dict) -> str:
    """coverage.json -> a table: share of the target's answer tokens each draft-vocabulary size holds."""
    cols = list(r["eval"]) + [f"data kept out: {p}" for p in r.get("data", {})]
    shares = list(r["eval"].values()) + list(r.get("data", {}).values())
    rows = [f"| {size} | " + " | ".join(f"{100 * s[i]:.2f}%" for s in shares) + " |" for i, size in enumerate(r["sizes"])]
    per_source = r.get("eval_answer_tokens")
    if isinstance(per_source, dict):
        per_source = ", ".join(f"{source} {n:,}" for source, n in per_source.items())
    return "\n".join([f"Share of the target's greedy answer tokens (eval answer tokens: {per_source}) held by the Vd "
                      f"most frequent answer tokens of {r.get('data_answer_tokens', 0):,} answer tokens of data.\n",
                      "| Vd | " + " | ".join(cols) + " |", "|---:|" + "---:|" * len(cols)] + rows) + "\n"


def scaling_markdown(r: dict) -> str:
    """scaling.json -> a table: held-out acceptance of EAGLE heads trained on growing shares of the data."""
    rows = ["| fraction | shards | answer tokens | steps | held-out mean accepted length | per-position acceptance |",
            "|---:|---:|---:|---:|---:|---|"]
    for run in r["runs"]:
        mal = run.get("mean_accepted_length")
        acc = " ".join(f"{a:.2f}" for a in run.get("per_position_acceptance") or [])
        rows.append(f"| {run['fraction']:g} | {run['shards']} | {run['answer_tokens']} | {run['steps']} | "
                    f"{'-' if mal is None else f'{mal:.2f}'} | {acc or '-'} |")
    return (f"{r.get('epochs', 1):g} epoch(s) per subset, {r.get('tokens_per_batch')} tokens per batch; each "
            "subset takes every n-th shard, so it has the mix of the whole.\n\n" + "\n".join(rows) + "\n")


def replay_markdown(r: dict) -> str:
    """replay.json (`jaxspec train replay`) -> mean accepted length per prompt pool and drafter."""
    drafters = [k for k in next(iter(r["pools"].values())) if k not in ("answers", "answer_tokens")]
    rows = ["| pool | answers | answer tokens | " + " | ".join(drafters) + " |", "|---|---:|---:|" + "---:|" * len(drafters)]
    for pool, row in r["pools"].items():
        rows.append(f"| {pool} | {row['answers']} | {row['answer_tokens']:,} | "
                    + " | ".join(f"{row[d]:.2f}" for d in drafters) + " |")
    return (f"Mean accepted length at K = {r['k']} replayed over the greedy answers of shards {r['test_shards']} "
            f"(no target run: drafts kept up to the first that differs from the recorded answer); the suffix store "
            f"holds the answers of shards {r['store_shards']} ({r['store_tokens']:,} tokens, {r['store_mib']} MiB, "
            f"built in {r['store_build_seconds']} s).\n\n" + "\n".join(rows) + "\n")


def compare_markdown(r: dict, path: str, bins: int = 4) -> str:
    """A comparison (`jaxspec train compare`) -> per head and run, the first draft token's top-1 agreement
    averaged over `bins` equal stretches of the compared steps, the summary window's loss and seconds per step,
    and the picture beside the file (OUT.png) when there is one."""
    rows = []
    for kind, head in r["heads"].items():
        stretches = [chunk for chunk in np.array_split(np.arange(len(head["steps"])), bins) if len(chunk)]
        spans = [f"{head['steps'][c[0]]}-{head['steps'][c[-1]]}" for c in stretches]
        if not rows:
            rows += ["| head | run | " + " | ".join(f"top-1, steps {s}" for s in spans) + " | loss, last window | "
                     "s/step |", "|---|---|" + "---:|" * (len(spans) + 2)]
        for name, run in head["runs"].items():
            top1 = [float(np.mean(np.asarray(run["top1_first"])[c])) for c in stretches]
            rows.append(f"| {kind} | {name} | " + " | ".join(f"{t:.3f}" for t in top1)
                        + f" | {run['window_loss_first']:.3f} | {run['median_seconds_per_step']:.1f} |")
    note = r.get("note", "")
    return ("Top-1 agreement of each head's first draft token with the target, logged at the same steps of runs of "
            "one seed (the same batch at each step; in a first epoch each batch is new to the head). "
            + (note + " " if note else "") + "\n\n" + "\n".join(rows) + "\n"
            + _picture(path))


def _picture(path: str) -> str:
    """A markdown image of OUT.png beside the result file OUT.json, if there is one."""
    picture = os.path.splitext(path)[0] + ".png"
    link = os.path.join(os.path.basename(os.path.dirname(os.path.abspath(path))), os.path.basename(picture))
    return f"\n![{os.path.basename(picture)}]({link})\n" if os.path.isfile(picture) else ""


def curve_markdown(r: dict, path: str) -> str:
    """A run's curve (`jaxspec train curve`) -> per evaluated step: what the heads had trained on, each head's
    held-out mean accepted length and its hours at the profiled step time; the baselines; the picture."""
    kinds = [k for k in ("eagle", "mtp", "draft") if any(k in p for p in r["points"])]
    rows = ["| step | epochs | answer tokens | " + " | ".join(kinds) + " | hours: " + ", ".join(kinds)
            + " | hours: joint run |", "|---:|---:|---:|" + "---:|" * len(kinds) + "---|---:|"]
    for p in r["points"]:
        seen = p.get("trained_on") or {}
        cells = [str(p["step"]), f"{seen['epochs']:g}" if seen else "-", f"{seen['answer_tokens']:,}" if seen else "-"]
        cells += [f"{p[k]:.2f}" if k in p else "-" for k in kinds]
        cells += [", ".join(f"{p['hours'][k]:.1f}" for k in kinds if k in p["hours"]), f"{p['hours']['joint']:.1f}"]
        rows.append("| " + " | ".join(cells) + " |")
    sec = r["seconds_per_step"]
    base = ", ".join(f"{name} {value:.2f}" for name, value in r["baselines"].items())
    return (f"Held-out mean accepted length (K = 5, greedy, the run's held-out prompts) of the heads of run "
            f"{r['run']} ({r['model']}) at each evaluated step. Hours: steps x the step time profiled in "
            f"{r['step_profile']} on {r['profiled_on']} (target features {sec['features']:.1f} s shared, then "
            + ", ".join(f"{k} {sec[k]:.1f} s" for k in kinds) + f"; joint {sec['joint']:.1f} s): a head's "
            "hours are its own step plus the features, what training it alone would take. "
            f"On the same prompts (shipped: the heads shipped when these were measured): {base or 'none recorded'}."
            "\n\n" + "\n".join(rows) + "\n" + _picture(path))
