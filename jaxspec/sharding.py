"""Sharding over a jax.sharding.Mesh with axes ("data", "model"): rows over "data", weights over "model".

generate(..., mesh=...) places the target's and the drafter's arrays with these rules and the batch
(prompts, KV caches, per-row state) over "data"; jit then compiles the same loops for the placed
arrays (GSPMD inserts the collectives), so there is no host round-trip per step. Several hosts
(jax.distributed.initialize() first): every process calls generate with the same prompts on a mesh
of the global devices; each device computes its rows, and every process gets all the outputs
(to_host). Step costs are process 0's (agreed), so all processes run the same program.

Partition rules, by array name (models/llama.py layout; heads use the same names; a leading layer
axis L of stacked weights stays whole):
  embed [V, E] and lm_head [E, V]: the vocabulary V over "model";
  wq [E, H, D], wo [H, D, E], bq [H, D]: query heads H over "model";
  wk, wv [E, G, D], bk, bv [G, D]: key/value heads G over "model";
  w_gate, w_up [E, F], w_down [F, E]: the MLP width F over "model";
  KV caches k, v [L, B, S, G, D]: rows B over "data", G over "model"; every other row array [B, ...]
  over "data".
A dimension that the axis size does not divide is replicated instead: SmolLM2's 9 query and 3
key/value heads on 2, 4 or 8 "model" devices (its widths 576 and 1536 and its vocabulary 49152 do
divide), a batch that "data" does not divide. Norms, biases of replicated heads, the heads' own
matrices under other names (EAGLE's fc, MTP's proj) and scalars are replicated.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = ("data", "model")

# name -> the axis split over "model", counted from the end (a stacked L axis may come first)
_MODEL_AXIS = {"embed": -2, "lm_head": -1, "wq": -2, "wo": -3, "bq": -2, "wk": -2, "wv": -2, "bk": -2, "bv": -2,
               "w_gate": -1, "w_up": -1, "w_down": -2}


def make_mesh(data: int | None = None, model: int = 1, devices=None) -> Mesh:
    """A ("data", "model") mesh of data * model devices (data None: every device over model's)."""
    devices = list(jax.devices() if devices is None else devices)
    if model < 1 or len(devices) % model:
        raise ValueError(f"a model axis of {model} does not divide {len(devices)} devices")
    data = len(devices) // model if data is None else data
    if data < 1 or data * model > len(devices):
        raise ValueError(f"a mesh of data={data} x model={model} needs {data * model} devices; "
                         f"there are {len(devices)}")
    return Mesh(np.asarray(devices[:data * model]).reshape(data, model), AXES)


def parse_mesh(text: str) -> Mesh:
    """'data=4,model=2' (either may be left out: 1) -> make_mesh(4, 2)."""
    sizes = {"data": 1, "model": 1}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, value = part.partition("=")
        if name not in sizes or not value.isdigit() or int(value) < 1:
            raise ValueError(f"--mesh takes data=D,model=M with positive integers, got {text!r}")
        sizes[name] = int(value)
    return make_mesh(sizes["data"], sizes["model"])


def _divides(mesh: Mesh, axis: str, size: int) -> str | None:
    return axis if size % mesh.shape[axis] == 0 else None


def param_spec(name: str, shape: tuple, mesh: Mesh) -> P:
    """The PartitionSpec of one weight array by its name (module docstring)."""
    spec = [None] * len(shape)
    at = _MODEL_AXIS.get(name)
    if at is not None and len(shape) >= -at:
        spec[at] = _divides(mesh, "model", shape[at])
    return P(*spec)


def _name(path) -> str:
    keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
    keys = [k for k in keys if isinstance(k, str) and k not in ("value", "raw_value")]
    return keys[-1] if keys else ""


def shard_params(params, mesh: Mesh):
    """Every array of a params pytree (a model's, a drafter's params_for) placed by param_spec."""
    def place(path, x):
        if not hasattr(x, "shape"):
            return x
        return jax.device_put(x, NamedSharding(mesh, param_spec(_name(path), x.shape, mesh)))
    return jax.tree_util.tree_map_with_path(place, params)


def row_sharding(x, mesh: Mesh) -> NamedSharding:
    """Rows (axis 0) over "data" when it divides them; the rest replicated."""
    if getattr(x, "ndim", 0) == 0:
        return NamedSharding(mesh, P())
    return NamedSharding(mesh, P(_divides(mesh, "data", x.shape[0]), *[None] * (x.ndim - 1)))


def shard_rows(tree, mesh: Mesh):
    """Every array of a pytree placed by row_sharding (prompts, lengths, per-row sampling, ...)."""
    return jax.tree_util.tree_map(lambda x: jax.device_put(x, row_sharding(x, mesh)), tree)


def shard_cache(cache, mesh: Mesh):
    """A KVCache: k, v [L, B, S, G, D] with B over "data" and G over "model" (where they divide), length over "data"."""
    B, G = cache.k.shape[1], cache.k.shape[3]
    kv = NamedSharding(mesh, P(None, _divides(mesh, "data", B), None, _divides(mesh, "model", G), None))
    return cache._replace(k=jax.device_put(cache.k, kv), v=jax.device_put(cache.v, kv),
                          length=jax.device_put(cache.length, row_sharding(cache.length, mesh)))


def to_host(x) -> np.ndarray:
    """A result array as numpy on this process, gathered from the other processes' devices when a
    mesh spans several (jax.distributed); every process gets the whole array."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def agreed(x) -> np.ndarray:
    """Process 0's value of a host array on every process (jax.distributed; one process: x): what
    each process measured alone (step costs) must not send their loops different ways."""
    if jax.process_count() == 1:
        return np.asarray(x)
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(x)))


def describe(mesh: Mesh | None) -> dict:
    """What bench reports: the mesh's axis sizes and the device kind."""
    device = jax.devices()[0]
    return {"mesh": dict(mesh.shape) if mesh is not None else None, "device_kind": device.device_kind,
            "platform": device.platform, "devices": jax.device_count(), "processes": jax.process_count()}
