"""One pass of the target feeds every head (`jaxspec train heads`).

For each batch the target's features are computed once, in the step (bfloat16 matmul operands,
jaxspec/precision.py; no feature cache), and each head - EAGLE, MTP, draft model (train/heads.HeadSetup)
- takes a step of its own AdamW on them. The batch at step k is a pure function of (seed, k), so a
run is its step count, its parameters and its optimizer state.

A run named NAME keeps its state outside the work tree, in $JAXSPEC_CACHE/runs/NAME/<kind>/ (Orbax
checkpoints, settings guard and metrics log per head: train/loop.Run), and writes a compact fallback to
a folder meant to be committed (train/fallback.py): bfloat16 parameters and the step. A run that finds no
state of its own resumes from the fallback with fresh optimizer moments, the schedule at the fallback's
step and the update scaled up over `rewarm` steps.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import sys
import threading
import time

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm import tqdm

from jaxspec import paths
from jaxspec.precision import bf16_operands
from jaxspec.sharding import shard_params

from . import fallback, loop
from .batches import FeatureBatches
from .features import target_features
from .heads import HeadSetup, save_trained
from .plots import plot_curve

CURVE = "curve.jsonl"     # held-out acceptance of the fallback, one line per evaluation
BASELINES = "baselines.json"     # the training-free drafters on the same prompts, measured once
NOT_RESUMED = -(2 ** 30)         # state["resumed_at"] of a run that never restarted from a fallback


@dataclasses.dataclass(frozen=True)
class JointConfig:
    """A joint run: one schedule shape (steps, warm-up) for every head, a peak learning rate per head."""
    name: str
    steps: int
    lrs: dict                           # head kind -> peak learning rate
    warmup: int = 50
    tokens_per_batch: int = 4096
    answer_only: bool = True
    save_every: int = 50
    log_every: int = 10
    fallback_minutes: float = 60.0
    rewarm: int = 20
    seed: int = 0
    bf16: bool = True
    optimizer: str = "adamw"            # loop.OPTIMIZERS

    def train_config(self, kind: str) -> loop.TrainConfig:
        return loop.TrainConfig(steps=self.steps, lr=self.lrs[kind], warmup=self.warmup, save_every=self.save_every,
                                eval_every=0, log_every=self.log_every, optimizer=self.optimizer)


def joint_steps(data_dir: str, tokens_per_batch: int, epochs: float, shards: list[str] | None = None) -> int:
    """Steps for `epochs` passes over the data (or those shards) in batches of tokens_per_batch."""
    batches = FeatureBatches(data_dir, None, tokens_per_batch, rows_multiple=jax.device_count(), names=shards)
    return max(1, round(epochs * batches.batches_per_epoch))


def run_dir(name: str) -> str:
    """$JAXSPEC_CACHE/runs/NAME: a joint run's state."""
    return os.path.join(paths.cache_dir(), "runs", name)


