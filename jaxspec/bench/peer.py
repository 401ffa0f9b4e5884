"""Hugging Face transformers on the same weights: plain greedy and prompt-lookup decoding, batch 1."""
from __future__ import annotations

import os
import time


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
