"""Drafters: one protocol (base.Drafter), several ways to guess the next K tokens."""
from .base import Context, Drafter
from .draft_model import DraftModel, truncated
from .eagle import Eagle
from .mtp import MTP
from .ngram import NGram

__all__ = ["Context", "Drafter", "DraftModel", "Eagle", "MTP", "NGram", "truncated"]
