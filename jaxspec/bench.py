"""Benchmark harness: speeds measured as ratios within one process and run.

For each batch size and sampling setting: plain decoding and speculative decoding with the chosen
drafters (each fixed K, and adaptive K) on the same prompts, interleaved batch by batch so machine
noise hits all alike. For each speculative decoder the speedup the Leviathan et al. (2023) model
predicts from the measured acceptance and measured step costs: tokens per step / cost of a step
(K draft steps + verifying K+1 tokens, timed alone, in units of one plain step). Optionally Hugging
Face transformers (torch, same weights): plain greedy and prompt-lookup decoding, batch 1. And the
memory-bandwidth bound (one decode step reads every weight once: bound = read bandwidth / weight
bytes), against plain decoding's tokens/s after the prompt pass. Writes bench.json, bench.md and PNG plots.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from . import paths
from .plotting import pyplot

EVAL_PROMPTS = "eval.jsonl"    # the default prompt file, in paths.prompts_dir()


def read_prompts(path: str | None, limit: int, source: str | None = None) -> list[str]:
    """`limit` prompts spread evenly over a JSONL file with a "prompt" field (default: eval.jsonl in
    paths.prompts_dir()); source: only the rows whose "source" field is this (e.g. gsm8k-test,
    humaneval, vicuna-80). ValueError for a missing file."""
    path = path or paths.prompt_file(EVAL_PROMPTS)
    rows = paths.read_jsonl(path)
    if source:
        found = sorted({r.get("source", "") for r in rows})
        rows = [r for r in rows if r.get("source") == source]
        if not rows:
            raise ValueError(f"--source {source!r}: no prompt of that source in {path} (it has {', '.join(found)})")
    rows = [r["prompt"] for r in rows]
    if limit >= len(rows):
        return rows
    return [rows[i] for i in np.linspace(0, len(rows) - 1, limit).round().astype(int)]  # spread over the file


def read_bandwidth(nbytes: int = 512 * 2**20, repeats: int = 10) -> float:
    """Measured memory read bandwidth in bytes/s: a jitted sum over a large float32 array."""
    x = jnp.ones((nbytes // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        total(x).block_until_ready()
    return nbytes * repeats / (time.perf_counter() - start)


def weight_bytes(params) -> int:
    return int(sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(params)))


def drafter_memory(model, drafter, K: int, prompt_len: int, max_new_tokens: int) -> dict:
    """What a drafter adds at run time, batch 1: its parameters (arrays passed to the compiled loop that
    the target does not own, e.g. a head or a draft model's weights, and the target rows an MTP head
    reads) and its state (caches, buffers) at the capacity generate() allocates for this prompt length."""
    from .decode.batch import bucket

    target = {id(x) for x in jax.tree_util.tree_leaves(model.params)}
    own = [x for x in jax.tree_util.tree_leaves(drafter.params_for(model)) if id(x) not in target]
    T, E = bucket(prompt_len), model.config.hidden_size
    capacity = T + bucket(max_new_tokens) + K + 1
    feats = jax.ShapeDtypeStruct((len(drafter.hidden_layers), 1, T, E), model.params["embed"].dtype)
    init = lambda params, prompts, lengths, feats: drafter.init(params, prompts, lengths, capacity, feats)
    state = jax.eval_shape(init, drafter.params_for(model), jax.ShapeDtypeStruct((1, T), jnp.int32),
                           jax.ShapeDtypeStruct((1,), jnp.int32), feats)
    return {"parameters": int(sum(x.size for x in own if jnp.issubdtype(x.dtype, jnp.floating))),
            "weight_bytes": int(sum(x.nbytes for x in own)),
            "state_bytes": int(sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state))),
            "capacity": capacity}


def make_drafter(spec: str, model):
    """'ngram' | 'ngram:MAX:MIN' | 'draft:PATH' (a model folder or .gguf) | 'truncated:N' (first N layers)
    | 'eagle:PATH' | 'eagle' | 'mtp:PATH' | 'mtp' | 'draft' ('eagle', 'mtp', 'draft': the heads and the
    distilled draft model shipped for the model, drafters.shipped) | 'suffix' (over the shipped data's
    answers) | 'suffix:DATA' (a `jaxspec train data` folder's) | 'suffix:none' (the request's text only)
    | PATH (a saved head's folder, its kind read from head.json, or a draft model's folder)."""
    from .drafters import MTP, DraftModel, Eagle, NGram, Suffix, shipped, truncated

    name, _, arg = spec.partition(":")
    if name == "ngram":
        return NGram(*(int(x) for x in arg.split(":"))) if arg else NGram()
    if name == "suffix":
        return Suffix() if arg == "none" else Suffix.from_data(arg) if arg else shipped(model, "suffix")
    if name == "truncated" and arg:
        return DraftModel(truncated(model, int(arg)))
    loaders = {"eagle": Eagle.load, "mtp": MTP.load, "draft": DraftModel.load}
    if name in loaders:
        return loaders[name](arg) if arg else shipped(model, name)
    if os.path.isdir(spec):                       # a saved head's or draft model's folder
        from .heads.io import META
        kind = json.load(open(os.path.join(spec, META))).get("kind") if os.path.isfile(os.path.join(spec, META)) \
            else "draft"
        return loaders[kind](spec)
    if os.sep in spec or spec.startswith(".") or os.path.splitext(spec)[1]:
        raise ValueError(f"drafter folder not found: {spec}")
    raise ValueError(f"unknown drafter {spec!r}: use ngram, ngram:MAX:MIN, draft, draft:PATH, "
                     f"truncated:N, eagle, eagle:PATH, mtp, mtp:PATH, suffix, suffix:DATA or a head's folder")


def _aggregate(runs: list) -> dict:
    """Sum token counts and times over batches; acceptance statistics weighted by steps."""
    tokens = sum(st.new_tokens for st in runs)
    seconds = sum(st.wall_seconds for st in runs)
    steps = sum(st.target_steps for st in runs)
    decode_seconds = sum(st.decode_seconds for st in runs)
    agg = {"tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds, "target_steps": steps,
           "prefill_seconds": sum(st.prefill_seconds for st in runs), "decode_seconds": decode_seconds,
           "decode_tokens_per_second": sum(st.decode_tokens for st in runs) / decode_seconds}
    if runs and runs[0].acceptance_rate is not None:
        w = np.array([st.target_steps for st in runs], float)
        agg["mean_accepted_length"] = float(np.dot(w, [st.mean_accepted_length for st in runs]) / w.sum())
        agg["acceptance_rate"] = float(np.dot(w, [st.acceptance_rate for st in runs]) / w.sum())
        agg["per_position_acceptance"] = (w @ np.array([st.per_position_acceptance for st in runs])
                                          / w.sum()).tolist()
    if runs and runs[0].step_costs:                  # adaptive: the costs its policy measured (plain steps)
        agg["step_costs"] = {str(k): c for k, c in runs[0].step_costs.items()}
    if runs and runs[0].steps_per_k:
        agg["steps_per_k"] = {str(k): sum(st.steps_per_k.get(k, 0) for st in runs) for k in runs[0].steps_per_k}
    return agg


def batches(prompts_ids: list, batch: int) -> list:
    """Consecutive groups of `batch` prompts; prompts repeat (cycled) to fill the last or only group."""
    n = max(1, -(-len(prompts_ids) // batch))
    return [[prompts_ids[(g * batch + i) % len(prompts_ids)] for i in range(batch)] for g in range(n)]


def step_cost(model, drafter, arm, group: list, max_new_tokens: int, sampling) -> float:
    """Cost of one step with K drafts (drafting + verifying K+1 tokens) or with a Tree (drafting it,
    verifying its N + 1 inputs), in plain decode steps, timed alone on the shapes generate() uses for
    this batch (jaxspec.costs.measure_costs)."""
    from .costs import step_costs
    from .decode.batch import LIVE_ATTENTION_MIN_BATCH, padded_batch, tree_slots
    from .sampling import row_params
    from .tree import Tree

    extra = tree_slots(arm) if isinstance(arm, Tree) else arm + 1
    tokens, lengths, cache, _ = padded_batch(model, group, max_new_tokens, extra)
    measured = step_costs(model, drafter, (arm,), tokens, lengths, cache, row_params(sampling, len(group)),
                          len(group) >= LIVE_ATTENTION_MIN_BATCH)
    return float(measured["costs"][0])


def verify_costs(model, sizes, group: list, max_new_tokens: int) -> dict:
    """{N: cost of one target pass over N + 1 tokens (a tree of N nodes below last) in plain steps},
    timed against a one-token pass on the shapes generate() uses for this batch (measure_costs)."""
    from .cache import rollback
    from .costs import measure_costs
    from .decode.batch import padded_batch
    from .models import forward

    tokens, lengths, cache, _ = padded_batch(model, group, max_new_tokens, max(sizes) + 1)
    make_args = lambda: (model.params, jax.tree_util.tree_map(jnp.copy, rollback(cache, lengths)))

    def passes(num):
        def one(params, cache):
            logits, _, cache = forward(params, jnp.zeros((len(group), num), jnp.int32), rollback(cache, lengths),
                                       model.config)
            return (cache,), logits
        return one

    device = jax.devices()[0]
    key = ("verify", device.platform, device.device_kind, model.source, model.config, len(group), cache.capacity)
    return {n: float(measure_costs(key + (n,), passes(1), lambda k: passes(k + 1), make_args, (n,),
                                   thread=(1,))["costs"][0]) for n in sizes}


MAX_DIFFERENCES = 8      # differing greedy rows whose first difference the bench keeps


def first_difference(plain: list, other: list, prompt: int) -> dict:
    """Where a greedy row first departs from plain decoding's: prompt index, position among the new
    tokens, and each side's token there (None: that row ended before)."""
    pos = next((i for i, (a, b) in enumerate(zip(plain, other)) if a != b), min(len(plain), len(other)))
    at = lambda row: int(row[pos]) if pos < len(row) else None
    return {"prompt": int(prompt), "position": pos, "plain": at(plain), "this": at(other)}


