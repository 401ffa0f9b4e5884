"""Training batches of examples with their cached target features.

Examples are grouped by length into buckets T, multiples of bucket_step (one compiled shape each,
little padding); a batch holds
tokens_per_batch // T rows of one bucket (rounded down to a multiple of the device count). The
batch at global step k is a pure function of (seed, k): epoch k // batches_per_epoch shuffles each
bucket and the batch list with a generator seeded by (seed, epoch), so a resumed run sees exactly
the batches an uninterrupted one would.
"""
from __future__ import annotations

import numpy as np

from .data import read_shard, shard_names
from .features import load_features


class FeatureBatches:
    """batch(k) -> {"tokens": int32[B, T], "mask": bool[B, T], "feats": uint16[B, T, N + 1, E]}; without a
    feature folder (feat_dir None: the target runs in the step, train/joint.py) tokens and mask only.

    mask marks the loss positions: t whose next token t + 1 is part of the example, and with
    answer_only those whose first draft (token t + 2) falls in the answer (EAGLE's assistant-only loss).
    pack: also "loss_index" int32[P], the flat positions b*T + t of mask first, -1 after; P rounds their
    count up to a quarter of B*T (at most four shapes per bucket), so losses compute logits there only."""

    def __init__(self, data_dir: str, feat_dir: str | None, tokens_per_batch: int = 4096, rows_multiple: int = 1,
                 seed: int = 0, bucket_step: int = 128, answer_only: bool = False, names: list[str] | None = None,
                 pack: bool = False):
        names = shard_names(data_dir) if names is None else names
        feats = load_features(feat_dir, names) if feat_dir else [None] * len(names)
        self.seqs, self.where, self.first_loss, self.prompt_lengths = [], [], [], []
        for shard, name in zip(feats, names):
            seqs, prompt_lengths = read_shard(data_dir, name)
            start = 0
            for s, p in zip(seqs, prompt_lengths):
                self.seqs.append(s)
                self.prompt_lengths.append(int(p))
                self.where.append((shard, start))
                self.first_loss.append(max(0, p - 2) if answer_only else 0)
                start += len(s)
            if shard is not None and start != shard.shape[0]:
                raise ValueError(f"cached features of {name} do not match its tokens: recompute them")
        self.seed, self.rows_multiple, self.pack = seed, rows_multiple, pack
        self.buckets: dict[int, list[int]] = {}
        for i, s in enumerate(self.seqs):
            if len(s) >= 2:
                self.buckets.setdefault(-(-len(s) // bucket_step) * bucket_step, []).append(i)
        self.rows = {T: self._rows(tokens_per_batch, T) for T in self.buckets}
        self.batches_per_epoch = sum(-(-len(ix) // self.rows[T]) for T, ix in self.buckets.items())
        if not self.batches_per_epoch:
            raise ValueError(f"{data_dir} holds no example of two or more tokens")
        self._epoch, self._plan = None, None

    def _rows(self, tokens_per_batch: int, T: int) -> int:
        m = self.rows_multiple
        return max(m, tokens_per_batch // T // m * m)

    def seen(self, steps: int) -> dict:
        """What the batches of steps 0 .. steps - 1 hold, an example counted once per epoch it comes in:
        {"steps", "epochs", "examples", "tokens", "answer_tokens"}."""
        full, part = divmod(steps, self.batches_per_epoch)
        epoch_ix = [i for ix in self.buckets.values() for i in ix]          # the examples of >= 2 tokens
        part_ix = [i for _, rows in self.plan(full)[:part] for i in rows] if part else []
        examples, tokens, answers = (full * self._totals(epoch_ix) + self._totals(part_ix)).tolist()
        return {"steps": steps, "epochs": round(steps / self.batches_per_epoch, 3), "examples": examples,
                "tokens": tokens, "answer_tokens": answers}

    def _totals(self, ix: list[int]) -> np.ndarray:
        """-> int64[3]: examples, tokens and answer tokens of examples ix."""
        lengths = np.array([len(self.seqs[i]) for i in ix], np.int64)
        prompts = np.array([self.prompt_lengths[i] for i in ix], np.int64)
        return np.array([len(ix), lengths.sum(), (lengths - prompts).sum()], np.int64)

    def plan(self, epoch: int) -> list[tuple[int, list[int]]]:
        """The epoch's batches as (bucket T, example indices)."""
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            plan = []
            for T in sorted(self.buckets):
                ix = rng.permutation(self.buckets[T]).tolist()
                plan += [(T, ix[i:i + self.rows[T]]) for i in range(0, len(ix), self.rows[T])]
            self._plan = [plan[i] for i in rng.permutation(len(plan))]
            self._epoch = epoch
        return self._plan

    def batch(self, step: int) -> dict:
        T, ix = self.plan(step // self.batches_per_epoch)[step % self.batches_per_epoch]
        B = self.rows[T]                                          # a short last batch is padded
        shard0 = self.where[ix[0]][0]
        tokens = np.zeros((B, T), np.int32)
        mask = np.zeros((B, T), bool)
        feats = None if shard0 is None else np.zeros((B, T) + shard0.shape[1:], np.uint16)
        for r, i in enumerate(ix):
            s, (shard, start) = self.seqs[i], self.where[i]
            tokens[r, :len(s)] = s
            mask[r, self.first_loss[i]:len(s) - 1] = True
            if feats is not None:
                feats[r, :len(s)] = shard[start:start + len(s)]
        out = {"tokens": tokens, "mask": mask} | ({} if feats is None else {"feats": feats})
        return out | ({"loss_index": loss_index(mask)} if self.pack else {})


def loss_index(mask: np.ndarray) -> np.ndarray:
    """bool[B, T] -> int32[P]: the flat positions where mask holds, then -1; P = their count rounded up
    to a quarter of B*T."""
    where = np.flatnonzero(mask).astype(np.int32)
    quarter = max(1, mask.size // 4)
    size = max(quarter, -(-len(where) // quarter) * quarter)
    return np.concatenate([where, np.full(size - len(where), -1, np.int32)])