class HeadRun:
    """One head of a joint run: its loop.Run (checkpoints, log), its state on the mesh, its compiled step."""

    def __init__(self, setup: HeadSetup, cfg: JointConfig, settings: dict, mesh):
        self.setup, self.train_cfg = setup, cfg.train_config(setup.kind)
        self.dir = os.path.join(run_dir(cfg.name), setup.kind)
        self.settings = settings
        self.run = loop.Run(self.dir, {**settings, "train": dataclasses.asdict(self.train_cfg)}, resume=True)
        self.opt = loop.make_optimizer(self.train_cfg)
        replicated = NamedSharding(mesh, P())
        params = jax.tree.map(jnp.copy, setup.params)
        self.state = {"params": shard_params(params, mesh), "opt_state": shard_params(self.opt.init(params), mesh),
                      "step": jax.device_put(jnp.int32(0), replicated),
                      "resumed_at": jax.device_put(jnp.int32(NOT_RESUMED), replicated)}
        self.frozen = shard_params(setup.frozen, mesh)
        placement = jax.tree.map(lambda x: x.sharding, self.state)
        self.step_fn = jax.jit(loop._step_fn(setup.loss_fn, self.opt, cfg.rewarm), donate_argnums=0,
                               out_shardings=(placement, replicated))
        self.metrics, self.tokens = None, 0

    def has_checkpoint(self) -> bool:
        return self.run.manager.latest_step() is not None

    def restore(self) -> int:
        self.state = self.run.restore(self.state)
        return int(self.state["step"])

    def from_fallback(self, params, step: int, log: list[dict] = ()) -> None:
        """Fallback parameters, fresh moments, the schedule at `step`, the update re-warmed from there; a
        run folder with no log of its own starts from `log` (the run's records up to `step`), so its
        training time and curves count the steps run before."""
        params = fallback.unflatten_like(jax.device_get(self.state["params"]), params)
        at_step = lambda s: (s._replace(count=jnp.asarray(step, s.count.dtype))
                             if isinstance(s, optax.ScaleByScheduleState) else s)
        opt_state = jax.tree.map(at_step, self.opt.init(params),
                                 is_leaf=lambda s: isinstance(s, optax.ScaleByScheduleState))
        shard = lambda new, old: jax.device_put(new, old.sharding)
        self.state = jax.tree.map(shard, {"params": params, "opt_state": opt_state, "step": jnp.int32(step),
                                          "resumed_at": jnp.int32(step)}, self.state)
        self.run._trim_metrics(step)
        if not loop.read_metrics(self.dir):
            for record in log:
                self.run.log(record)

    def step(self, batch) -> None:
        self.state, self.metrics = self.step_fn(self.state, self.frozen, batch)


def _start(heads: dict, fallback_dir: str | None) -> int:
    """Restore every head from its own checkpoints, else from the fallback, else start at 0; -> the step."""
    if all(h.has_checkpoint() for h in heads.values()):
        steps = {kind: h.restore() for kind, h in heads.items()}
        if len(set(steps.values())) > 1:
            raise ValueError(f"the heads of this run were saved at different steps {steps}: delete the "
                             f"newest checkpoints of the ahead ones to resume")
        return next(iter(steps.values()))
    saved = fallback.read(fallback_dir, {k: h.settings for k, h in heads.items()}) if fallback_dir else None
    if saved is None:
        return 0
    for kind, h in heads.items():
        h.from_fallback(saved["params"][kind], saved["step"], saved["logs"][kind])
    return saved["step"]


def _log(heads: dict, step: int, elapsed: float, schedule_at: int) -> dict:
    """Each head's metrics of this step to its log; -> {kind: loss}."""
    losses = {}
    for kind, h in heads.items():
        record = loop.log_record(step, float(loop.learning_rate(h.train_cfg)(schedule_at)), elapsed, h.tokens,
                                 h.metrics)
        h.run.log(record)
        h.tokens, losses[kind] = 0, record["loss"]
    return losses


