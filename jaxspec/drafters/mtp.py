"""MTP drafter: DeepSeek-V3-style multi-token-prediction modules (heads/mtp.py) on the target's last
hidden state.

With history length n (the newest token at position n - 1, not yet in the target's cache), module j
at position n - 2 reads h^{j-1}_{n-2} and token_{n-2+j} and drafts token_{n-1+j}: module 1 the
token after `last`, module j the j-th draft. For K > D the last module runs on along the positions,
its own output standing in for h^{D-1}. Each step recomputes every module over the window of the
last W = max(K + min(K, D), D) positions (inputs there may have been drafts that the target has
since replaced, or tokens a sync step did not know yet); positions before the window are final in the modules' KV caches. h^0 of past positions is
kept in a static buffer [B, S, E]. Rollback is a length change, as for the target.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..cache import init_cache, rollback
from ..heads.eagle import to_target_logits
from ..heads.io import load_head, save_head
from ..heads.mtp import MTPConfig, mtp_logits, mtp_module, mtp_window
from ..models import lm_head_rows
from .base import Context, Drafter, check_head_target, draw_token

KIND = "mtp"


class MTP(Drafter):
    """MTP(head_params, cfg, metadata) or MTP.load(path); serves the target it was trained on."""

    def __init__(self, head_params: dict, cfg: MTPConfig, metadata: dict | None = None):
        self.head_params, self.cfg, self.metadata = head_params, cfg, dict(metadata or {})
        self.hidden_layers = (cfg.target_layers,)

    @classmethod
    def load(cls, path: str) -> "MTP":
        config, flat, meta = load_head(path, KIND)
        params = {k: v for k, v in flat.items() if not k.startswith("block.")}
        params["block"] = {k[len("block."):]: v for k, v in flat.items() if k.startswith("block.")}
        return cls(params, MTPConfig(**config), meta)

    def save(self, path: str) -> None:
        flat = {k: v for k, v in self.head_params.items() if k != "block"}
        flat.update({f"block.{k}": v for k, v in self.head_params["block"].items()})
        save_head(path, KIND, self.cfg.__dict__, flat, self.metadata)

    def __repr__(self):
        return f"MTP({self.cfg.num_modules} modules, draft vocab {self.cfg.draft_vocab_size})"

    def static_key(self):
        return (KIND, self.cfg)

    def check_target(self, model) -> None:
        check_head_target("MTP", self.cfg.target_vocab_size, self.cfg.hidden_size, self.metadata, model)
        if model.config.num_layers != self.cfg.target_layers:
            raise ValueError(f"MTP head reads layer {self.cfg.target_layers}; the target has "
                             f"{model.config.num_layers} layers")

    def params_for(self, model):
        rows = lm_head_rows(model.params, self.head_params["d2t"])
        return {"head": self.head_params, "embed": model.params["embed"], "norm": model.params["norm"],
                "rows": rows}

    def _logits(self, params, h):
        return to_target_logits(params["head"], mtp_logits(params["norm"], params["rows"], h,
                                                            self.cfg.rms_norm_eps), self.cfg.target_vocab_size)

    def init(self, params, prompts, lengths, capacity, features):
        """Keep the prompt's h^0 and run every module over the prompt."""
        B, T = prompts.shape
        cfg = self.cfg
        h0 = features[0]                                                      # [B, T, E]
        buf = jnp.zeros((B, capacity, cfg.hidden_size), h0.dtype).at[:, :T].set(h0)
        cache = init_cache(cfg.cache_config(), B, capacity, h0.dtype)
        nxt = jnp.concatenate([prompts[:, 1:], jnp.zeros((B, cfg.num_modules), prompts.dtype)], axis=1)
        _, cache = mtp_window(params["head"], params["embed"], h0, nxt, cache, cfg, jnp.zeros((B,), jnp.int32))
        return rollback(cache, lengths - 1), buf, jnp.zeros((B,), jnp.int32)

    def _window(self, params, state, ctx: Context, W: int):
        """Store the last pass's h^0 in the buffer; -> (buffer, the window's first position start [B],
        its positions [B, W] ending at n - 2, their h^0 [B, W, E])."""
        cache, buf, n_prev = state
        B, S = buf.shape[0], buf.shape[1]
        rows = jnp.arange(B)[:, None]
        n = ctx.history_len
        # h^0 from the last pass: positions n - 2 - n_prev .. (only those up to n - 2 are final)
        buf = buf.at[rows, (n - 2 - n_prev)[:, None] + jnp.arange(ctx.features.shape[2])].set(
            ctx.features[0].astype(buf.dtype), mode="drop")
        start = jnp.maximum(n - 1 - W, 0)
        window = start[:, None] + jnp.arange(W)                               # [B, W] positions
        return buf, start, window, buf[rows, jnp.clip(window, 0, S - 1)]

    def sync(self, params, state, ctx: Context):
        """Run every module over a window as long as the largest K's (P - 1 = K_max), drafting nothing:
        entries built from tokens not yet known are redone by a later window."""
        cfg, K_max = self.cfg, ctx.features.shape[2] - 1
        W = max(K_max + min(K_max, cfg.num_modules), cfg.num_modules)
        buf, start, window, h = self._window(params, state, ctx, W)
        cache, rows = state[0], jnp.arange(buf.shape[0])[:, None]
        clip = lambda i: jnp.clip(i, 0, ctx.history.shape[1] - 1)
        for j in range(cfg.num_modules):
            h, cache = mtp_module(params["head"], j, params["embed"], h,
                                  ctx.history[rows, clip(window + j + 1)], rollback(cache, start), cfg)
        return rollback(cache, ctx.history_len - 1), buf, state[2]

    def propose(self, params, state, ctx: Context, key, num_draft: int):
        head, embed, cfg = params["head"], params["embed"], self.cfg
        cache, n_prev = state[0], state[2]
        K, D = num_draft, min(num_draft, cfg.num_modules)
        W = max(K + D, cfg.num_modules)          # >= num_modules: a sync step may have left that many
        buf, start, window, h = self._window(params, state, ctx, W)
        rows = jnp.arange(buf.shape[0])[:, None]
        n = ctx.history_len
        at = n - 2 - start                                                    # window index of n - 2
        seq = ctx.history                                                     # drafts go in at n, n + 1, ...
        clip = lambda i: jnp.clip(i, 0, seq.shape[1] - 1)
        keys = jax.random.split(key, K)
        tokens, probs = [], []
        for j in range(D):                                                    # draft j + 1 from module j + 1
            h, cache = mtp_module(head, j, embed, h, seq[rows, clip(window + j + 1)], rollback(cache, start), cfg)
            tok, q = draw_token(self._logits(params, h[rows[:, 0], at]), keys[j], ctx.sampling)
            seq = seq.at[rows[:, 0], n + j].set(tok, mode="drop")
            tokens.append(tok), probs.append(q)
        h_rest = h
        for j in range(D, cfg.num_modules):       # K < D: keep the caches of the modules not drafting current
            h_rest, cache = mtp_module(head, j, embed, h_rest, seq[rows, clip(window + j + 1)],
                                       rollback(cache, start), cfg)
        h = h[rows[:, 0], at][:, None]
        for j in range(D, K):                                                 # the last module runs on
            q_pos = n - 2 + (j - D + 1)
            h, cache = mtp_module(head, D - 1, embed, h, seq[rows, clip(n - 1 + j)[:, None]],
                                  rollback(cache, q_pos), cfg)
            tok, q = draw_token(self._logits(params, h[:, 0]), keys[j], ctx.sampling)
            seq = seq.at[rows[:, 0], n + j].set(tok, mode="drop")
            tokens.append(tok), probs.append(q)
        return jnp.stack(tokens, 1), jnp.stack(probs, 1), (rollback(cache, n - 1), buf, n_prev)

    def commit(self, params, state, ctx: Context, num_accepted):
        return state[0], state[1], num_accepted
