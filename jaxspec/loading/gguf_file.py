"""Read a Llama/Qwen2 GGUF file: config, dequantized float params and tokenizer."""
from __future__ import annotations

import os

import gguf
import numpy as np

from ..config import ModelConfig
from ..tokenizer import Tokenizer
from .weights import assemble_params

_LAYER_NAMES = {"attn_norm": "attn_norm", "q": "attn_q", "k": "attn_k", "v": "attn_v",
                "o": "attn_output", "bq": "attn_q", "bk": "attn_k", "bv": "attn_v",
                "mlp_norm": "ffn_norm", "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}
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
    """-> (ModelConfig, params, Tokenizer). Raises ValueError for files that are not readable GGUF."""
    if not os.path.isfile(path):
        raise ValueError(f"model file not found: {path}")
    try:
        reader = gguf.GGUFReader(path)
        fields = read_fields(reader)
    except Exception as e:  # the gguf package raises assorted errors on bad bytes
        raise ValueError(f"cannot read GGUF file {path}: {e}") from e
    cfg = ModelConfig.from_gguf(fields)
    tensors = {t.name: t for t in reader.tensors}
    tied = "output.weight" not in tensors
    cfg = ModelConfig(**{**cfg.__dict__, "tie_word_embeddings": tied})

    def read(name, layer):
        if layer is None:
            gname = _GLOBAL_NAMES[name]
        else:
            suffix = "bias" if name in ("bq", "bk", "bv") else "weight"
            gname = f"blk.{layer}.{_LAYER_NAMES[name]}.{suffix}"
        t = tensors.get(gname)
        if t is None:
            return None
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as e:
            raise ValueError(f"cannot dequantize {gname} in {path}: {e}") from e
        w = np.asarray(w, np.float32).reshape(tuple(int(n) for n in reversed(t.shape)))
        if cfg.architecture == "llama" and name in ("q", "k"):
            w = unpermute_rope_rows(w, cfg.num_heads if name == "q" else cfg.num_kv_heads)
        return w

    params = assemble_params(cfg, read, dtype)
    tokenizer = Tokenizer.from_gguf(fields)
    return cfg, params, tokenizer
