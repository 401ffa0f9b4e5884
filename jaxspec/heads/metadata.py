"""HeadMetadata: what train/ writes beside a trained drafter and the drafters read back.

On disk it is the "metadata" object of head.json (EAGLE, MTP) or draft.json (draft model).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class HeadMetadata:
    """The contract between train/ and jaxspec's drafters.

    target / target_fingerprint: the model trained for (Model.source, Model.fingerprint); a drafter
    refuses another fingerprint. hidden_layers: target layers whose hidden states the head reads.
    draft_vocab_size: rows of its output (None: the full vocabulary). heldout_acceptance: the last
    held-out measurement {"step", "mean_accepted_length", "per_position_acceptance"[K]} (K = 5,
    greedy), None if not measured. data / training: how it was made (free-form, for people)."""

    target: str | None = None
    target_fingerprint: str | None = None
    hidden_layers: tuple[int, ...] = ()
    draft_vocab_size: int | None = None
    heldout_acceptance: dict | None = None
    data: dict = field(default_factory=dict)
    training: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict | None) -> "HeadMetadata":
        """From head.json's "metadata"; ValueError for keys this version does not know."""
        d = dict(d or {})
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown head metadata keys {sorted(unknown)}")
        if "hidden_layers" in d:
            d["hidden_layers"] = tuple(d["hidden_layers"])
        return cls(**d)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def first_draft_acceptance(self) -> float | None:
        """Held-out acceptance of the first draft, None if not measured."""
        per_position = (self.heldout_acceptance or {}).get("per_position_acceptance")
        return float(per_position[0]) if per_position else None

    @property
    def mean_accepted_length(self) -> float | None:
        return (self.heldout_acceptance or {}).get("mean_accepted_length")

    def check_target(self, kind: str, model) -> None:
        """ValueError unless this head was trained for `model`'s weights (when recorded)."""
        if self.target_fingerprint and self.target_fingerprint != model.fingerprint:
            raise ValueError(f"{kind} head was trained for target {self.target!r} "
                             f"(weights {self.target_fingerprint}), not for this model (weights {model.fingerprint})")


def head_metadata(metadata, hidden_layers: tuple, draft_vocab_size: int | None) -> HeadMetadata:
    """HeadMetadata from a HeadMetadata, dict or None, with the head's own layers and draft
    vocabulary filled in; ValueError if the recorded ones disagree with the head."""
    meta = metadata if isinstance(metadata, HeadMetadata) else HeadMetadata.from_dict(metadata)
    for name, have in (("hidden_layers", tuple(hidden_layers)), ("draft_vocab_size", draft_vocab_size)):
        recorded = getattr(meta, name)
        if recorded not in ((), None) and recorded != have:
            raise ValueError(f"head metadata says {name} {recorded}, the head has {have}")
    return dataclasses.replace(meta, hidden_layers=tuple(hidden_layers), draft_vocab_size=draft_vocab_size)
