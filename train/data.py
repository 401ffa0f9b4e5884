"""Self-distilled training data: the target answers training prompts through its chat template.

Answers come from jaxspec's own batched generation and are stored as token ids (uint16 when the
vocabulary fits) in numbered shards, each written atomically, so a killed run resumes at the first
missing shard. The data is made in parts: each part draws its prompts from a mix of prompt pools
(train/prompts.py) with its own settings, and answers a stated fraction of them by sampling at a
temperature (the rest greedily). A manifest records the target, its weight fingerprint and, per
part, the settings, its first shard and the held-out prompt indices (for acceptance checks).

Manifest version 1 (one prompt file, greedy, one part) is read as a one-part version 2 manifest;
its shards stay as they are and a new part continues after them.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import numpy as np
from tqdm import tqdm

from jaxspec import paths
from jaxspec.shards import read_shard, shard_names  # noqa: F401 (train.data's readers)
from jaxspec.tokenizer import prompt_ids

from .prompts import DEFAULT_DIR, parse_mix, pool_file, pool_orders, read_prompt_file, stream

MANIFEST = "manifest.json"
MAKING_LOG = "making.jsonl"        # one line per shard made: answer tokens, seconds, batch size

__all__ = ["make_data", "read_manifest", "read_prompt_file", "shard_names", "read_shard", "iter_examples",
           "summary", "MANIFEST"]


def _shard_path(out_dir: str, index: int) -> str:
    return os.path.join(out_dir, f"shard-{index:05d}.npz")


def _write_atomic_npz(path: str, **arrays) -> None:
    tmp = path + ".tmp.npz"
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)


def read_manifest(data_dir: str) -> dict:
    """The data manifest as version 2: {"version", "target", "fingerprint", "parts": [{"first_shard",
    "settings" (with "mix": {pool: weight}), "heldout": {pool: [prompt index]}}]}."""
    path = os.path.join(data_dir, MANIFEST)
    if not os.path.isfile(path):
        raise ValueError(f"{data_dir} holds no data manifest: run `jaxspec train data` first")
    with open(path) as f:
        m = json.load(f)
    if m.get("version", 1) == 2:
        return m
    s = m["settings"]                                      # version 1: one prompt file, greedy answers
    part = {"first_shard": 0, "heldout": {s["prompts_file"]: m["heldout_prompt_indices"]},
            "settings": {**s, "mix": {s["prompts_file"]: 1.0}, "sampled_fraction": 0.0,
                         "heldout": len(m["heldout_prompt_indices"])}}
    return {"version": 2, "target": s["target"], "fingerprint": s["fingerprint"], "parts": [part],
            "migrated_from": 1}


def heldout_indices(data_dir: str) -> dict[str, set]:
    """{prompt file: indices} held out by any part of the data in data_dir."""
    out: dict[str, set] = {}
    for part in read_manifest(data_dir)["parts"]:
        for pool, idx in part["heldout"].items():
            out.setdefault(pool_file(pool), set()).update(idx)
    return out


def _part_shards(part: dict) -> int:
    s = part["settings"]
    return -(-s["num_prompts"] // s["shard_size"])


def _used_prompts(data_dir: str, manifest: dict) -> dict[str, set]:
    """Prompt indices per file that earlier parts answered, skipped or held out."""
    used: dict[str, set] = {}
    for part in manifest["parts"]:
        pools = list(part["settings"]["mix"])
        for pool, idx in part["heldout"].items():
            used.setdefault(pool_file(pool), set()).update(idx)
        for s in range(part["first_shard"], part["first_shard"] + _part_shards(part)):
            path = _shard_path(data_dir, s)
            if not os.path.isfile(path):
                raise ValueError(f"{path} is missing: finish the part it belongs to before starting a new one")
            with np.load(path) as z:
                for p, i in zip(read_pool_index(z, len(z["prompt_index"])), z["prompt_index"].tolist()):
                    used.setdefault(pool_file(pools[p]), set()).add(i)
                skipped_pool = z["skipped_pool"] if "skipped_pool" in z else np.zeros(len(z["skipped"]), np.int64)
                for p, i in zip(skipped_pool.tolist(), z["skipped"].tolist()):
                    used.setdefault(pool_file(pools[p]), set()).add(i)
    return used


def make_data(model, mix, out_dir: str, num_prompts: int = 2048, heldout: int = 64, max_new_tokens: int = 256,
              max_prompt_tokens: int = 384, batch_size: int = 16, shard_size: int = 64, seed: int = 0,
              sampled_fraction: float = 0.0, temperature: float = 0.7, prompts_dir: str | None = None,
              new_part: bool = False, writer=None, exclude: dict[str, set] | None = None,
              progress: bool = True) -> dict:
    """Generate (or resume) answers for `num_prompts` prompts drawn from `mix`; -> the manifest dict.

    mix: {pool: weight}, a --mix string (train/prompts.py), or the path of one prompt file. Pools name
    files in prompts_dir. `heldout` prompts of each pool are kept out of the data (acceptance checks).
    In each shard the last round(sampled_fraction * rows) prompts are answered by sampling at
    `temperature`, the others greedily; each group runs sorted by prompt length in calls of batch_size
    rows. Calling again with a larger num_prompts and otherwise the same settings extends the last part
    (its draws continue); new_part=True starts a part with other settings after the existing shards,
    on prompts no earlier part used. writer: a Model on the target's tokenizer that writes the answers
    instead of the target (a draft model: on-policy data for distillation, Agarwal et al. 2024, Zhou et al.
    2024); the target still templates the prompts, and its features are computed over the answers later.
    exclude: {prompt file: indices} never to draw (e.g. another data folder's held-out prompts)."""
    mix, prompts_dir = _checked_mix(mix, prompts_dir, num_prompts, sampled_fraction, temperature)
    settings = {"target": model.source, "fingerprint": model.fingerprint, "mix": dict(mix),
                "num_prompts": int(num_prompts), "heldout": int(heldout), "max_new_tokens": max_new_tokens,
                "max_prompt_tokens": max_prompt_tokens, "seed": seed, "shard_size": shard_size,
                "batch_size": batch_size, "sampled_fraction": sampled_fraction,
                "temperature": temperature if sampled_fraction else 0.0,
                **({"writer": {"source": writer.source, "fingerprint": writer.fingerprint}} if writer else {})}
    os.makedirs(out_dir, exist_ok=True)
    manifest, part = _open_part(out_dir, model, settings, new_part)
    earlier = {**manifest, "parts": [p for p in manifest["parts"] if p is not part]}
    used = _used_prompts(out_dir, earlier)
    for name, idx in (exclude or {}).items():
        used.setdefault(name, set()).update(idx)
    held, order, texts = pool_orders(mix, prompts_dir, seed, heldout, used)
    if "heldout" in part and part["heldout"] != held:
        raise ValueError(f"{out_dir}: the prompt files changed since this part was made (its held-out prompts "
                         f"differ); use the files it was made from or another --out")
    part["heldout"] = held
    items = stream(mix, order, seed, num_prompts)          # checks every pool has enough prompts first
    manifest.pop("migrated_from", None)
    manifest_path = os.path.join(out_dir, MANIFEST)
    with open(manifest_path + ".tmp", "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(manifest_path + ".tmp", manifest_path)

    shards = [items[i:i + shard_size] for i in range(0, len(items), shard_size)]
    first = part["first_shard"]
    done = sum(os.path.isfile(_shard_path(out_dir, first + i)) for i in range(len(shards)))
    bar = tqdm(total=len(items), initial=min(done * shard_size, len(items)), unit="prompt",
               desc="self-distilled answers", disable=not progress)
    for s, shard in enumerate(shards):
        path = _shard_path(out_dir, first + s)
        if not os.path.isfile(path):
            _make_shard(model, writer, shard, texts, settings, first + s, path, list(mix), bar)
    bar.close()
    return manifest


def _checked_mix(mix, prompts_dir, num_prompts: int, sampled_fraction: float, temperature: float):
    """make_data's mix as {pool: weight} and its prompts folder; ValueError for bad settings."""
    if isinstance(mix, str) and prompts_dir is None and "=" not in mix and "," not in mix:   # one file's path
        prompts_dir, mix = os.path.dirname(os.path.abspath(mix)), {os.path.basename(mix): 1.0}
    elif isinstance(mix, str):
        mix = parse_mix(mix)
    prompts_dir = prompts_dir or DEFAULT_DIR
    for pool in mix:
        if paths.stored(os.path.join(prompts_dir, pool_file(pool))) is None:
            raise ValueError(f"prompt file not found: {os.path.join(prompts_dir, pool_file(pool))}")
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    if not 0.0 <= sampled_fraction <= 1.0:
        raise ValueError(f"sampled_fraction must lie in [0, 1], got {sampled_fraction}")
    if sampled_fraction and not temperature > 0:
        raise ValueError(f"temperature must be > 0 for sampled answers, got {temperature}")
    return mix, prompts_dir


def _open_part(out_dir: str, model, settings: dict, new_part: bool) -> tuple[dict, dict]:
    """The manifest of out_dir (new, or read and checked against settings) and the part to fill:
    the last one extended, or a new one after it. -> (manifest, part)."""
    if not os.path.isfile(os.path.join(out_dir, MANIFEST)):
        part = {"first_shard": 0, "settings": settings}
        return {"version": 2, "target": model.source, "fingerprint": model.fingerprint, "parts": [part]}, part
    manifest = read_manifest(out_dir)
    if manifest["fingerprint"] != model.fingerprint:
        raise ValueError(f"{out_dir} holds data made by a target with weights {manifest['fingerprint']}, "
                         f"not this one ({model.fingerprint})")
    last = manifest["parts"][-1]
    old, num_prompts, heldout = last["settings"], settings["num_prompts"], settings["heldout"]
    same = {**old, "num_prompts": num_prompts} == settings
    if new_part:
        part = {"first_shard": last["first_shard"] + _part_shards(last), "settings": settings}
        manifest["parts"].append(part)
        return manifest, part
    if not same and {**old, "num_prompts": num_prompts, "heldout": heldout} == settings:
        raise ValueError(f"{out_dir} keeps out other prompts ({old['heldout']} held out per pool, now "
                         f"{heldout}); use the same --heldout or another --out")
    if not same:
        raise ValueError(f"{out_dir} holds data made with other settings: {old} (now {settings}); use "
                         f"the same settings to extend it, --new-part to add a part, or another --out")
    if num_prompts < old["num_prompts"]:
        raise ValueError(f"{out_dir} holds answers for {old['num_prompts']} prompts; --num-prompts can grow "
                         f"(the same draws continue) but not shrink")
    partial = old["num_prompts"] % settings["shard_size"]
    if partial and num_prompts > old["num_prompts"]:     # its last shard gains prompts: make it again
        stale = _shard_path(out_dir, last["first_shard"] + old["num_prompts"] // settings["shard_size"])
        if os.path.isfile(stale):
            os.remove(stale)
    last["settings"] = settings
    return manifest, last


def _make_shard(model, writer, shard: list, texts: dict, settings: dict, number: int, path: str, pools: list,
                bar) -> None:
    """Answer one shard's prompts [(pool, index)] and write it (with a line in making.jsonl)."""
    from jaxspec import Sampling, generate

    batch_size, temperature = settings["batch_size"], settings["temperature"]
    start, rows, answer_tokens = time.perf_counter(), [], 0
    n_sampled = int(round(settings["sampled_fraction"] * len(shard)))
    encoded = [(pool, int(i), prompt_ids(model.tokenizer, texts[pool_file(pool)][i]),
        r >= len(shard) - n_sampled) for r, (pool, i) in enumerate(shard)]
    kept = [e for e in encoded if len(e[2]) <= settings["max_prompt_tokens"]]
    for is_sampled in (False, True):
        group = sorted([e for e in kept if e[3] == is_sampled], key=lambda e: len(e[2]))
        for b in range(0, len(group), batch_size):
            chunk = group[b:b + batch_size]
            # every call has batch_size rows (the last prompt repeated, its copies' answers dropped): one
            # compiled program per prompt-length bucket, not one per short batch
            filler = [chunk[-1][2]] * (batch_size - len(chunk))
            call_seed = int(np.random.default_rng([settings["seed"], number, b]).integers(2**31))
            out = generate(writer or model, [ids for _, _, ids, _ in chunk] + filler,
                           max_new_tokens=settings["max_new_tokens"], seed=call_seed,
                           sampling=Sampling(temperature=temperature) if is_sampled else Sampling())
            rows += [(e, ans) for e, ans in zip(chunk, out.tokens)]
            answer_tokens += sum(len(a) for a in out.tokens[:len(chunk)])
            bar.update(len(chunk))
            bar.set_postfix(answer_tok_s=f"{answer_tokens / (time.perf_counter() - start):.0f}")
    bar.update(len(shard) - len(kept))
    dtype = np.uint16 if model.config.vocab_size <= 2**16 else np.int32
    seqs = [np.asarray(e[2] + ans, dtype) for e, ans in rows]
    skipped = [e for e in encoded if len(e[2]) > settings["max_prompt_tokens"]]
    _write_atomic_npz(path,
                      tokens=np.concatenate(seqs) if seqs else np.zeros((0,), dtype),
                      lengths=np.asarray([len(q) for q in seqs], np.int32),
                      prompt_lengths=np.asarray([len(e[2]) for e, _ in rows], np.int32),
                      prompt_index=np.asarray([e[1] for e, _ in rows], np.int32),
                      pool=np.asarray([pools.index(e[0]) for e, _ in rows], np.uint8),
                      temperature=np.asarray([temperature if e[3] else 0.0 for e, _ in rows], np.float32),
                      skipped=np.asarray([e[1] for e in skipped], np.int32),
                      skipped_pool=np.asarray([pools.index(e[0]) for e in skipped], np.uint8))
    with open(os.path.join(os.path.dirname(path), MAKING_LOG), "a") as f:
        f.write(json.dumps({"shard": number, "prompts": len(rows), "answer_tokens": answer_tokens,
                            "seconds": round(time.perf_counter() - start, 1), "batch_size": batch_size}) + "\n")


def select_shards(data_dir: str, spec: str) -> list[str]:
    """The shards a spec such as "48-51,60" names (shard indices, ranges inclusive), checked to exist."""
    names = shard_names(data_dir)
    index = {int(n[len("shard-"):-len(".npz")]): n for n in names}
    chosen = []
    for item in filter(None, (x.strip() for x in spec.split(","))):
        try:
            lo, _, hi = item.partition("-")
            span = range(int(lo), int(hi or lo) + 1)
        except ValueError:
            raise ValueError(f"--shards takes indices and ranges such as 48-51,60, not {item!r}") from None
        missing = [i for i in span if i not in index]
        if missing or not span:
            raise ValueError(f"{data_dir} has no shard {missing[0] if missing else item} "
                             f"(it holds shards {min(index)}-{max(index)})")
        chosen += [index[i] for i in span if index[i] not in chosen]
    if not chosen:
        raise ValueError(f"--shards {spec!r} names no shard")
    return chosen


def iter_examples(data_dir: str, names: list[str] | None = None) -> Iterator[tuple[np.ndarray, int]]:
    """Yield (token ids int32[T], prompt length) for every stored example (of the shards `names`), shard by
    shard."""
    for name in shard_names(data_dir) if names is None else names:
        yield from zip(*read_shard(data_dir, name))


def shard_pools(data_dir: str) -> dict[str, list[str]]:
    """{shard file name: the pool names its `pool` indices refer to (its part's mix)}."""
    out = {}
    for part in read_manifest(data_dir)["parts"]:
        for s in range(part["first_shard"], part["first_shard"] + _part_shards(part)):
            out[os.path.basename(_shard_path(data_dir, s))] = list(part["settings"]["mix"])
    return out


def read_pool_index(z, rows: int) -> list[int]:
    """The `pool` index of each example of an opened shard (version-1 shards: all pool 0)."""
    return z["pool"].tolist() if "pool" in z else [0] * rows


def summary(data_dir: str, names: list[str] | None = None) -> dict:
    """Counts for the README and notes: examples, prompt tokens, answer tokens, sampled answers, and the
    examples and answer tokens of each prompt pool (of the shards `names`, default all)."""
    part_of = shard_pools(data_dir)
    n = prompt = answer = sampled = 0
    pools: dict[str, dict] = {}
    for name in (shard_names(data_dir) if names is None else names):
        seqs, plens = read_shard(data_dir, name)
        with np.load(os.path.join(data_dir, name)) as z:
            pool = read_pool_index(z, len(seqs))
            temps = z["temperature"] if "temperature" in z else np.zeros(len(seqs))
        names = part_of.get(name)
        if names is None:
            raise ValueError(f"{name} in {data_dir} belongs to no part of its manifest")
        for ids, p, q in zip(seqs, plens, pool):
            n, prompt, answer = n + 1, prompt + p, answer + len(ids) - p
            c = pools.setdefault(names[q], {"examples": 0, "answer_tokens": 0})
            c["examples"] += 1
            c["answer_tokens"] += len(ids) - p
        sampled += int(np.count_nonzero(temps))
    return {"examples": n, "prompt_tokens": prompt, "answer_tokens": answer, "sampled_answers": sampled,
            "pools": pools}