def train_heads(model, data_dir: str, setups: list[HeadSetup], outs: dict, cfg: JointConfig,
                fallback_dir: str | None = None, until: int | None = None, shards: list[str] | None = None,
                progress: bool = True, eval_prompts=None, eval_tokens: int = 64) -> dict:
    """Train every head in `setups` on one pass of the target per batch; write each to outs[kind] when the
    run stops (at cfg.steps, or after step `until`, saved to resume later). -> {kind: drafter}."""
    layers = {tuple(s.feature_layers) for s in setups}
    if len(layers) != 1:
        raise ValueError(f"the heads read different target layers {sorted(layers)}: train them apart")
    batches, settings = _batches(data_dir, setups, cfg, shards)
    mesh = loop.training_mesh()
    heads = {s.kind: HeadRun(s, cfg, settings[s.kind], mesh) for s in setups}
    start = _start(heads, fallback_dir)
    stop = cfg.steps if until is None else max(start, min(int(until), cfg.steps))
    features = jax.jit(functools.partial(target_features, cfg=model.config, layers=next(iter(layers))))
    split = NamedSharding(mesh, P("data"))
    bar = tqdm(total=stop, initial=start, unit="step", desc="training " + "+".join(heads), disable=not progress)
    t0 = last_fallback = time.perf_counter()
    asked, done = StopRequest(), start
    try:
        with bf16_operands(cfg.bf16), asked:
            for k in range(start, stop):
                host = batches.batch(k)
                batch = jax.device_put(host, split)
                batch["feats"] = features(model.params, batch["tokens"])
                for h in heads.values():
                    h.step(batch)
                    h.tokens += int(host["mask"].sum())
                done = k + 1
                if done % cfg.log_every == 0 or done == stop:
                    jax.block_until_ready([h.metrics for h in heads.values()])     # steps dispatch asynchronously
                    losses = _log(heads, done, time.perf_counter() - t0, k)
                    bar.set_postfix({kind: f"{v:.3f}" for kind, v in losses.items()})
                    t0 = time.perf_counter()
                last = done == stop or asked.stop
                if done % cfg.save_every == 0 or last:
                    for h in heads.values():
                        h.run.save(h.state)
                if fallback_dir and (last or time.perf_counter() - last_fallback > 60 * cfg.fallback_minutes):
                    _write_fallback(heads, fallback_dir, done, model)
                    last_fallback = time.perf_counter()
                bar.update(1)
                if asked.stop:
                    break
    finally:
        bar.close()
        for h in heads.values():
            h.run.close()
    if asked.stop:
        print(f"run {cfg.name} stopped by signal after step {done}: saved, fallback written; rerun to continue",
              file=sys.stderr)
        return {}
    return {kind: _finish(model, data_dir, h, outs.get(kind), batches, eval_prompts, eval_tokens)
            for kind, h in heads.items()}


