"""Benchmark harness: speeds measured as ratios within one process and run.

Batch 1, greedy: plain decoding and speculative decoding with the chosen drafters on the same
prompts, interleaved prompt by prompt; a split of one speculative step into draft / verify /
the rest; optionally Hugging Face transformers (torch, same weights); and the memory-bandwidth
bound (one decode step reads every weight once: bound = read bandwidth / weight bytes).
"""
from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_PROMPTS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "prompts",
                               "eval.jsonl")
BUILTIN_PROMPTS = ["Explain why the sky is blue.", "Write a Python function that reverses a list.",
                   "Natalia sold clips to 48 friends in April and half as many in May. How many in all?"]


def read_prompts(path: str | None, limit: int) -> list[str]:
    """`limit` prompts spread evenly over a JSONL file with a "prompt" field (default: eval.jsonl)."""
    path = path or DEFAULT_PROMPTS
    if not os.path.isfile(path):
        if path != DEFAULT_PROMPTS:
            raise ValueError(f"prompt file not found: {path}")
        return BUILTIN_PROMPTS[:limit]
    with open(path) as f:
        rows = [json.loads(line)["prompt"] for line in f if line.strip()]
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
    from .generate import bucket

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
    distilled draft model shipped for the model, see shipped_head)."""
    from .drafters import MTP, DraftModel, Eagle, NGram, truncated

    name, _, arg = spec.partition(":")
    if name == "ngram":
        return NGram(*(int(x) for x in arg.split(":"))) if arg else NGram()
    if name == "draft":
        return DraftModel.load(arg or shipped_head(model, "draft"))
    if name == "truncated" and arg:
        return DraftModel(truncated(model, int(arg)))
    if name == "eagle":
        return Eagle.load(arg or shipped_head(model, "eagle"))
    if name == "mtp":
        return MTP.load(arg or shipped_head(model, "mtp"))
    raise ValueError(f"unknown drafter {spec!r}: use ngram, ngram:MAX:MIN, draft, draft:PATH, "
                     f"truncated:N, eagle, eagle:PATH, mtp or mtp:PATH")


def shipped_head(model, kind: str) -> str:
    """checkpoints/<model name>/<kind> in this repository, for a named model."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "checkpoints",
                        os.path.basename(model.source), kind)
    if not os.path.isdir(path):
        raise ValueError(f"no shipped {kind} head for {model.source!r} (looked in {path}); give {kind}:PATH")
    return path


def _aggregate(runs: list) -> dict:
    """Sum token counts and times over prompts; acceptance statistics weighted by steps."""
    tokens = sum(st.new_tokens for st in runs)
    seconds = sum(st.wall_seconds for st in runs)
    steps = sum(st.target_steps for st in runs)
    agg = {"tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds,
           "target_steps": steps, "compile_seconds": sum(st.compile_seconds for st in runs)}
    if runs and runs[0].acceptance_rate is not None:
        w = np.array([st.target_steps for st in runs], float)
        agg["mean_accepted_length"] = float(np.dot(w, [st.mean_accepted_length for st in runs]) / w.sum())
        agg["acceptance_rate"] = float(np.dot(w, [st.acceptance_rate for st in runs]) / w.sum())
        agg["per_position_acceptance"] = (w @ np.array([st.per_position_acceptance for st in runs])
                                          / w.sum()).tolist()
    return agg


def bench_decoders(model, prompts_ids, max_new_tokens: int, drafters: dict, ks) -> dict:
    """Plain and speculative decoding, batch 1, greedy, each prompt run by every decoder in turn
    (interleaved, so machine noise hits all alike). Compile runs first and is reported apart."""
    from .generate import generate

    configs = [("plain", None, 0)] + [(f"{name} K={k}", d, k) for name, d in drafters.items() for k in ks]
    compile_s = {}
    for label, d, k in configs:       # warm-up: compile every program on the first prompt
        compile_s[label] = generate(model, prompts_ids[:1], max_new_tokens=max_new_tokens, drafter=d,
                                    num_draft_tokens=max(k, 1)).stats.compile_seconds
    runs = {label: [] for label, _, _ in configs}
    for ids in prompts_ids:
        for label, d, k in configs:
            runs[label].append(generate(model, [ids], max_new_tokens=max_new_tokens, drafter=d,
                                        num_draft_tokens=max(k, 1)).stats)
    result = {}
    for label, _, k in configs:
        result[label] = {**_aggregate(runs[label]), "compile_seconds": compile_s[label], "K": k}
        result[label]["speedup"] = result[label]["tokens_per_second"] / _aggregate(runs["plain"])["tokens_per_second"]
    return result


