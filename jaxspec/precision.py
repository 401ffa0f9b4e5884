"""Matmul operand precision, chosen when a function is traced.

By default every weight matmul is `jnp.einsum` on its operands as given (float32 decoding on a CPU:
a bfloat16 matrix-vector product there is several times slower). Inside `bf16_operands()` (training),
`einsum` casts both operands to bfloat16 and accumulates in float32, in the forward pass and in the
two matmuls of its backward pass (a custom VJP: JAX's own transpose would run those in float32).
CPUs with AMX-BF16, GPUs and TPUs run such matmuls several times faster than float32 ones.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp

_BF16 = contextvars.ContextVar("jaxspec_bf16_operands", default=False)


@contextlib.contextmanager
def bf16_operands(on: bool = True):
    """Trace the matmuls of `einsum` with bfloat16 operands and float32 accumulation inside this block."""
    token = _BF16.set(bool(on))
    try:
        yield
    finally:
        _BF16.reset(token)


def einsum(spec: str, a: jax.Array, b: jax.Array, preferred_element_type=None) -> jax.Array:
    """jnp.einsum(spec, a, b) of two operands; under bf16_operands() with bfloat16 operands (the result
    in a's and b's common dtype, accumulated in float32, or in preferred_element_type when given)."""
    if not _BF16.get():
        return jnp.einsum(spec, a, b, preferred_element_type=preferred_element_type)
    out_dtype = preferred_element_type or jnp.result_type(a, b)
    return _einsum16(spec, a, b).astype(out_dtype)


def project(x: jax.Array, w: jax.Array, spec: str = "ne,ev->nv") -> jax.Array:
    """x [..., E] times a weight matrix -> float32 [..., V]: w [E, V] (spec "ne,ev->nv") or [V, E]
    ("ne,ve->nv"), the leading axes of x flattened into one."""
    out = einsum(spec, x.reshape(-1, x.shape[-1]), w, preferred_element_type=jnp.float32)
    return out.reshape(x.shape[:-1] + out.shape[-1:])


def _check(spec: str) -> tuple[str, str, str]:
    ins, out = spec.replace(" ", "").split("->")
    sa, sb = ins.split(",")
    if "." in spec or any(c not in sb + out for c in sa) or any(c not in sa + out for c in sb):
        raise ValueError(f"bf16 einsum needs explicit indices, each in two of its three terms: {spec!r}")
    return sa, sb, out


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _einsum16(spec, a, b):
    """float32 result of spec over bfloat16 copies of a and b."""
    _check(spec)
    return jnp.einsum(spec, a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), preferred_element_type=jnp.float32)


def _einsum16_fwd(spec, a, b):
    return _einsum16(spec, a, b), (a, b)


def _einsum16_bwd(spec, residuals, g):
    """d/da and d/db as two more bfloat16 matmuls with float32 accumulation (a frozen operand's gradient
    is never used, and XLA drops its matmul)."""
    a, b = residuals
    sa, sb, out = _check(spec)
    g16 = g.astype(jnp.bfloat16)
    da = jnp.einsum(f"{out},{sb}->{sa}", g16, b.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
    db = jnp.einsum(f"{sa},{out}->{sb}", a.astype(jnp.bfloat16), g16, preferred_element_type=jnp.float32)
    return da.astype(a.dtype), db.astype(b.dtype)


_einsum16.defvjp(_einsum16_fwd, _einsum16_bwd)
