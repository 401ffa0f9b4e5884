"""jaxspec.load: a named model, a .gguf file, or a Hugging Face model folder -> Model."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from ..model import Model
from .gguf_file import load_gguf
from .hf_dir import load_hf_dir
from .registry import NAMED_MODELS, resolve_named

__all__ = ["load", "NAMED_MODELS"]


def default_dtype() -> jnp.dtype:
    """bfloat16 on GPU and TPU (weights, activations and KV cache), float32 on the CPU."""
    return jnp.bfloat16 if jax.default_backend() in ("gpu", "cuda", "rocm", "tpu") else jnp.float32


def load(name_or_path: str, *, dtype: jnp.dtype | None = None) -> Model:
    """Load a model: a name from NAMED_MODELS, a .gguf path, or a folder (config.json + safetensors).
    dtype: the weights' (and so the activations' and cache's) type; None: default_dtype()."""
    dtype = default_dtype() if dtype is None else dtype
    if not isinstance(name_or_path, (str, os.PathLike)) or not str(name_or_path):
        raise ValueError(f"load() needs a model name or path, got {name_or_path!r}")
    source = str(name_or_path)
    if source in NAMED_MODELS:
        cfg, params, tok = load_gguf(resolve_named(source), dtype)
    elif os.path.isdir(source):
        ggufs = [f for f in os.listdir(source) if f.endswith(".gguf")]
        if os.path.isfile(os.path.join(source, "config.json")):
            cfg, params, tok = load_hf_dir(source, dtype)
        elif len(ggufs) == 1:
            cfg, params, tok = load_gguf(os.path.join(source, ggufs[0]), dtype)
        else:
            raise ValueError(f"{source} is neither a Hugging Face model folder (config.json) "
                             "nor a folder holding one .gguf file")
    elif os.path.isfile(source):
        if not source.endswith(".gguf"):
            raise ValueError(f"{source}: expected a .gguf file or a model folder")
        cfg, params, tok = load_gguf(source, dtype)
    elif source.endswith(".gguf") or os.sep in source:
        raise ValueError(f"model file not found: {source}")
    else:
        resolve_named(source)  # raises: unknown name, listing the known ones
    return Model(config=cfg, params=params, tokenizer=tok, source=source)
