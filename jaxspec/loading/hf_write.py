"""Write a jaxspec Model as a Hugging Face model folder (config.json, model.safetensors, tokenizer files),
the inverse of hf_dir.load_hf_dir: transformers' LlamaForCausalLM and jaxspec.load both read it."""
from __future__ import annotations

import json
import os

import numpy as np
from safetensors.numpy import save_file

from ..model import Model
from ..models import stack_layers


def hf_config(model: Model) -> dict:
    """config.json for a Llama-architecture model."""
    c, tok = model.config, model.tokenizer
    if c.architecture != "llama" or c.qkv_bias:
        raise ValueError(f"only plain Llama models can be written, not {c.architecture!r}")
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": c.vocab_size,
            "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "rope_theta": c.rope_theta,
            "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_position_embeddings,
            "tie_word_embeddings": "lm_head" not in model.params, "hidden_act": "silu",
            "attention_bias": False, "torch_dtype": "bfloat16",
            "bos_token_id": tok.bos_token_id, "eos_token_id": list(tok.eos_token_ids) or None,
            "pad_token_id": tok.pad_token_id}


def hf_tensors(model: Model, dtype=np.float32) -> dict[str, np.ndarray]:
    """Hugging Face tensor names and [out, in] layouts from the einsum layouts of models/llama.py."""
    c, p = model.config, model.params
    E = c.hidden_size
    f = lambda a: np.ascontiguousarray(np.asarray(a, np.float32).astype(dtype))
    out = {"model.embed_tokens.weight": f(p["embed"]), "model.norm.weight": f(p["norm"])}
    if "lm_head" in p:
        out["lm_head.weight"] = f(np.asarray(p["lm_head"]).T)
    lay = {k: np.asarray(v, np.float32) for k, v in stack_layers(p["layers"]).items()}
    for i in range(c.num_layers):
        pre = f"model.layers.{i}."
        out.update({
            pre + "input_layernorm.weight": f(lay["attn_norm"][i]),
            pre + "self_attn.q_proj.weight": f(lay["wq"][i].reshape(E, -1).T),
            pre + "self_attn.k_proj.weight": f(lay["wk"][i].reshape(E, -1).T),
            pre + "self_attn.v_proj.weight": f(lay["wv"][i].reshape(E, -1).T),
            pre + "self_attn.o_proj.weight": f(lay["wo"][i].reshape(-1, E).T),
            pre + "post_attention_layernorm.weight": f(lay["mlp_norm"][i]),
            pre + "mlp.gate_proj.weight": f(lay["w_gate"][i].T),
            pre + "mlp.up_proj.weight": f(lay["w_up"][i].T),
            pre + "mlp.down_proj.weight": f(lay["w_down"][i].T),
        })
    return out


def save_hf_dir(model: Model, path: str, bfloat16: bool = True) -> None:
    """Write `model` (weights in bfloat16 unless bfloat16=False) and its tokenizer to folder `path`."""
    import ml_dtypes

    os.makedirs(path, exist_ok=True)
    tok = model.tokenizer
    if not hasattr(tok, "backend"):
        raise ValueError("the model's tokenizer cannot be written (it has no tokenizers backend)")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config(model), f, indent=1)
    save_file(hf_tensors(model, ml_dtypes.bfloat16 if bfloat16 else np.float32),
              os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    tok.backend.save(os.path.join(path, "tokenizer.json"))
    name = lambda i: None if i is None else tok.backend.id_to_token(i)
    tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": name(tok.bos_token_id),
               "eos_token": name(tok.eos_token_ids[0]) if tok.eos_token_ids else None,
               "pad_token": name(tok.pad_token_id), "chat_template": tok.chat_template}
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({k: v for k, v in tok_cfg.items() if v is not None}, f, indent=1)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": list(tok.eos_token_ids), "bos_token_id": tok.bos_token_id}, f, indent=1)