def _speedups(agg: dict, plain: dict) -> dict:
    """Tokens/s of an aggregate over plain's, with and without the prompt pass."""
    return {"speedup": agg["tokens_per_second"] / plain["tokens_per_second"],
            "decode_speedup": agg["decode_tokens_per_second"] / plain["decode_tokens_per_second"]}


def _configs(drafters: dict, ks, adaptive: bool, trees) -> list:
    """(label, drafter, K, adaptive, tree) of every decoder a bench runs, plain first."""
    configs = [("plain", None, 0, False, None)] + [(f"{name} K={k}", d, k, False, None)
                                                   for name, d in drafters.items() for k in ks]
    tree_drafters = {name: d for name, d in drafters.items() if d.drafts_trees}
    configs += [(f"{name} tree N={t.budget}", d, max(ks), False, t) for name, d in tree_drafters.items()
                for t in trees]
    if adaptive:
        configs += [(f"{name} adaptive K<={max(ks)}", d, max(ks), True, None) for name, d in drafters.items()]
        if trees:
            big = max(trees, key=lambda t: t.budget)
            configs += [(f"{name} adaptive K<={max(ks)} +tree N={big.budget}", d, max(ks), True, big)
                        for name, d in tree_drafters.items()]
    return configs


def bench_decoders(model, prompts_ids, max_new_tokens: int, drafters: dict, *, ks, batch: int = 1,
                   sampling=None, adaptive: bool = True, seed: int = 0, progress: bool = True,
                   repeats: int = 1, trees=(), mesh=None) -> dict:
    """Plain decoding, each drafter at each fixed K, each fixed tree (trees: jaxspec.Tree shapes; the
    drafters that draft trees) and (adaptive=True) with adaptive K up to max(ks), and with the largest
    tree offered too, on groups of `batch` prompts (taken in order of length bucket), each group run by
    every decoder in turn. Compiling (and measuring the adaptive policy's costs) runs first on the
    first group and is reported apart.

    repeats > 1 runs everything that many times, the decoders' order rotated by one each time, and
    adds each repeat's speedups ("speedups", "decode_speedups"): the spread is this run's noise.
    Greedy runs also count the rows each decoder made exactly as plain decoding did ("rows_as_plain"
    of "rows"): speculation must not change a token."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    from .decode.batch import bucket
    from .generation import generate
    from .sampling import Sampling

    sampling = sampling or Sampling()
    configs = _configs(drafters, ks, adaptive, trees)
    # one length bucket after another: each decoder compiles a bucket's programs once (generate keeps
    # MAX_PROGRAMS of them; nine decoders on prompts of alternating buckets recompiled in every run)
    index_groups = batches(sorted(range(len(prompts_ids)), key=lambda i: bucket(len(prompts_ids[i]))), batch)
    groups = [[prompts_ids[i] for i in g] for g in index_groups]
    run = lambda group, d, k, ad, t: generate(model, group, max_new_tokens=max_new_tokens, sampling=sampling,
                                              drafter=d, num_draft_tokens=max(k, 1), adaptive=ad, seed=seed, tree=t,
                                              mesh=mesh)
    desc = f"bench: batch {batch}, temperature {sampling.temperature:g}"
    # one generation = one decoder on one group of `batch` prompts; the first of each decoder compiles
    bar = tqdm(total=len(configs) * (repeats * len(groups) + 1), desc=desc, unit="generation", disable=not progress)
    compile_s = {}
    for label, d, k, ad, t in configs:
        bar.set_postfix_str(f"{label} (compiling)")
        compile_s[label] = run(groups[0], d, k, ad, t).stats.compile_seconds
        bar.update(1)
    runs = {label: [[] for _ in range(repeats)] for label, *_ in configs}     # [repeat][group] stats
    made = {label: [] for label, *_ in configs}           # each run's rows, in (repeat, group) order
    made_from = []                                        # the prompt index of each of those rows
    for rep in range(repeats):
        order = configs[rep % len(configs):] + configs[:rep % len(configs)]
        for group, indices in zip(groups, index_groups):
            made_from += indices
            for label, d, k, ad, t in order:
                bar.set_postfix_str(label)
                out = run(group, d, k, ad, t)
                runs[label][rep].append(out.stats)
                made[label] += out.tokens
                bar.update(1)
    bar.close()
    result = {}
    for label, d, k, ad, t in configs:
        r = {**_compared(runs[label], runs["plain"]), "compile_seconds": compile_s[label], "K": k, "adaptive": ad,
             "tree": dataclasses.asdict(t) if t is not None else None}
        if sampling.temperature == 0:        # greedy: the same tokens as plain, row by row
            r.update(_rows_as_plain(made[label], made["plain"], made_from))
        if d is not None and not ad:          # Leviathan: tokens per step / cost of a step (plain steps)
            r["step_cost"] = step_cost(model, d, t if t is not None else k, groups[0], max_new_tokens, sampling)
            r["predicted_speedup"] = r["mean_accepted_length"] / r["step_cost"]
            r["measured_over_predicted"] = r["decode_speedup"] / r["predicted_speedup"]   # both after prefill
        result[label] = r
    return result


def _compared(runs: list, plain_runs: list) -> dict:
    """A decoder's aggregate over its runs [repeat][group] with its speedups over plain decoding's
    (and each repeat's, when there are several)."""
    r = _aggregate(sum(runs, []))
    r.update(_speedups(r, _aggregate(sum(plain_runs, []))))
    if len(runs) > 1:
        reps = [_speedups(_aggregate(rep), _aggregate(p)) for rep, p in zip(runs, plain_runs)]
        r["speedups"] = [x["speedup"] for x in reps]
        r["decode_speedups"] = [x["decode_speedup"] for x in reps]
    return r


def _rows_as_plain(made: list, plain: list, made_from: list) -> dict:
    """How many rows equal plain decoding's, and where the first few that do not differ."""
    same = [a == b for a, b in zip(made, plain)]
    return {"rows_as_plain": sum(same), "rows": len(same),
            "differences": [first_difference(plain[i], made[i], made_from[i])
                            for i in np.flatnonzero(~np.array(same, bool))[:MAX_DIFFERENCES]]}


def bench_transformers(source_path: str, prompts_ids, max_new_tokens: int, eos_ids, lookup_k: int = 0) -> dict:
    """Hugging Face transformers greedy generate (torch fp32, same GGUF weights), batch 1: plain, and
    prompt-lookup decoding with `lookup_k` draft tokens when lookup_k > 0."""
    import torch
    from transformers import AutoModelForCausalLM

    folder, name = os.path.dirname(source_path), os.path.basename(source_path)
    kwargs = {"gguf_file": name} if name.endswith(".gguf") else {}
    hf = AutoModelForCausalLM.from_pretrained(folder if kwargs else source_path, dtype=torch.float32,
                                              **kwargs).eval()
    gen = dict(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=list(eos_ids),
               pad_token_id=eos_ids[0])
    result = {"torch_threads": torch.get_num_threads()}
    modes = [("plain", {})] + ([("prompt_lookup", {"prompt_lookup_num_tokens": lookup_k})] if lookup_k else [])
    with torch.no_grad():
        for mode, extra in modes:
            hf.generate(torch.tensor([prompts_ids[0]]), **{**gen, **extra, "max_new_tokens": 4})  # warm-up
            tokens, outputs, start = 0, [], time.perf_counter()
            for ids in prompts_ids:
                out = hf.generate(torch.tensor([ids]), **gen, **extra)
                tokens += out.shape[1] - len(ids)
                outputs.append(out[0, len(ids):].tolist())
            seconds = time.perf_counter() - start
            result[mode] = {"tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds,
                            "outputs": outputs}
    return result


def run(model_name, *, prompt_file: str | None = None, num_prompts: int = 4, max_new_tokens: int = 128,
        peer: str | None = None, out_dir: str | None = None, drafters=("ngram",), ks=(5,), batch_sizes=(1,),
        temperatures=(0.0,), adaptive: bool = True, repeats: int = 1, source: str | None = None,
        trees=(), mesh=None, command: str | None = None) -> dict:
    from .loading import load
    from .sharding import describe
    from .loading.registry import NAMED_MODELS, resolve_named
    from .sampling import Sampling

    model = load(model_name) if isinstance(model_name, str) else model_name     # a name, path or Model
    model_name = model_name if isinstance(model_name, str) else model.source
    texts = read_prompts(prompt_file, num_prompts, source)
    ids = [model.tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
           for t in texts]
    made = {spec: make_drafter(spec, model) for spec in drafters}
    result = {"model": model_name, "backend": jax.default_backend(), "prompts": len(ids),
              "prompt_file": prompt_file or paths.prompt_file(EVAL_PROMPTS), "source": source, "max_new_tokens": max_new_tokens,
              "ks": list(ks), "adaptive": adaptive, "repeats": repeats, "runs": [],
              "trees": [dataclasses.asdict(t) for t in trees], "placement": describe(mesh),
              **provenance(command)}
    if trees:             # what verifying N tokens costs here: where trees can pay
        result["verify_costs"] = {str(n): c for n, c in verify_costs(
            model, sorted({max(ks)} | {t.budget for t in trees}), ids[:1], max_new_tokens).items()}
    for temperature in temperatures:
        for batch in batch_sizes:
            decoders = bench_decoders(model, ids, max_new_tokens, made, ks=ks, batch=batch,
                                      sampling=Sampling(temperature=temperature),
                                      adaptive=adaptive, repeats=repeats, trees=trees, mesh=mesh)
            result["runs"].append({"batch": batch, "temperature": temperature, "decoders": decoders})
            _print_run(batch, temperature, decoders)
            _save(result, out_dir)                    # so far: an interrupted sweep keeps what it measured
    result["memory"] = {spec: drafter_memory(model, d, max(ks), len(ids[0]), max_new_tokens)
                        for spec, d in made.items()}
    result["target_parameters"] = int(sum(x.size for x in jax.tree_util.tree_leaves(model.params)))
    bw = read_bandwidth()
    wb = weight_bytes(model.params)
    first = result["runs"][0]["decoders"]
    plain = first["plain"]["tokens_per_second"] if result["runs"][0]["batch"] == 1 else None
    decode = first["plain"]["decode_tokens_per_second"] if plain else None     # the bound counts decode steps
    result["bandwidth"] = {"read_bytes_per_second": bw, "weight_bytes_per_token": wb,
                           "bound_tokens_per_second": bw / wb,
                           "plain_decode_tokens_per_second": decode,
                           "fraction_of_bound": decode / (bw / wb) if decode else None}
    if peer == "transformers":
        path = resolve_named(model_name) if model_name in NAMED_MODELS else model_name
        hf = bench_transformers(path, ids, max_new_tokens, model.tokenizer.eos_token_ids, max(ks))
        result["transformers"] = {mode: {k: v for k, v in d.items() if k != "outputs"} if isinstance(d, dict) else d
                                  for mode, d in hf.items()}
        ours = [generate_greedy(model, i, max_new_tokens) for i in ids]
        result["transformers"]["same_tokens_as_jaxspec"] = hf["plain"]["outputs"] == ours
        if plain:
            best = max(d["tokens_per_second"] for d in first.values())
            result["jaxspec_plain_over_transformers_plain"] = plain / hf["plain"]["tokens_per_second"]
            result["jaxspec_best_over_transformers_lookup"] = best / hf["prompt_lookup"]["tokens_per_second"]
    if out_dir:
        _save(result, out_dir)
        plot(result, out_dir)
    return result


def _print_run(batch: int, temperature: float, decoders: dict) -> None:
    """One line of speedups, and the greedy rows that differ from plain decoding (there should be none)."""
    print(f"batch {batch}, temperature {temperature}: " + ", ".join(
        f"{name} {d['speedup']:.2f}x" for name, d in decoders.items()), flush=True)
    for name, d in decoders.items():
        if d.get("rows_as_plain", 0) < d.get("rows", 0):
            print(f"  {name}: {d['rows'] - d['rows_as_plain']} of {d['rows']} greedy rows differ from "
                  "plain decoding; first differences (prompt, new-token position, plain token, this "
                  "token): " + ", ".join(f"({x['prompt']}, {x['position']}, {x['plain']}, {x['this']})"
                                         for x in d["differences"]), flush=True)


def provenance(command: str | None) -> dict:
    """What a result file records of how it was made: {"date", "machine", "command"}."""
    return {"date": time.strftime("%Y-%m-%d"), "machine": _machine(), "command": command}


def _machine() -> str:
    import platform
    device = jax.devices()[0]
    cpu = f"{os.cpu_count()} CPU cores" + (f" ({platform.processor()})" if platform.processor() else "")
    return cpu if device.platform == "cpu" else f"{device.device_kind} x{jax.device_count()}, {cpu}"


def _save(result: dict, out_dir: str | None) -> None:
    """bench.json and bench.md in out_dir (if given)."""
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(out_dir, "bench.md"), "w") as f:
        f.write(markdown(result))


