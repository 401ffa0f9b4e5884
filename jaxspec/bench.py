"""Benchmark harness: speeds measured as ratios within one process and run.

This first version measures plain decoding at batch 1: jaxspec, optionally Hugging Face
transformers (torch, same weights) on the same prompts, and the memory-bandwidth bound
(one decode step reads every weight once: bound = read bandwidth / weight bytes).
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
    """Prompts from a JSONL file with a "prompt" field (default: eval.jsonl beside the repo)."""
    path = path or DEFAULT_PROMPTS
    if not os.path.isfile(path):
        if path != DEFAULT_PROMPTS:
            raise ValueError(f"prompt file not found: {path}")
        return BUILTIN_PROMPTS[:limit]
    with open(path) as f:
        rows = [json.loads(line)["prompt"] for line in f if line.strip()]
    return rows[:limit]


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


def bench_plain(model, prompts_ids, max_new_tokens: int) -> dict:
    """jaxspec plain decoding, batch 1, prompt by prompt (compile excluded, reported apart)."""
    from .generate import generate

    compile_s = generate(model, prompts_ids[:1], max_new_tokens=max_new_tokens).stats.compile_seconds
    tokens = seconds = 0.0
    for ids in prompts_ids:
        st = generate(model, [ids], max_new_tokens=max_new_tokens).stats
        compile_s += st.compile_seconds
        tokens, seconds = tokens + st.new_tokens, seconds + st.wall_seconds
    return {"tokens": int(tokens), "seconds": seconds, "tokens_per_second": tokens / seconds,
            "compile_seconds": compile_s}


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
        peer: str | None, out_dir: str | None) -> dict:
    from .loading import load
    from .loading.registry import NAMED_MODELS, resolve_named

    model = load(model_name)
    texts = read_prompts(prompt_file, num_prompts)
    ids = [model.tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
           for t in texts]
    result = {"model": model_name, "backend": jax.default_backend(), "prompts": len(ids),
              "max_new_tokens": max_new_tokens, "jaxspec_plain": bench_plain(model, ids, max_new_tokens)}
    bw = read_bandwidth()
    wb = weight_bytes(model.params)
    result["bandwidth"] = {"read_bytes_per_second": bw, "weight_bytes_per_token": wb,
                           "bound_tokens_per_second": bw / wb,
                           "fraction_of_bound": result["jaxspec_plain"]["tokens_per_second"] / (bw / wb)}
    if peer == "transformers":
        path = resolve_named(model_name) if model_name in NAMED_MODELS else model_name
        result["transformers_plain"] = bench_transformers(path, ids, max_new_tokens,
                                                          model.tokenizer.eos_token_ids)
        result["jaxspec_over_transformers"] = (result["jaxspec_plain"]["tokens_per_second"]
                                               / result["transformers_plain"]["tokens_per_second"])
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "bench.json"), "w") as f:
            json.dump(result, f, indent=2)
        with open(os.path.join(out_dir, "bench.md"), "w") as f:
            f.write(markdown(result))
    return result


def markdown(r: dict) -> str:
    rows = [("jaxspec plain", r["jaxspec_plain"])]
    if "transformers_plain" in r:
        rows.append(("transformers plain", r["transformers_plain"]))
    lines = [f"Model {r['model']} on {r['backend']}, batch 1, greedy, {r['prompts']} prompts, "
             f"up to {r['max_new_tokens']} new tokens\n", "| decoder | tokens | seconds | tokens/s |",
             "|---|---:|---:|---:|"]
    lines += [f"| {name} | {d['tokens']} | {d['seconds']:.2f} | {d['tokens_per_second']:.2f} |" for name, d in rows]
    b = r["bandwidth"]
    lines.append(f"\nBandwidth bound: {b['read_bytes_per_second'] / 1e9:.1f} GB/s read / "
                 f"{b['weight_bytes_per_token'] / 1e6:.0f} MB of weights per token = "
                 f"{b['bound_tokens_per_second']:.1f} tokens/s; jaxspec plain reaches "
                 f"{100 * b['fraction_of_bound']:.0f}% of it.")
    if "jaxspec_over_transformers" in r:
        lines.append(f"jaxspec / transformers plain decoding: {r['jaxspec_over_transformers']:.2f}x")
    return "\n".join(lines) + "\n"
