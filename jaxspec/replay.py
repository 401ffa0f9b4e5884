"""Replay a deterministic drafter over recorded greedy answers, without the target: at each step the
drafter sees the answer so far, its K drafts are kept up to the first that differs from the recorded
next tokens, and the row moves on by the kept drafts plus one. On the target's own greedy answers
this is the accepted length greedy speculative decoding would measure (the loop emits exactly those
tokens). For drafters that read only the history (NGram, Suffix).

Shapes: B rows, S slots (prompt + answer), K drafts, C drafter contexts.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from .drafters.base import Context, Drafter


@dataclasses.dataclass
class ReplayResult:
    """steps and tokens per row; accepted and trials (drafts up to the first rejection) per context."""

    steps: np.ndarray
    tokens: np.ndarray
    accepted: np.ndarray
    trials: np.ndarray

    @property
    def mean_accepted_length(self) -> float:
        return float(self.tokens.sum() / max(self.steps.sum(), 1))

    def per_context(self) -> np.ndarray:
        """Per-token acceptance per context (nan where never seen)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.accepted / self.trials


def _step(drafter: Drafter, num_draft: int):
    """One replay step of every row: carry (pos, steps int32[B], accepted, trials int32[C])."""
    def step(params, carry, seqs, ends):
        pos, steps, acc_c, trial_c = carry
        B, S = seqs.shape
        ctx = Context(last=seqs[jnp.arange(B), pos - 1], history=seqs, history_len=pos, sampling={},
                      features=jnp.zeros((0, B, 1, 1), jnp.float32))
        context = drafter.context(params, (), ctx)
        drafts = drafter.propose(params, (), ctx, jax.random.key(0), num_draft)[0]
        slots = pos[:, None] + jnp.arange(num_draft)
        truth = seqs[jnp.arange(B)[:, None], jnp.minimum(slots, S - 1)]
        kept = jnp.cumprod((drafts == truth) & (slots < ends[:, None]), axis=1).sum(1)
        live = pos < ends
        tried = jnp.where(kept < num_draft, kept + 1, kept)
        acc_c = acc_c.at[context].add(jnp.where(live, kept, 0))
        trial_c = trial_c.at[context].add(jnp.where(live, tried, 0))
        return (jnp.where(live, jnp.minimum(pos + kept + 1, ends), pos), steps + live, acc_c, trial_c)
    return step


def replay(drafter: Drafter, sequences: list, prompt_lengths: list, num_draft: int, batch: int = 64,
           model=None) -> ReplayResult:
    """Replay `drafter` with K = num_draft over sequences (prompt + greedy answer token ids). As in the loop,
    the answer's first token comes from the prompt pass and the drafting starts after it. model: what
    drafter.params_for needs (None for NGram and Suffix)."""
    params = drafter.params_for(model)
    C = len(drafter.prior_acceptance)
    order = np.argsort([len(s) for s in sequences])
    steps, tokens = np.zeros(len(sequences), np.int64), np.zeros(len(sequences), np.int64)
    acc, trials = np.zeros(C), np.zeros(C)
    step = _step(drafter, num_draft)

    @jax.jit
    def run(params, seqs, starts, ends):
        zeros = jnp.zeros(C, jnp.int32)
        carry = (starts, jnp.zeros_like(starts), zeros, zeros)
        return jax.lax.while_loop(lambda c: jnp.any(c[0] < ends), lambda c: step(params, c, seqs, ends), carry)

    for i in range(0, len(order), batch):
        rows = order[i:i + batch]
        S = 1 << (max(len(sequences[r]) for r in rows) - 1).bit_length()
        seqs = np.zeros((batch, S), np.int32)
        starts, ends = np.ones(batch, np.int32), np.ones(batch, np.int32)   # padding rows: already done
        for j, r in enumerate(rows):
            seqs[j, :len(sequences[r])] = sequences[r]
            starts[j], ends[j] = min(prompt_lengths[r] + 1, len(sequences[r])), len(sequences[r])
        pos, n_steps, a, t = jax.device_get(run(params, seqs, starts, ends))
        steps[rows], tokens[rows] = n_steps[:len(rows)], (ends - starts)[:len(rows)]
        acc += a
        trials += t
    return ReplayResult(steps, tokens, acc, trials)
