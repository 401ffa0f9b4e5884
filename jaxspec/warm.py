"""Warm starts: JAX's persistent compilation cache and a cache of dequantized GGUF weights, both under
paths.cache_dir() ($JAXSPEC_CACHE, else ~/.cache/jaxspec), so a second process skips compiling the
programs it already compiled and reads float weights instead of dequantizing. $JAXSPEC_WARM_START=0
turns both off; a compilation cache folder the user set for JAX is left as it is."""
from __future__ import annotations

import hashlib
import json
import os

import jax
import numpy as np

from . import paths

WARM_ENV = "JAXSPEC_WARM_START"


def enabled() -> bool:
    return os.environ.get(WARM_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def enable_compilation_cache() -> str | None:
    """Point JAX's persistent compilation cache at cache_dir()/xla (unless off, or already set). -> the folder."""
    if not enabled():
        return None
    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    folder = os.path.join(paths.cache_dir(), "xla")
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    return folder


def _folder(path: str) -> str:
    st = os.stat(path)
    key = hashlib.sha256(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:20]
    return os.path.join(paths.cache_dir(), "weights", key)


def read_weights(path: str):
    """The cached (fields, {tensor name: float32 array}) of a GGUF file, or None (none yet, or off)."""
    if not enabled():
        return None
    folder = _folder(path)
    try:
        from safetensors.numpy import load_file
        with open(os.path.join(folder, "fields.json")) as f:
            fields = json.load(f)
        return fields, load_file(os.path.join(folder, "params.safetensors"))
    except (OSError, ValueError):
        return None


def write_weights(path: str, fields: dict, tensors: dict) -> None:
    """Keep a GGUF file's fields and dequantized tensors for the next process (a failure only warns)."""
    if not enabled():
        return
    from safetensors.numpy import save_file
    folder = _folder(path)
    try:
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f"params.{os.getpid()}.tmp")
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, tmp)
        with open(os.path.join(folder, "fields.json"), "w") as f:
            json.dump(fields, f, default=_plain)
        os.replace(tmp, os.path.join(folder, "params.safetensors"))
    except OSError as e:
        import warnings
        warnings.warn(f"could not keep dequantized weights in {folder}: {e}", stacklevel=3)


def _plain(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (np.integer, np.floating)):
        return x.item()
    if isinstance(x, (bytes, bytearray)):
        return x.decode("utf-8", "replace")
    raise TypeError(f"cannot keep {type(x).__name__} in fields.json")
