"""jaxspec/precision.py: float32 matmuls by default; bfloat16 operands with float32 accumulation, forward
and backward, inside bf16_operands()."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import precision

SPECS = ["bte,ef->btf", "btk,ke->bte", "nbte,nef->btf", "btc,chd->bthd", "ne,ve->nv"]
SHAPES = {"b": 2, "t": 3, "e": 8, "f": 5, "k": 6, "n": 3, "c": 4, "h": 2, "d": 3, "v": 7}


def _operands(spec: str, seed: int = 0):
    sa, sb = spec.split("->")[0].split(",")
    ka, kb = jax.random.split(jax.random.PRNGKey(seed))
    return (jax.random.normal(ka, tuple(SHAPES[c] for c in sa)), jax.random.normal(kb, tuple(SHAPES[c] for c in sb)))


def _round(x):
    return x.astype(jnp.bfloat16).astype(jnp.float32)


@pytest.mark.parametrize("spec", SPECS)
def test_default_is_plain_einsum_and_bf16_rounds_only_the_operands(spec):
    a, b = _operands(spec)
    np.testing.assert_array_equal(precision.einsum(spec, a, b), jnp.einsum(spec, a, b))
    with precision.bf16_operands():
        out = precision.einsum(spec, a, b)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, jnp.einsum(spec, _round(a), _round(b)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", SPECS)
def test_gradients_are_the_rounded_operands_products(spec):
    """d/da sum(w * einsum(a, b)) = the transposed einsum of w and round(b), and likewise for b: the
    backward's matmuls take bfloat16 operands (w rounded too), accumulating in float32."""
    a, b = _operands(spec, 1)
    w = jax.random.normal(jax.random.PRNGKey(2), jnp.einsum(spec, a, b).shape)

    def loss(a, b):
        with precision.bf16_operands():
            return jnp.sum(w * precision.einsum(spec, a, b))

    da, db = jax.grad(loss, argnums=(0, 1))(a, b)
    rounded = lambda a, b: jnp.sum(_round(w) * jnp.einsum(spec, a, b))
    ref_a, ref_b = jax.grad(rounded, argnums=(0, 1))(_round(a), _round(b))
    np.testing.assert_allclose(da, ref_a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db, ref_b, rtol=1e-5, atol=1e-5)
    exact = jax.grad(lambda a, b: jnp.sum(w * jnp.einsum(spec, a, b)), argnums=(0, 1))(a, b)
    assert 0 < float(jnp.max(jnp.abs(da - exact[0]))) < 0.1         # bfloat16's rounding, not another formula


def test_backward_matmuls_run_on_bfloat16_operands():
    a, b = _operands("bte,ef->btf")

    def loss(a, b):
        with precision.bf16_operands():
            return jnp.sum(precision.einsum("bte,ef->btf", a, b) ** 2)

    hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(a, b).as_text()
    dots = re.findall(r"stablehlo.dot_general.*", hlo)
    assert len(dots) == 3 and all("bf16" in d.split("->")[0] for d in dots), dots


def test_specs_it_cannot_transpose_are_refused():
    a, b = jnp.ones((2, 3)), jnp.ones((3, 4))
    with precision.bf16_operands(), pytest.raises(ValueError, match="explicit indices"):
        precision.einsum("...e,ev->...v", a, b)
    with precision.bf16_operands(), pytest.raises(ValueError, match="explicit indices"):
        precision.einsum("ae,ev->v", a, b)                         # a summed over in one operand alone
