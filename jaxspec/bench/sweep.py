"""`jaxspec bench`: the sweep over batch sizes and temperatures, saved as it goes (bench.json,
bench.md), with the bandwidth bound, memory and the transformers peer, then the plots."""
from __future__ import annotations

import dataclasses
import json
import os
import time

import jax

from .. import paths
from ..tokenizer import prompt_ids
from .decoders import bench_decoders, generate_greedy, verify_costs
from .inputs import EVAL_PROMPTS, drafter_memory, make_drafter, read_bandwidth, read_prompts, weight_bytes
from .peer import bench_transformers
from .plots import plot
from .report import markdown


def run(model_name, *, prompt_file: str | None = None, num_prompts: int = 4, max_new_tokens: int = 128,
        peer: str | None = None, out_dir: str | None = None, drafters=("ngram",), ks=(5,), batch_sizes=(1,),
        temperatures=(0.0,), adaptive: bool = True, repeats: int = 1, source: str | None = None,
        trees=(), mesh=None, command: str | None = None) -> dict:
    from ..loading import load
    from ..sharding import describe
    from ..loading.registry import NAMED_MODELS, resolve_named
    from ..sampling import Sampling

    model = load(model_name) if isinstance(model_name, str) else model_name     # a name, path or Model
    model_name = model_name if isinstance(model_name, str) else model.source
    texts = read_prompts(prompt_file, num_prompts, source)
    ids = [prompt_ids(model.tokenizer, t) for t in texts]
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
    """What a result file records of how it was made: {"date", "time" (UTC, to order a day's results),
    "machine", "command"} (paths in the command as portable_paths writes them)."""
    return {"date": time.strftime("%Y-%m-%d"), "time": time.strftime("%H:%M:%S", time.gmtime()), "machine": _machine(),
            "command": None if command is None else portable_paths(command)}


def portable_paths(command: str) -> str:
    """A command line with this machine's paths made portable: the cache and temporary folders as
    $JAXSPEC_CACHE and $TMPDIR, the repository's own paths relative to it (result files are read by
    people on other machines)."""
    import tempfile
    folders = ((paths.cache_dir(), "$JAXSPEC_CACHE"), (paths.root(), "."), (tempfile.gettempdir(), "$TMPDIR"))
    words = []
    for word in command.split(" "):
        for folder, name in folders:
            if word == folder or word.startswith(folder + os.sep):
                word = name + word[len(folder):] if name != "." else os.path.relpath(word, folder)
                break
        words.append(word)
    return " ".join(words)


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
