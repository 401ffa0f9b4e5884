"""Per-row gathers and scatters: each row b reads or writes its own slots idx[b].

Two ways to write them, chosen when a program is traced (decode/programs.compiled sets over_devices
for a program whose arguments lie on a mesh):
- one device: `x[arange(B)[:, None], idx]`, explicit row indices. XLA:CPU scatters these in place
  (a 30-layer cache write: 0.03 ms).
- rows over devices: vmap over rows, so the row axis is a batching dimension of the gather or
  scatter. With explicit row indices XLA's SPMD partitioner cannot tell that row b's slots live on
  row b's device and gathers indices and values from every device (4-6 collectives per gather or
  scatter, in every layer of every step); on XLA:CPU those ran concurrently on the shared intra-op
  threads and blocked them all (the (data 4, model 2) deadlock of sharded adaptive EAGLE). Batched,
  they need no collective; but XLA:CPU does not scatter them in place (the same cache write: 19 ms),
  so a single device keeps the explicit form.

Indexing follows jnp's: a gather clamps slots past the end; a scatter drops them.
"""
from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp

_OVER_DEVICES = contextvars.ContextVar("rows_over_devices", default=False)


@contextlib.contextmanager
def over_devices(on: bool = True):
    """Trace the per-row gathers and scatters of this block for rows spread over devices (batched)."""
    token = _OVER_DEVICES.set(on)
    try:
        yield
    finally:
        _OVER_DEVICES.reset(token)


def _rows(B: int, idx_ndim: int):
    return jnp.arange(B).reshape((B,) + (1,) * (idx_ndim - 1))


def gather(x: jax.Array, idx: jax.Array, axis: int = 0, lead: tuple = ()) -> jax.Array:
    """x [*lead, *A, B, S, *R] (B at len(lead) + axis), idx int32[B, *I] -> [*A, B, *I, *R]: row b's
    slots idx[b]. lead: indices taken first on x's leading axes (a layer)."""
    at = (slice(None),) * axis
    if _OVER_DEVICES.get():
        x = x[lead] if lead else x
        return jax.vmap(lambda xb, ib: xb[at + (ib,)], in_axes=(axis, 0), out_axes=axis)(x, idx)
    return x[lead + at + (_rows(idx.shape[0], idx.ndim), idx)]


def scatter(x: jax.Array, idx: jax.Array, values: jax.Array, axis: int = 0, lead: tuple = ()) -> jax.Array:
    """x [*lead, *A, B, S, *R] with values [*A, B, *I, *R] written at row b's slots idx[b] (int32[B, *I])
    of x[lead]; slots past the end are dropped."""
    values = values.astype(x.dtype)
    if _OVER_DEVICES.get():
        at = (slice(None),) * axis
        one = lambda xb, ib, vb: xb.at[lead + at + (ib,)].set(vb, mode="drop")
        return jax.vmap(one, in_axes=(len(lead) + axis, 0, axis), out_axes=len(lead) + axis)(x, idx, values)
    return x.at[lead + (slice(None),) * axis + (_rows(idx.shape[0], idx.ndim), idx)].set(values, mode="drop")
