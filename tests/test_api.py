"""The public API (jaxspec's top-level names, the drafters and the Drafter protocol) carries type hints:
every parameter and every return is annotated, so editors and type checkers can follow it (py.typed)."""
from __future__ import annotations

import inspect

import jaxspec
import jaxspec.drafters as drafters


def _unannotated(fn, name: str) -> list[str]:
    sig = inspect.signature(fn)
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    missing = [f"{name}({p})" for p, v in sig.parameters.items()
               if p not in ("self", "cls") and v.kind not in skip and v.annotation is inspect.Parameter.empty]
    if sig.return_annotation is inspect.Signature.empty and not name.endswith("__init__"):
        missing.append(f"{name} -> ?")
    return missing


def _public(cls) -> dict:
    """A class's own public methods (with __init__), classmethods and staticmethods included."""
    return {n: getattr(cls, n) for n, f in vars(cls).items()
            if (n == "__init__" or not n.startswith("_")) and (callable(f) or isinstance(f, (classmethod, staticmethod)))}


def test_public_functions_and_drafter_methods_carry_type_hints():
    missing = []
    for name in jaxspec.__all__ + ["enable_compilation_cache"]:
        obj = getattr(jaxspec, name)
        if inspect.isfunction(obj):
            missing += _unannotated(obj, name)
    for name in drafters.__all__:
        obj = getattr(drafters, name)
        if inspect.isfunction(obj):
            missing += _unannotated(obj, name)
        elif name != "Context":                   # a NamedTuple: its fields are annotated by construction
            missing += [m for n, f in _public(obj).items() for m in _unannotated(f, f"{name}.{n}")]
    missing += [m for n, f in _public(jaxspec.Model).items() for m in _unannotated(f, f"Model.{n}")]
    assert len(missing) == 0, missing
