"""One EAGLE training step timed by part on a batch of the training shape: where the time goes and at
what rate. FLOPs come from XLA's cost analysis of each compiled part; a part's time is the best of
`repeats` runs after one warm-up; parts are nested (the forward, the forward and backward, the whole
step), so the table also gives each part by difference.
"""
from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.heads.eagle import DraftVocab, EagleConfig, EagleHead
from jaxspec.models import lm_head_rows
from jaxspec.precision import bf16_operands, einsum

from . import loop
from .batches import loss_index
from .eagle import eagle_loss
from .features import target_features


@dataclasses.dataclass(frozen=True)
class ProfileConfig:
    tokens_per_batch: int = 4096
    seq_len: int = 512                  # T; rows B = tokens_per_batch // T
    draft_vocab_size: int = 32768
    ttt_steps: int = 4
    tied_head: bool = True
    bf16: bool = False                  # bfloat16 matmul operands, float32 accumulation (jaxspec/precision.py)
    answer_fraction: float = 1.0        # share of each row in the loss (the answer), packed when < 1
    repeats: int = 3
    seed: int = 0


def _flops(exe) -> float:
    cost = exe.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("flops", 0.0))


def time_part(fn, args: tuple, repeats: int, bf16: bool) -> dict:
    """Compile fn(*args) (bfloat16 operands if bf16) -> {"seconds": best of repeats, "gflop", "compile_s"}."""
    start = time.perf_counter()
    with bf16_operands(bf16):
        exe = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(exe(*args))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(exe(*args))
        best = min(best, time.perf_counter() - start)
    return {"seconds": best, "gflop": _flops(exe) / 1e9, "compile_s": compile_s}


def _batch(model, cfg: ProfileConfig, layers: tuple) -> dict:
    """Random tokens [B, T] whose last answer_fraction of each row is in the loss, their target features."""
    B, T = max(1, cfg.tokens_per_batch // cfg.seq_len), cfg.seq_len
    rng = np.random.default_rng(cfg.seed)
    tokens = rng.integers(0, model.config.vocab_size, (B, T), dtype=np.int32)
    mask = np.zeros((B, T), bool)
    mask[:, int(T * (1 - cfg.answer_fraction)):T - 1] = True
    with bf16_operands(cfg.bf16):
        feats = jax.jit(target_features, static_argnums=(2, 3))(model.params, tokens, model.config, layers)
    batch = {"tokens": tokens, "mask": mask, "feats": feats}
    return batch | ({"loss_index": loss_index(mask)} if cfg.answer_fraction < 1 else {})


def profile_eagle_step(model, cfg: ProfileConfig) -> dict:
    """-> {"parts": {name: {"seconds", "gflop", "gflops", "compile_s"}}, "settings"}: the target's features
    for the batch, the head's loss forward, forward + backward, the whole AdamW step, and the largest
    matmul alone (the draft-vocabulary projection of every position: the rate to compare with)."""
    ecfg = EagleConfig.for_target(model.config, cfg.draft_vocab_size, tied_head=cfg.tied_head)
    d2t = jnp.arange(ecfg.draft_vocab_size, dtype=jnp.int32)
    rows = lm_head_rows(model.params, d2t)
    head = EagleHead.init(ecfg, rngs=nnx.Rngs(cfg.seed), d2t=d2t, lm_head=rows)
    graph, params, vocab = nnx.split(head, nnx.Param, DraftVocab)
    frozen = {"embed": model.params["embed"], "target_head": rows, "vocab": vocab}
    batch = _batch(model, cfg, ecfg.feature_layers)
    loss_fn = lambda p, fz, b: eagle_loss(graph, p, fz, b, cfg.ttt_steps)
    opt = loop.make_optimizer(loop.TrainConfig(steps=10, warmup=1))
    state = {"params": params, "opt_state": opt.init(params), "step": jnp.int32(0)}
    tokens = jnp.asarray(batch["tokens"])
    normed = batch["feats"][:, :, -1].reshape(-1, ecfg.hidden_size)
    parts = {
        "target features": (lambda p, t: target_features(p, t, model.config, ecfg.feature_layers),
                            (model.params, tokens)),
        "loss forward": (lambda p, fz, b: loss_fn(p, fz, b)[0], (params, frozen, batch)),
        "loss + gradient": (jax.value_and_grad(loss_fn, has_aux=True), (params, frozen, batch)),
        "AdamW step": (loop._step_fn(loss_fn, opt), (state, frozen, batch)),
        "vocabulary matmul alone": (lambda x, w: einsum("ne,ev->nv", x, w, preferred_element_type=jnp.float32),
                                    (normed, rows)),
    }
    out = {}
    for name, (fn, args) in parts.items():
        r = time_part(fn, args, cfg.repeats, cfg.bf16)
        out[name] = {**r, "gflops": r["gflop"] / r["seconds"]}
    return {"parts": out, "settings": dataclasses.asdict(cfg)}


def markdown(result: dict) -> str:
    """The profile as a table: seconds, GFLOP (XLA's count), GFLOP/s and compile time per part."""
    lines = ["| part | s | GFLOP | GFLOP/s | compile s |", "|---|---:|---:|---:|---:|"]
    for name, r in result["parts"].items():
        lines.append(f"| {name} | {r['seconds']:.2f} | {r['gflop']:.0f} | {r['gflops']:.0f} | {r['compile_s']:.1f} |")
    return "\n".join(lines)
