"""Read a Hugging Face model folder: config.json, *.safetensors, tokenizer.json."""
from __future__ import annotations

import contextlib
import glob
import json
import os

import numpy as np
from safetensors import safe_open

from ..config import ModelConfig
from ..tokenizer import Tokenizer
from .weights import assemble_params

_LAYER_NAMES = {"attn_norm": "input_layernorm.weight", "q": "self_attn.q_proj.weight",
                "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
                "o": "self_attn.o_proj.weight", "bq": "self_attn.q_proj.bias",
                "bk": "self_attn.k_proj.bias", "bv": "self_attn.v_proj.bias",
                "mlp_norm": "post_attention_layernorm.weight", "gate": "mlp.gate_proj.weight",
                "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight"}
_GLOBAL_NAMES = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight",
                 "lm_head": "lm_head.weight"}


def load_hf_dir(path: str, dtype):
    """-> (ModelConfig, params, Tokenizer) from a folder written by transformers' save_pretrained."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise ValueError(f"{path} has no config.json: not a Hugging Face model folder")
    with open(cfg_path) as f:
        cfg = ModelConfig.from_hf(json.load(f))
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(f"{path} has no *.safetensors weights")
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        raise ValueError(f"{path} has no tokenizer.json")
    with contextlib.ExitStack() as stack:
        where = {}
        for file in files:
            try:  # the flax framework reads bfloat16 too
                handle = stack.enter_context(safe_open(file, framework="flax"))
            except Exception as e:
                raise ValueError(f"cannot read safetensors file {file}: {e}") from e
            where.update({name: handle for name in handle.keys()})

        def read(name, layer):
            key = _GLOBAL_NAMES[name] if layer is None else f"model.layers.{layer}.{_LAYER_NAMES[name]}"
            return np.asarray(where[key].get_tensor(key), np.float32) if key in where else None

        params = assemble_params(cfg, read, dtype)
    return cfg, params, Tokenizer.from_hf_dir(path)