def _timed(fn, *args, repeats: int = 10) -> float:
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(fn(*args))
    return (time.perf_counter() - start) / repeats


def step_profile(model, drafter, K: int, prompt_ids, decoded: dict) -> dict:
    """Split one speculative step into drafting, verifying (target pass over K+1 tokens) and the
    rest (rejection, cache rollback, appends, loop control): each part timed alone, compiled."""
    from .cache import init_cache, rollback
    from .drafters.base import Context
    from .models import forward, forward_hidden
    from .sampling import Sampling, row_params

    cfg, params = model.config, model.params
    T = len(prompt_ids)
    S = T + 256
    ids = jnp.asarray([prompt_ids], jnp.int32)
    cache = init_cache(cfg, 1, S, params["embed"].dtype)
    prefill = jax.jit(lambda p, t, c: forward_hidden(p, t, c, cfg)[0])
    t_prefill = _timed(prefill, params, ids, cache, repeats=3)
    cache = rollback(forward(params, ids, cache, cfg)[2], jnp.asarray([T], jnp.int32))
    verify = jax.jit(lambda p, t, c: forward(p, t, c, cfg)[0])
    t_verify = _timed(verify, params, jnp.zeros((1, K + 1), jnp.int32), cache)
    history = jnp.zeros((1, S), jnp.int32).at[0, :T].set(ids[0])
    ctx = Context(ids[:, -1], history, jnp.asarray([T], jnp.int32), row_params(Sampling(), 1),
                  jnp.zeros((len(drafter.hidden_layers), 1, K + 1, cfg.hidden_size)))
    dparams = drafter.params_for(model)
    features = forward(params, ids, init_cache(cfg, 1, S, params["embed"].dtype), cfg, drafter.hidden_layers)[1]
    dstate = drafter.init(dparams, ids, jnp.asarray([T], jnp.int32), S, features)
    propose = jax.jit(lambda p, s, c, k: drafter.propose(p, s, c, k, K)[0])
    t_draft = _timed(propose, dparams, dstate, ctx, jax.random.PRNGKey(0))
    t_step = max(decoded["seconds"] - t_prefill * decoded["prompts"], 0.0) / decoded["target_steps"]
    other = max(t_step - t_draft - t_verify, 0.0)
    return {"step_seconds": t_step, "draft_seconds": t_draft, "verify_seconds": t_verify,
            "other_seconds": other, "prefill_seconds": t_prefill,
            "fractions": {"draft": t_draft / t_step, "verify": t_verify / t_step, "other": other / t_step}}


def bench_transformers(source_path: str, prompts_ids, max_new_tokens: int, eos_ids) -> dict:
    """Hugging Face transformers greedy generate (torch fp32, same GGUF weights), batch 1."""
    import torch
    from transformers import AutoModelForCausalLM

    folder, name = os.path.dirname(source_path), os.path.basename(source_path)
    kwargs = {"gguf_file": name} if name.endswith(".gguf") else {}
    hf = AutoModelForCausalLM.from_pretrained(folder if kwargs else source_path, dtype=torch.float32,
                                              **kwargs).eval()
    gen = dict(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=list(eos_ids),
               pad_token_id=eos_ids[0])
    with torch.no_grad():
        hf.generate(torch.tensor([prompts_ids[0]]), **{**gen, "max_new_tokens": 4})  # warm-up
        tokens, start = 0, time.perf_counter()
        for ids in prompts_ids:
            out = hf.generate(torch.tensor([ids]), **gen)
            tokens += out.shape[1] - len(ids)
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds,
            "torch_threads": torch.get_num_threads()}


