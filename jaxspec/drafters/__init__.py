"""Drafters: one protocol (base.Drafter), several ways to guess the next K tokens."""
from __future__ import annotations

from ..model import Model
from .base import Context, Drafter
from .draft_model import DraftModel, truncated
from .eagle import Eagle
from .mtp import MTP
from .ngram import NGram
from .suffix import Suffix, SuffixConfig

__all__ = ["Context", "Drafter", "DraftModel", "Eagle", "MTP", "NGram", "Suffix", "SuffixConfig", "shipped",
           "shipped_kinds", "truncated"]


SHIPPED_KINDS = ("suffix", "eagle", "mtp", "draft")


def shipped_kinds(model: Model | str) -> list:
    """The kinds of drafter shipped for a model (a Model or its name), in SHIPPED_KINDS' order."""
    from ..paths import shipped_head
    source = model if isinstance(model, str) else model.source
    found = []
    for kind in SHIPPED_KINDS:
        try:
            shipped_head(source, "data" if kind == "suffix" else kind)
            found.append(kind)
        except ValueError:
            pass
    return found


def shipped(model: Model | str, kind: str) -> Drafter:
    """The drafter trained here for a model (a Model or its name): kind "eagle", "mtp" or "draft",
    from checkpoints/<model name>/<kind> (jaxspec.paths.shipped_head); "suffix": suffix decoding over
    the answers in checkpoints/<model name>/data."""
    from ..paths import shipped_head

    loaders = {"eagle": Eagle.load, "mtp": MTP.load, "draft": DraftModel.load, "suffix": None}
    if kind not in loaders:
        raise ValueError(f"kind must be one of {sorted(loaders)}, got {kind!r}")
    source = model if isinstance(model, str) else model.source
    if kind == "suffix":
        return Suffix.from_data(shipped_head(source, "data"))
    return loaders[kind](shipped_head(source, kind))
