"""Self-distilled training data: the target answers training prompts through its chat template.

Answers come from jaxspec's own batched generation (greedy by default) and are stored as token
ids (uint16 when the vocabulary fits) in numbered shards, each written atomically, so a killed
run resumes at the first missing shard. A manifest records the target, its weight fingerprint,
the settings and the held-out prompt indices (for acceptance checks during training).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator

import numpy as np
from tqdm import tqdm

MANIFEST = "manifest.json"


def read_prompt_file(path: str) -> list[str]:
    if not os.path.isfile(path):
        raise ValueError(f"prompt file not found: {path}")
    with open(path) as f:
        rows = [json.loads(line)["prompt"] for line in f if line.strip()]
    if not rows:
        raise ValueError(f"{path} holds no prompts")
    return rows


def _shard_path(out_dir: str, index: int) -> str:
    return os.path.join(out_dir, f"shard-{index:05d}.npz")


def _write_atomic_npz(path: str, **arrays) -> None:
    tmp = path + ".tmp.npz"
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)


def make_data(model, prompts_path: str, out_dir: str, num_prompts: int = 2048, heldout: int = 64,
              max_new_tokens: int = 256, max_prompt_tokens: int = 384, batch_size: int = 16,
              shard_size: int = 64, seed: int = 0, progress: bool = True) -> dict:
    """Generate (or resume) answers for `num_prompts` shuffled prompts; -> the manifest dict.

    The first `heldout` of the shuffled prompts are kept out of the data (acceptance checks). Calling
    again with a larger num_prompts and otherwise the same settings extends the data: the shuffled order
    continues and the existing shards are kept."""
    from jaxspec import generate

    texts = read_prompt_file(prompts_path)
    if not 0 < num_prompts + heldout <= len(texts):
        raise ValueError(f"num_prompts + heldout must lie in [1, {len(texts)}], got {num_prompts + heldout}")
    order = np.random.default_rng(seed).permutation(len(texts))
    heldout_idx, train_idx = order[:heldout], order[heldout:heldout + num_prompts]
    os.makedirs(out_dir, exist_ok=True)
    settings = {"target": model.source, "fingerprint": model.fingerprint,
                "prompts_file": os.path.basename(prompts_path), "num_prompts": int(num_prompts),
                "max_new_tokens": max_new_tokens, "max_prompt_tokens": max_prompt_tokens, "seed": seed,
                "shard_size": shard_size, "sampling": "greedy"}
    manifest_path = os.path.join(out_dir, MANIFEST)
    if os.path.isfile(manifest_path):
        with open(manifest_path) as f:
            old_manifest = json.load(f)
        old = old_manifest["settings"]
        if {**old, "num_prompts": num_prompts} != settings:
            raise ValueError(f"{out_dir} holds data made with other settings: {old} "
                             f"(now {settings}); use another --out or the same settings")
        if old_manifest["heldout_prompt_indices"] != heldout_idx.tolist():
            raise ValueError(f"{out_dir} keeps out other prompts ({len(old_manifest['heldout_prompt_indices'])} "
                             f"held out, now {heldout}); use the same --heldout or another --out")
        if num_prompts < old["num_prompts"]:
            raise ValueError(f"{out_dir} holds answers for {old['num_prompts']} prompts; --num-prompts can grow "
                             f"(the same shuffled order continues) but not shrink")
        partial = old["num_prompts"] % shard_size
        if partial and num_prompts > old["num_prompts"]:     # its last shard gains prompts: make it again
            last = _shard_path(out_dir, old["num_prompts"] // shard_size)
            if os.path.isfile(last):
                os.remove(last)
    manifest = {"settings": settings, "heldout_prompt_indices": heldout_idx.tolist()}
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)

    rows_per_call = min(batch_size, shard_size)
    dtype = np.uint16 if model.config.vocab_size <= 2**16 else np.int32
    shards = [train_idx[i:i + shard_size] for i in range(0, len(train_idx), shard_size)]
    done = sum(os.path.isfile(_shard_path(out_dir, i)) for i in range(len(shards)))
    bar = tqdm(total=len(train_idx), initial=min(done * shard_size, len(train_idx)), unit="prompt",
               desc="self-distilled answers", disable=not progress)
    for s, idx in enumerate(shards):
        if os.path.isfile(_shard_path(out_dir, s)):
            continue
        encoded = [(int(i), model.tokenizer.apply_chat_template([{"role": "user", "content": texts[i]}],
                                                                 add_generation_prompt=True)) for i in idx]
        kept = sorted([e for e in encoded if len(e[1]) <= max_prompt_tokens], key=lambda e: len(e[1]))
        rows = []
        for b in range(0, len(kept), batch_size):
            chunk = kept[b:b + batch_size]
            # every call has `rows_per_call` rows (the last prompt repeated, its copies' answers dropped):
            # one compiled program per prompt-length bucket, not one per short batch
            filler = [chunk[-1][1]] * (rows_per_call - len(chunk))
            out = generate(model, [ids for _, ids in chunk] + filler, max_new_tokens=max_new_tokens)
            rows += [(i, ids, ans) for (i, ids), ans in zip(chunk, out.tokens)]
            bar.update(len(chunk))
        bar.update(len(idx) - len(kept))
        seqs = [np.asarray(ids + ans, dtype) for _, ids, ans in rows]
        _write_atomic_npz(_shard_path(out_dir, s),
                          tokens=np.concatenate(seqs) if seqs else np.zeros((0,), dtype),
                          lengths=np.asarray([len(q) for q in seqs], np.int32),
                          prompt_lengths=np.asarray([len(ids) for _, ids, _ in rows], np.int32),
                          prompt_index=np.asarray([i for i, _, _ in rows], np.int32),
                          skipped=np.asarray(sorted(set(map(int, idx)) - {i for i, _ in kept}), np.int32))
    bar.close()
    return manifest


def shard_names(data_dir: str) -> list[str]:
    """The complete data shards in `data_dir`, in order."""
    if not os.path.isdir(data_dir):
        raise ValueError(f"data folder not found: {data_dir}")
    names = sorted(f for f in os.listdir(data_dir) if f.startswith("shard-") and f.endswith(".npz")
                   and ".tmp" not in f)
    if not names:
        raise ValueError(f"{data_dir} holds no data shards: run `jaxspec train data` first")
    return names


def read_shard(data_dir: str, name: str) -> tuple[list[np.ndarray], list[int]]:
    """-> (token ids int32[T] per example, prompt length per example)."""
    try:
        with np.load(os.path.join(data_dir, name)) as z:
            tokens, lengths, plens = z["tokens"], z["lengths"], z["prompt_lengths"]
    except Exception as e:
        raise ValueError(f"cannot read data shard {name} in {data_dir}: {e}") from e
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int)
    return [tokens[s:s + n].astype(np.int32) for s, n in zip(starts, lengths)], [int(p) for p in plens]


def iter_examples(data_dir: str) -> Iterator[tuple[np.ndarray, int]]:
    """Yield (token ids int32[T], prompt length) for every stored example, shard by shard."""
    for name in shard_names(data_dir):
        yield from zip(*read_shard(data_dir, name))


def summary(data_dir: str) -> dict:
    """Counts for the README and notes: examples, prompt tokens, answer tokens."""
    n = prompt = answer = 0
    for ids, p in iter_examples(data_dir):
        n, prompt, answer = n + 1, prompt + p, answer + len(ids) - p
    return {"examples": n, "prompt_tokens": prompt, "answer_tokens": answer}