def run(model_name: str, prompt_file: str | None, num_prompts: int, max_new_tokens: int,
        peer: str | None, out_dir: str | None, drafters=("ngram",), ks=(5,)) -> dict:
    from .loading import load
    from .loading.registry import NAMED_MODELS, resolve_named

    model = load(model_name)
    texts = read_prompts(prompt_file, num_prompts)
    ids = [model.tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
           for t in texts]
    made = {spec: make_drafter(spec, model) for spec in drafters}
    decoders = bench_decoders(model, ids, max_new_tokens, made, ks)
    result = {"model": model_name, "backend": jax.default_backend(), "prompts": len(ids),
              "prompt_file": prompt_file or DEFAULT_PROMPTS, "max_new_tokens": max_new_tokens,
              "batch": 1, "sampling": "greedy", "decoders": decoders}
    result["memory"] = {spec: drafter_memory(model, d, max(ks), len(ids[0]), max_new_tokens)
                        for spec, d in made.items()}
    result["target_parameters"] = int(sum(x.size for x in jax.tree_util.tree_leaves(model.params)))
    result["profiles"] = {}
    for spec, drafter in made.items():
        for k in ks:
            label = f"{spec} K={k}"
            result["profiles"][label] = step_profile(model, drafter, k, ids[0],
                                                     {**decoders[label], "prompts": len(ids)})
    bw = read_bandwidth()
    wb = weight_bytes(model.params)
    plain = decoders["plain"]["tokens_per_second"]
    result["bandwidth"] = {"read_bytes_per_second": bw, "weight_bytes_per_token": wb,
                           "bound_tokens_per_second": bw / wb, "fraction_of_bound": plain / (bw / wb)}
    if peer == "transformers":
        path = resolve_named(model_name) if model_name in NAMED_MODELS else model_name
        result["transformers_plain"] = bench_transformers(path, ids, max_new_tokens,
                                                          model.tokenizer.eos_token_ids)
        result["jaxspec_over_transformers"] = plain / result["transformers_plain"]["tokens_per_second"]
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "bench.json"), "w") as f:
            json.dump(result, f, indent=2)
        with open(os.path.join(out_dir, "bench.md"), "w") as f:
            f.write(markdown(result))
    return result


def markdown(r: dict) -> str:
    lines = [f"Model {r['model']} on {r['backend']}, batch 1, greedy, {r['prompts']} prompts, "
             f"up to {r['max_new_tokens']} new tokens\n",
             "| decoder | tokens | seconds | tokens/s | speedup | mean accepted length | acceptance rate | per-position acceptance |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, d in r["decoders"].items():
        acc = (f"{d['mean_accepted_length']:.2f} | {d['acceptance_rate']:.2f} | "
               + " ".join(f"{a:.2f}" for a in d["per_position_acceptance"])) if "acceptance_rate" in d else "1.00 | - | -"
        lines.append(f"| {name} | {d['tokens']} | {d['seconds']:.2f} | {d['tokens_per_second']:.2f} | "
                     f"{d['speedup']:.2f}x | {acc} |")
    if "transformers_plain" in r:
        d = r["transformers_plain"]
        lines.append(f"| transformers plain | {d['tokens']} | {d['seconds']:.2f} | {d['tokens_per_second']:.2f} | "
                     f"{d['tokens_per_second'] / r['decoders']['plain']['tokens_per_second']:.2f}x | | | |")
    if r.get("profiles"):
        lines += ["\nTime per speculative step (parts timed alone):\n",
                  "| decoder | step ms | draft | verify (K+1 tokens) | rejection + bookkeeping |", "|---|---:|---:|---:|---:|"]
        for name, p in r["profiles"].items():
            f = p["fractions"]
            lines.append(f"| {name} | {1e3 * p['step_seconds']:.1f} | {100 * f['draft']:.0f}% | "
                         f"{100 * f['verify']:.0f}% | {100 * f['other']:.0f}% |")
    if r.get("memory"):
        lines += [f"\nWhat each drafter adds at run time (batch 1, float32; the target has "
                  f"{r['target_parameters'] / 1e6:.1f}M parameters):\n",
                  "| drafter | extra parameters | extra weights MB | drafter state MB (cache of S slots) |",
                  "|---|---:|---:|---:|"]
        for name, m in r["memory"].items():
            lines.append(f"| {name} | {m['parameters'] / 1e6:.2f}M | {m['weight_bytes'] / 1e6:.1f} | "
                         f"{m['state_bytes'] / 1e6:.2f} (S={m['capacity']}) |")
    b = r["bandwidth"]
    lines.append(f"\nBandwidth bound: {b['read_bytes_per_second'] / 1e9:.1f} GB/s read / "
                 f"{b['weight_bytes_per_token'] / 1e6:.0f} MB of weights per token = "
                 f"{b['bound_tokens_per_second']:.1f} tokens/s; plain decoding reaches "
                 f"{100 * b['fraction_of_bound']:.0f}% of it.")
    return "\n".join(lines) + "\n"
