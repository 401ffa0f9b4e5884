"""SmolLM2-135M-Instruct in jaxspec vs Hugging Face transformers on the same GGUF weights."""
from __future__ import annotations

import numpy as np
import torch

import jaxspec

TEXTS = ["The capital of France is",
         "def fibonacci(n):\n    if n < 2:\n        return n\n",
         "Once upon a time, in a land far, far away, there lived a dragon named",
         "12 + 30 ="]


def test_config_is_smollm2(smollm):
    cfg = smollm.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert (cfg.vocab_size, cfg.rope_theta, cfg.tie_word_embeddings) == (49152, 100000.0, True)


def test_logits_match_transformers_batched_different_lengths(smollm, hf_smollm):
    hf, _ = hf_smollm
    rows = [smollm.tokenizer.encode(t) for t in TEXTS]
    width = max(map(len, rows))
    padded = np.zeros((len(rows), width), np.int32)       # right padding: causal rows never see it
    for i, r in enumerate(rows):
        padded[i, :len(r)] = r
    ours = np.asarray(smollm.logits(padded))
    for i, r in enumerate(rows):
        with torch.no_grad():
            ref = hf(torch.tensor([r])).logits[0].numpy()
        diff = np.abs(ours[i, :len(r)] - ref).max()
        assert diff <= 1e-3, f"row {i}: max |logit diff| {diff}"


def test_greedy_generate_matches_transformers(smollm, hf_smollm, chat_prompts):
    hf, _ = hf_smollm
    out = jaxspec.generate(smollm, chat_prompts, max_new_tokens=64)
    for i, prompt in enumerate(chat_prompts):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False,
                              eos_token_id=list(smollm.tokenizer.eos_token_ids), pad_token_id=2)
        ref_new = ref[0, len(prompt):].tolist()
        assert out.tokens[i] == ref_new, f"row {i} differs"
    assert all(len(t) == 64 for t in out.tokens), "every row should compare 64 tokens"
    assert out.texts[0] == smollm.tokenizer.decode(out.tokens[0], skip_special_tokens=True)
    assert out.stats.new_tokens == 3 * 64 and out.stats.target_steps == 63


def test_eos_ends_a_row_and_is_kept(smollm):
    prompt = smollm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 17 times 23? Explain step by step."}], add_generation_prompt=True)
    out = jaxspec.generate(smollm, [prompt], max_new_tokens=128)
    assert out.tokens[0][-1] in smollm.tokenizer.eos_token_ids
    assert not set(out.tokens[0][:-1]) & set(smollm.tokenizer.eos_token_ids)
