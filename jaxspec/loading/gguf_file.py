"""Read a Llama, Qwen2 or Gemma 3 GGUF file: config, dequantized float params and tokenizer."""
from __future__ import annotations

import os

import gguf
import numpy as np

from .. import warm
from ..config import ModelConfig
from ..tokenizer import Tokenizer
from .weights import assemble_params

_LAYER_NAMES = {"attn_norm": "attn_norm", "q": "attn_q", "k": "attn_k", "v": "attn_v",
                "o": "attn_output", "bq": "attn_q", "bk": "attn_k", "bv": "attn_v",
                "mlp_norm": "ffn_norm", "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down",
                "q_norm": "attn_q_norm", "k_norm": "attn_k_norm", "post_attn_norm": "post_attention_norm",
                "post_mlp_norm": "post_ffw_norm"}      # the last four: Gemma 3 (norms stored as 1 + w)
_GLOBAL_NAMES = {"embed": "token_embd.weight", "norm": "output_norm.weight", "lm_head": "output.weight"}


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs -> Hugging Face half split).

    w [N*D, E]: within each head, GGUF orders rows (0, D/2, 1, D/2+1, ...); HF orders (0..D/2-1, D/2..D-1).
    """
    rows, cols = w.shape[0], w.shape[1:]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *cols).swapaxes(1, 2).reshape(w.shape)


def read_fields(reader: gguf.GGUFReader) -> dict:
    return {key: field.contents() for key, field in reader.fields.items()}


def load_gguf(path: str, dtype):
    """-> (ModelConfig, params, Tokenizer). Raises ValueError for files that are not readable GGUF.
    The fields and dequantized tensors are kept for the next process (jaxspec/warm.py)."""
    if not os.path.isfile(path):
        raise ValueError(f"model file not found: {path}")
    cached = warm.read_weights(path)
    if cached is not None:
        fields, floats = cached
        return _assemble(fields, floats.__contains__, floats.get, dtype)
    try:
        reader = gguf.GGUFReader(path)
        fields = read_fields(reader)
    except Exception as e:  # the gguf package raises assorted errors on bad bytes
        raise ValueError(f"cannot read GGUF file {path}: {e}") from e
    tensors, floats = {t.name: t for t in reader.tensors}, {}

    def dequantized(gname):
        t = tensors[gname]
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as e:
            raise ValueError(f"cannot dequantize {gname} in {path}: {e}") from e
        floats[gname] = np.asarray(w, np.float32).reshape(tuple(int(n) for n in reversed(t.shape)))
        return floats[gname]

    result = _assemble(fields, tensors.__contains__, dequantized, dtype)
    warm.write_weights(path, fields, floats)
    return result


def _assemble(fields: dict, has, tensor, dtype):
    """(config, params, tokenizer) from GGUF fields and tensor(GGUF name) -> float32 array (has(name): present)."""
    cfg = ModelConfig.from_gguf(fields)
    cfg = ModelConfig(**{**cfg.__dict__, "tie_word_embeddings": not has("output.weight")})

    def read(name, layer):
        if layer is None:
            gname = _GLOBAL_NAMES[name]
        else:
            suffix = "bias" if name in ("bq", "bk", "bv") else "weight"
            gname = f"blk.{layer}.{_LAYER_NAMES[name]}.{suffix}"
        if not has(gname):
            return None
        w = tensor(gname)
        if cfg.architecture == "llama" and name in ("q", "k"):
            w = unpermute_rope_rows(w, cfg.num_heads if name == "q" else cfg.num_kv_heads)
        return w

    return cfg, assemble_params(cfg, read, dtype), Tokenizer.from_gguf(fields)