def generate_greedy(model, ids, max_new_tokens: int) -> list:
    from .generation import generate
    return generate(model, [ids], max_new_tokens=max_new_tokens).tokens[0]


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


def report(paths_: list, title: str = "Benchmarks") -> str:
    """BENCHMARKS.md from result files, newest first: bench.json (`jaxspec bench`), coverage.json (`jaxspec
    train vocab`), scaling.json (`jaxspec train scaling`) and replay.json (`jaxspec train replay`), each with its command, date and machine, then
    its tables (markdown)."""
    results = []
    for path in paths_:
        with open(path) as f:
            r = json.load(f)
        results.append((r.get("date") or time.strftime("%Y-%m-%d", time.gmtime(os.path.getmtime(path))), path, r))
    lines = [f"# {title}\n", "Generated by `jaxspec bench --report` from the result files below; every speed is "
             "a ratio measured within one run (`jaxspec bench`).\n"]
    for date, path, r in sorted(results, key=lambda x: x[0], reverse=True):
        machine = r.get("machine") or (r.get("placement") or {}).get("device_kind") or r.get("backend", "?")
        if "sizes" in r and "eval" in r:
            head, command, body = "draft-vocabulary coverage", r.get("command"), coverage_markdown(r)
        elif r.get("runs") and "fraction" in r["runs"][0]:
            head, command, body = "EAGLE data scaling", r.get("command"), scaling_markdown(r)
        elif "pools" in r and "store_shards" in r:
            head, command, body = "replay of text drafters on held-out answers", r.get("command"), replay_markdown(r)
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