class StopRequest:
    """Within `with`: SIGTERM or SIGINT sets .stop instead of killing the process, so a run ends its step,
    saves its state and writes its fallback (the end of a session, a Ctrl-C) and returns. The previous
    handlers come back on exit; a second signal while stopping is taken the same way."""

    def __init__(self):
        self.stop, self._previous = False, {}

    def _ask(self, signum, frame):
        self.stop = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():     # signal handlers live in the main thread
            self._previous = {sig: signal.signal(sig, self._ask) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _batches(data_dir: str, setups: list[HeadSetup], cfg: JointConfig, shards: list[str] | None):
    """The run's batches and {kind: the settings that name its run} (the guard of resume and fallback)."""
    batches = FeatureBatches(data_dir, None, cfg.tokens_per_batch, rows_multiple=jax.device_count(), seed=cfg.seed,
                             answer_only=cfg.answer_only, names=shards, pack=True)
    common = {"tokens_per_batch": cfg.tokens_per_batch, "answer_only": cfg.answer_only, "examples": len(batches.seqs),
              **({"shards": list(shards)} if shards is not None else {}),
              **({"optimizer": cfg.optimizer} if cfg.optimizer != "adamw" else {})}     # runs before it: AdamW
    return batches, {s.kind: {**s.settings, **common} for s in setups}


def evaluate_fallback(model, data_dir: str, setups: list[HeadSetup], cfg: JointConfig, fallback_dir: str,
                      prompts: list, eval_tokens: int = 64, shards: list[str] | None = None) -> dict:
    """Held-out acceptance (K = 5, greedy) of each head of the run's fallback as it stands, no training;
    appended to FALLBACK/curve.jsonl and drawn in FALLBACK/curve.png.
    -> {"step", "written", kind: {"mean_accepted_length", ...}}."""
    from .acceptance import acceptance

    batches, settings = _batches(data_dir, setups, cfg, shards)
    saved = fallback.read(fallback_dir, settings)
    if saved is None:
        raise ValueError(f"no fallback in {fallback_dir}")
    point = {"step": saved["step"], "written": saved["written"], "trained_on": batches.seen(saved["step"])}
    for s in setups:
        params = fallback.unflatten_like(s.params, saved["params"][s.kind])
        point[s.kind] = acceptance(model, s.drafter_of(params), prompts, eval_tokens)
    base = baselines(model, data_dir, prompts, eval_tokens, fallback_dir)
    if jax.process_index() == 0:
        with open(os.path.join(fallback_dir, CURVE), "a") as f:
            f.write(json.dumps(point) + "\n")
        plot_curve(fallback_dir, loop.read_jsonl(os.path.join(fallback_dir, CURVE)), cfg.tokens_per_batch,
                   {name: r["mean_accepted_length"] for name, r in base["drafters"].items()})
    return point


def baselines(model, data_dir: str, prompts: list, eval_tokens: int, folder: str) -> dict:
    """What a trained head must beat on the curve's prompts: NGram, Suffix (a store of the data's answers;
    the held-out prompts' are not in it) and the heads shipped for the model now ("shipped eagle", ...),
    measured as the heads are; kept in FOLDER/baselines.json and measured again only when the prompts,
    length, target, drafters or the shipped heads' parameters change. -> {"key", "drafters": {name: ...}}."""
    from jaxspec.drafters import NGram, Suffix, shipped, shipped_kinds

    from .acceptance import acceptance

    drafters = {"ngram": NGram(), "suffix": Suffix.from_data(data_dir),
                **{f"shipped {kind}": shipped(model, kind) for kind in shipped_kinds(model) if kind != "suffix"}}
    key = {"target": model.source, "prompts": prompts, "eval_tokens": eval_tokens, "drafters": sorted(drafters),
           "shipped": {name: _fingerprint(d) for name, d in drafters.items() if name.startswith("shipped ")}}
    path = os.path.join(folder, BASELINES)
    if os.path.isfile(path):
        with open(path) as f:
            kept = json.load(f)
        if kept.get("key") == key:
            return kept
    kept = {"key": key, "drafters": {name: acceptance(model, d, prompts, eval_tokens) for name, d in drafters.items()}}
    if jax.process_index() == 0:
        with open(path, "w") as f:
            json.dump(kept, f)
    return kept


def _fingerprint(drafter) -> str:
    """sha256 of a head's parameters (fallback.digest, in bfloat16): what a kept baseline was measured with."""
    return fallback.digest({f"{i:04d}": leaf for i, leaf in enumerate(jax.tree.leaves(drafter.state))})


def _write_fallback(heads: dict, fallback_dir: str, step: int, model) -> None:
    params = {kind: jax.device_get(h.state["params"]) for kind, h in heads.items()}
    fallback.write(fallback_dir, step, params, {kind: h.settings for kind, h in heads.items()},
                   target=model.source)


def _finish(model, data_dir: str, h: HeadRun, out_dir: str | None, batches, eval_prompts, eval_tokens: int):
    """Write the head to out_dir (with its metadata and the held-out acceptance when prompts are given)."""
    if out_dir is None:
        return None
    from .acceptance import acceptance

    drafter_of = h.setup.drafter_of
    evaluate = (lambda p: acceptance(model, drafter_of(p), eval_prompts, eval_tokens)) if eval_prompts else None
    params = jax.device_get(h.state["params"])
    return save_trained(model, data_dir, h.dir, out_dir, h.train_cfg, params, int(h.state["step"]), h.settings,
                        drafter_of, {"tokens_per_batch": h.settings["tokens_per_batch"], "joint": True,
                                     "answer_only": h.settings["answer_only"], **h.setup.training_meta},
                        {"trained_on": batches.seen(int(h.state["step"])), **h.setup.data_meta}, evaluate)
