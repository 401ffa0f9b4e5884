"""Whole FLOP counts of programs with loops. XLA's cost analysis counts a loop's body once, whatever its
trip count, so a profile compiles its programs a second time inside `counting()`, where the scans that
training runs (the stacked layers of a model under training, the chunks of a loss) are unrolled, and
reads the FLOPs of that copy; the timed program keeps its loops.
"""
from __future__ import annotations

import contextlib
import contextvars

_COUNTING = contextvars.ContextVar("jaxspec_counting_flops", default=False)


@contextlib.contextmanager
def counting():
    """Trace every scan that asks `scan_unroll()` fully unrolled inside this block."""
    token = _COUNTING.set(True)
    try:
        yield
    finally:
        _COUNTING.reset(token)


def scan_unroll() -> int | bool:
    """The `unroll` argument of jax.lax.scan: True (every iteration laid out) inside counting(), else 1."""
    return True if _COUNTING.get() else 1
