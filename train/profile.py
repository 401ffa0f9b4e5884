"""Training steps timed by part: where the time goes and at what rate. FLOPs come from XLA's cost
analysis of each compiled part; a part's time is the best of `repeats` runs after one warm-up.
profile_eagle_step: one EAGLE step on a random batch of the training shape, in nested parts (the forward,
the forward and backward, the whole step), so the table also gives each part by difference.
profile_joint_step: a joint run's real batch (`jaxspec train heads`): the target's features, then each
head's whole step (loss, gradient, optimizer update) alone; their sum is the joint step.
XLA counts the body of a loop once, so the FLOPs come from a copy compiled with the training scans
unrolled (jaxspec/flops.py): profiles written before it undercount every chunked loss.
"""
from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.flops import counting
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
    """Compile fn(*args) (bfloat16 operands if bf16) -> {"seconds": best of repeats, "gflop", "compile_s"};
    the FLOPs of a copy compiled with its scans unrolled (jaxspec/flops.py)."""
    start = time.perf_counter()
    with bf16_operands(bf16):
        exe = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    with bf16_operands(bf16), counting():        # a new function: jit's trace cache ignores the context
        gflop = _flops(jax.jit(lambda *a: fn(*a)).lower(*args).compile()) / 1e9
    jax.block_until_ready(exe(*args))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(exe(*args))
        best = min(best, time.perf_counter() - start)
    return {"seconds": best, "gflop": gflop, "compile_s": compile_s}


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


def profile_joint_step(model, data_dir: str, setups: list, cfg, step: int = 0, repeats: int = 3) -> dict:
    """setups: train/heads.HeadSetup of each head; cfg: train/joint.JointConfig; the batch of `step` (a pure
    function of seed and step). -> {"parts": {"target features" | "<kind> step": {"seconds", "gflop", "gflops",
    "compile_s"}}, "settings": {"step", "rows", "seq_len", "loss_positions", "optimizer", "bf16"}}."""
    from .joint import NOT_RESUMED, _batches

    batches, _ = _batches(data_dir, setups, cfg, None)
    host = batches.batch(step)
    layers = tuple(setups[0].feature_layers)
    features = lambda p, t: target_features(p, t, model.config, layers)          # [B, T, N + 1, E]
    tokens = jnp.asarray(host["tokens"])
    parts = {"target features": time_part(features, (model.params, tokens), repeats, cfg.bf16)}
    with bf16_operands(cfg.bf16):
        batch = {**host, "feats": jax.jit(features)(model.params, tokens)}
    for s in setups:
        opt = loop.make_optimizer(cfg.train_config(s.kind))
        state = {"params": s.params, "opt_state": opt.init(s.params), "step": jnp.int32(step),
                 "resumed_at": jnp.int32(NOT_RESUMED)}
        step_fn = loop._step_fn(s.loss_fn, opt, cfg.rewarm)
        parts[f"{s.kind} step"] = time_part(step_fn, (state, s.frozen, batch), repeats, cfg.bf16)
    parts = {name: {**r, "gflops": r["gflop"] / r["seconds"]} for name, r in parts.items()}
    B, T = host["tokens"].shape
    positions = int((host["loss_index"] >= 0).sum()) if "loss_index" in host else B * T
    return {"parts": parts, "settings": {"step": step, "rows": B, "seq_len": T, "loss_positions": positions,
                                         "optimizer": cfg.optimizer, "bf16": cfg.bf16}}


def joint_markdown(result: dict) -> str:
    """markdown(result) and a last row: the joint step, the sum of the parts."""
    parts = result["parts"].values()
    seconds, gflop = sum(r["seconds"] for r in parts), sum(r["gflop"] for r in parts)
    return (markdown(result) + f"\n| joint step (sum) | {seconds:.2f} | {gflop:.0f} | {gflop / seconds:.0f} | "
            f"{sum(r['compile_s'] for r in parts):.1f} |")
