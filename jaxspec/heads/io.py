"""Shipped heads on disk: params.safetensors (flattened pytree) + head.json (kind, config, metadata)."""
from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
from safetensors.flax import load_file, save_file

from ..paths import plain_file, stored

PARAMS, META = "params.safetensors", "head.json"


def save_head(path: str, kind: str, config: dict, params: dict, metadata: dict, dtype=jnp.bfloat16) -> None:
    """Write a head; float arrays are stored as `dtype` (bfloat16 keeps shipped heads small)."""
    os.makedirs(path, exist_ok=True)
    flat = {k: (v.astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v) for k, v in params.items()}
    save_file(flat, os.path.join(path, PARAMS))
    with open(os.path.join(path, META), "w") as f:
        json.dump({"kind": kind, "config": config, "metadata": metadata}, f, indent=1, default=_plain)


def _plain(x):
    if isinstance(x, (np.integer, np.floating)):
        return x.item()
    if isinstance(x, tuple):
        return list(x)
    raise TypeError(f"cannot store {type(x).__name__} in head.json")


def head_folder(path: str, kind: str) -> str:
    """A head's folder: `path` itself, or for a named model (jaxspec.load's names) the head shipped
    for it (paths.shipped_head). ValueError when neither exists."""
    from ..loading.registry import NAMED_MODELS
    from ..paths import shipped_head

    if os.path.isdir(path):
        return path
    if path in NAMED_MODELS:
        return shipped_head(path, kind)
    raise ValueError(f"{kind} head not found: {os.path.abspath(path)} is not a folder (give a head's folder, "
                     f"or a model name for its shipped head: {', '.join(sorted(NAMED_MODELS))})")


def load_head(path: str, kind: str, dtype=jnp.float32) -> tuple[dict, dict, dict]:
    """path: a head's folder or a named model (head_folder) -> (config dict, params, metadata);
    ValueError for a missing, truncated or foreign head."""
    path = head_folder(path, kind)
    meta_path, params_path = os.path.join(path, META), os.path.join(path, PARAMS)
    if not os.path.isfile(meta_path) or stored(params_path) is None:
        raise ValueError(f"{path} is not a {kind} head: it needs {META} and {PARAMS} (or {PARAMS}.xz)")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        with plain_file(params_path) as file:
            params = load_file(file)
    except Exception as e:
        raise ValueError(f"cannot read the {kind} head in {path} (corrupt or truncated?): {e}") from e
    if meta.get("kind") != kind:
        raise ValueError(f"{path} holds a {meta.get('kind')!r} head, not {kind!r}")
    params = {k: (v.astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v) for k, v in params.items()}
    return meta["config"], params, meta.get("metadata", {})
