"""Read a Hugging Face model folder: config.json, *.safetensors, tokenizer.json."""
from __future__ import annotations

import contextlib
import glob
import json
import os

import numpy as np
from safetensors import safe_open

from ..config import ModelConfig
from ..paths import plain_file, stored
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
# Gemma 3 names its norms after where they sit: post_attention_layernorm follows attention (Llama's
# comes before the MLP), and keeps each norm's weight as w in (1 + w)
_GEMMA3_NAMES = {**_LAYER_NAMES, "mlp_norm": "pre_feedforward_layernorm.weight",
                 "post_attn_norm": "post_attention_layernorm.weight",
                 "post_mlp_norm": "post_feedforward_layernorm.weight", "q_norm": "self_attn.q_norm.weight",
                 "k_norm": "self_attn.k_norm.weight"}
_NORMS = ("norm", "attn_norm", "mlp_norm", "post_attn_norm", "post_mlp_norm", "q_norm", "k_norm")


def load_hf_dir(path: str, dtype):
    """-> (ModelConfig, params, Tokenizer) from a folder written by transformers' save_pretrained."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise ValueError(f"{path} has no config.json: not a Hugging Face model folder")
    with open(cfg_path) as f:
        cfg = ModelConfig.from_hf(json.load(f))
    plain = glob.glob(os.path.join(path, "*.safetensors"))
    files = sorted(plain + [f for f in glob.glob(os.path.join(path, "*.safetensors.xz")) if f[:-3] not in plain])
    if not files:
        raise ValueError(f"{path} has no *.safetensors weights")
    if stored(os.path.join(path, "tokenizer.json")) is None:
        raise ValueError(f"{path} has no tokenizer.json")
    with contextlib.ExitStack() as stack:
        where = {}
        for file in files:
            where.update(_tensor_readers(file, stack))

        names = _GEMMA3_NAMES if cfg.gemma else _LAYER_NAMES

        def read(name, layer):
            key = _GLOBAL_NAMES[name] if layer is None else f"model.layers.{layer}.{names[name]}"
            if key not in where and cfg.gemma:                    # a multimodal checkpoint's text model
                key = key.replace("model.", "model.language_model.", 1)
            if key not in where:
                return None
            t = np.asarray(where[key](), np.float32)
            return t + 1.0 if cfg.gemma and name in _NORMS else t

        params = assemble_params(cfg, read, dtype)
    return cfg, params, Tokenizer.from_hf_dir(path)


def _tensor_readers(file: str, stack: contextlib.ExitStack) -> dict:
    """tensor name -> a function returning it, read lazily from a .safetensors file or from a
    decompressed copy of a .safetensors.xz one (paths.plain_file). The flax framework reads bfloat16 too."""
    try:
        handle = stack.enter_context(safe_open(stack.enter_context(plain_file(file.removesuffix(".xz"))),
                                               framework="flax"))
        return {name: (lambda name=name: handle.get_tensor(name)) for name in handle.keys()}
    except Exception as e:
        raise ValueError(f"cannot read safetensors file {file}: {e}") from e
