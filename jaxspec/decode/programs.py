"""The compiled-program cache: each (stage, static settings, argument shapes) is compiled once (AOT),
kept least recently used first, and bounded. TRACES counts how often each stage was traced (the
compile guards in the tests read it)."""
from __future__ import annotations

import collections
import functools
import time

import jax

from ..status import working

TRACES: collections.Counter = collections.Counter()  # program name -> times traced (compile guard)
# Bounded: XLA CPU maps ~1,500 memory regions per program of a 30-layer model (one per kernel of the
# unrolled layers); a process may hold 65,530.
MAX_PROGRAMS = 24
_PROGRAMS: collections.OrderedDict = collections.OrderedDict()


def compiled(tag: tuple, fn, static: dict, args: tuple, donate: tuple, what: str = ""):
    """AOT-compile fn for these argument shapes once; -> (executable, seconds spent compiling now).

    tag names everything static that changes the program (hashable); static are fn's keyword args;
    what: the program in words, for the status line a long compile shows (jaxspec/status.py)."""
    shapes = tuple((a.shape, a.dtype, _placement(a)) for a in jax.tree_util.tree_leaves(args))
    key = (tag, shapes)
    if key in _PROGRAMS:
        _PROGRAMS.move_to_end(key)
        return _PROGRAMS[key], 0.0
    start = time.perf_counter()
    jitted = jax.jit(functools.partial(fn, **static), donate_argnums=donate)
    kept = "cached for next time" if jax.config.jax_compilation_cache_dir else ""
    with working(f"compiling {what or tag[0]}", kept):
        exe = jitted.lower(*args).compile()
    _PROGRAMS[key] = exe
    while len(_PROGRAMS) > MAX_PROGRAMS:
        _PROGRAMS.popitem(last=False)
    return exe, time.perf_counter() - start


def _placement(a):
    """A mesh placement changes the program (jaxspec/sharding.py); single-device arrays all compile alike."""
    s = getattr(a, "sharding", None)
    return s if isinstance(s, jax.sharding.NamedSharding) else None


def held() -> int:
    """How many compiled programs the cache holds."""
    return len(_PROGRAMS)


def clear() -> None:
    """Drop every compiled program (each holds its memory maps until dropped)."""
    _PROGRAMS.clear()