def plot(r: dict, out_dir: str) -> list:
    """speedup.png: speedup over plain vs batch size per decoder (one panel per temperature);
    acceptance.png: acceptance vs draft position per speculative decoder (batch 1 or the smallest)."""
    plt = pyplot(f"the plots of {out_dir}")
    if plt is None:
        return []

    temps = sorted({run["temperature"] for run in r["runs"]})
    fig, axes = plt.subplots(1, len(temps), figsize=(6 * len(temps), 4), squeeze=False)
    for ax, temp in zip(axes[0], temps):
        runs = sorted((run for run in r["runs"] if run["temperature"] == temp), key=lambda run: run["batch"])
        for name in runs[0]["decoders"]:
            if name != "plain":
                ax.plot([run["batch"] for run in runs], [run["decoders"][name]["speedup"] for run in runs],
                        marker="o", label=name)
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="batch size", ylabel="speedup over plain decoding", title=f"temperature {temp}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths = [os.path.join(out_dir, "speedup.png")]
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)
    first = min(r["runs"], key=lambda run: (run["batch"], run["temperature"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, d in first["decoders"].items():
        if d.get("per_position_acceptance") and not d.get("adaptive"):
            acc = d["per_position_acceptance"]
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=name)
    ax.set(xlabel="draft position", ylabel="fraction of steps whose draft was kept", ylim=(0, 1),
           title=f"acceptance by position (batch {first['batch']}, temperature {first['temperature']})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "acceptance.png"))
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    if r.get("trees"):
        paths.append(plot_trees(first, os.path.join(out_dir, "trees.png")))
    return paths


def plot_trees(run: dict, path: str) -> str:
    """Mean accepted length per target pass against tree budget N, one line per drafter, its K chain
    drawn at N = K (the fixed decoders of one run)."""
    import matplotlib.pyplot as plt                       # plot() made sure it is there

    fig, ax = plt.subplots(figsize=(6, 4))
    for drafter in sorted({name.split(" ")[0] for name, d in run["decoders"].items() if d.get("tree")}):
        fixed = {name: d for name, d in run["decoders"].items() if name.split(" ")[0] == drafter and not d["adaptive"]}
        trees = sorted((d["tree"]["budget"], d["mean_accepted_length"]) for d in fixed.values() if d.get("tree"))
        chains = sorted((d["K"], d["mean_accepted_length"]) for d in fixed.values() if not d.get("tree"))
        line, = ax.plot(*zip(*trees), marker="o", label=f"{drafter} tree")
        if chains:
            ax.plot(*zip(*chains), marker="s", linestyle=":", color=line.get_color(), label=f"{drafter} chain (N = K)")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="draft tokens verified per pass (tree budget N, or K)", ylabel="mean accepted length per pass",
           title=f"trees against chains (batch {run['batch']}, temperature {run['temperature']})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
