"""The training loop every head shares: optax AdamW (or Muon) with warm-up + cosine and clipping, a data-parallel
step under a jax.sharding.Mesh, Orbax checkpoints with exact resume, a JSONL metrics log, a
progress bar and periodic evaluation.

A run's state is {"params", "opt_state", "step"}; the batch for step k comes from batches.batch(k),
a pure function of k, so `resume` after a kill repeats nothing and skips nothing (it loses at most
the steps since the last save).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm import tqdm

from jaxspec.sharding import make_mesh, shard_params

METRICS, SETTINGS, CKPT = "metrics.jsonl", "train_settings.json", "ckpt"
OPTIMIZERS = ("adamw", "muon")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    lr: float = 1e-3
    warmup: int = 50
    end_lr_fraction: float = 0.05
    weight_decay: float = 0.01
    clip: float = 1.0
    save_every: int = 100
    eval_every: int = 250
    log_every: int = 10
    optimizer: str = "adamw"      # OPTIMIZERS

    def __post_init__(self):
        if self.steps < 1 or self.save_every < 1 or self.log_every < 1 or self.eval_every < 0:
            raise ValueError(f"steps, save_every and log_every must be >= 1, eval_every >= 0: {self}")
        if not self.lr > 0 or not 0 <= self.warmup < self.steps:
            raise ValueError(f"need lr > 0 and 0 <= warmup < steps: {self}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")


def learning_rate(cfg: TrainConfig) -> optax.Schedule:
    return optax.warmup_cosine_decay_schedule(0.0, cfg.lr, cfg.warmup, cfg.steps, cfg.lr * cfg.end_lr_fraction)


MUON_RMS = 0.2            # Muon's update RMS, that of AdamW's (Liu et al. 2025), so one learning rate serves both
OUTPUT_AXES = {"wq": 2, "wk": 2, "wv": 2}     # [.., E, H, D]: heads x head width out; other weights: the last axis


def muon_dimensions(params):
    """Which axes of each weight Muon orthogonalises over: optax MuonDimensionNumbers (reduction axes, output
    axes; a leading `layers` axis of stacked weights is a batch axis), or None for vectors and vocabulary
    tables (`embed`), which AdamW updates (as in Liu et al. 2025)."""
    def spec(path, x):
        keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        name = [k for k in keys if isinstance(k, str) and k != "value"][-1]
        first, out = (1 if "layers" in keys else 0), OUTPUT_AXES.get(name, 1)
        if x.ndim - first < 2 or name == "embed":
            return None
        return optax.contrib.MuonDimensionNumbers(tuple(range(first, x.ndim - out)), tuple(range(x.ndim - out, x.ndim)))
    return jax.tree_util.tree_map_with_path(spec, params)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """Clipping, then AdamW, or Muon (Jordan et al. 2024: momentum orthogonalised by Newton-Schulz) on every
    weight matrix (muon_dimensions) at AdamW's update RMS and AdamW on the rest (optax.contrib.muon), on the
    same schedule."""
    if cfg.optimizer == "muon":
        update = optax.contrib.muon(learning_rate(cfg), weight_decay=cfg.weight_decay,
                                    adam_weight_decay=cfg.weight_decay, consistent_rms=MUON_RMS,
                                    muon_weight_dimension_numbers=muon_dimensions)
    else:
        update = optax.adamw(learning_rate(cfg), weight_decay=cfg.weight_decay)
    return optax.chain(optax.clip_by_global_norm(cfg.clip), update)


def data_mesh() -> Mesh:
    """All devices on the "data" axis (and a "model" axis of 1): the batch is split over them."""
    return make_mesh(jax.device_count(), 1)


def training_mesh() -> Mesh:
    """The mesh set with jax.set_mesh (e.g. by `jaxspec train --mesh data=4,model=2`), else data_mesh()."""
    mesh = jax.sharding.get_mesh()
    return data_mesh() if mesh.empty else mesh


def _step_fn(loss_fn: Callable, opt: optax.GradientTransformation, rewarm: int = 0):
    """One optimizer step of state {"params", "opt_state", "step", ...}. rewarm > 0 (a joint run resumed
    from a fallback with fresh moments; its state holds "resumed_at"): the update is scaled by
    min(1, (step - resumed_at + 1) / rewarm)."""
    def step(state, frozen, batch):      # frozen is an argument: closed over, it would be baked in as constants
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"], frozen, batch)
        updates, opt_state = opt.update(grads, state["opt_state"], state["params"])
        if rewarm:
            since = (state["step"] - state["resumed_at"] + 1).astype(jnp.float32)
            updates = jax.tree.map(lambda u: u * jnp.minimum(1.0, since / rewarm), updates)
        params = optax.apply_updates(state["params"], updates)
        metrics = {**metrics, "loss": loss, "grad_norm": optax.tree.norm(grads)}
        return {**state, "params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics
    return step


def log_record(step: int, lr: float, elapsed: float, tokens: int, metrics: dict) -> dict:
    """A metrics.jsonl record: the step, its learning rate, seconds and tokens/s since the last record,
    and the step's metrics (fetched from the device)."""
    return {"step": step, "lr": lr, "seconds": round(elapsed, 2), "tokens_per_s": round(tokens / elapsed, 1),
            **{name: _plain(v) for name, v in jax.device_get(metrics).items()}}


def _plain(x):
    x = np.asarray(x)
    return x.item() if x.ndim == 0 else [round(float(v), 6) for v in x.ravel()]


def read_metrics(out_dir: str) -> list[dict]:
    """The records of out_dir/metrics.jsonl (none when there is no log yet)."""
    path = os.path.join(out_dir, METRICS)
    return read_jsonl(path) if os.path.isfile(path) else []


def read_jsonl(path: str) -> list[dict]:
    """One JSON record per non-empty line."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def append_metrics(out_dir: str, record: dict) -> None:
    """One record on metrics.jsonl (by process 0 alone when jax.distributed runs several)."""
    if jax.process_index() != 0:
        return
    with open(os.path.join(out_dir, METRICS), "a") as f:
        f.write(json.dumps(record) + "\n")


BOOKKEEPING = ("save_every", "eval_every", "log_every")     # may change when a run resumes


def settings_changed(old: dict, new: dict) -> list[str]:
    """The keys whose values differ between two runs' settings, ignoring how often a run saves, evaluates
    and logs (those do not change its schedule), and fields a model config or TrainConfig gained after
    the run started while they hold their defaults."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}

    def schedule(settings):
        settings = {k: _with_config_defaults(v) for k, v in json.loads(json.dumps(settings)).items()}
        train = {k: v for k, v in {**defaults, **settings.get("train", {})}.items() if k not in BOOKKEEPING}
        return {**settings, "train": train} if "train" in settings else settings
    old, new = schedule(old), schedule(new)
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def _with_config_defaults(value):
    """A ModelConfig's fields as a settings dict, the fields it lacks at their defaults (as JSON holds them)."""
    from jaxspec.config import ModelConfig
    fields = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.default is not dataclasses.MISSING}
    if not isinstance(value, dict) or not {"vocab_size", "num_layers", "hidden_size"} <= set(value):
        return value
    return {**json.loads(json.dumps(fields)), **value}


class Run:
    """One training run in out_dir: settings guard, checkpoints and metrics log."""

    def __init__(self, out_dir: str, settings: dict, resume: bool):
        self.out_dir = os.path.abspath(out_dir)
        os.makedirs(self.out_dir, exist_ok=True)
        self.ckpt_dir = os.path.join(self.out_dir, CKPT)
        path = os.path.join(self.out_dir, SETTINGS)
        exists = os.path.isdir(self.ckpt_dir) and any(n.isdigit() for n in os.listdir(self.ckpt_dir))
        if exists and not resume:
            raise ValueError(f"{out_dir} already holds a training run: pass --resume to continue it, "
                             f"or choose another --out")
        if resume and os.path.isfile(path):
            with open(path) as f:
                old = json.load(f)
            changed = settings_changed(old, settings)
            if changed:
                raise ValueError(f"cannot resume {out_dir}: settings differ in {changed}")
        with open(path, "w") as f:
            json.dump(settings, f, indent=1)
        self.manager = ocp.CheckpointManager(self.ckpt_dir, options=ocp.CheckpointManagerOptions(
            max_to_keep=2, create=True))

    def restore(self, state):
        """-> the newest saved state (or `state` when there is none)."""
        step = self.manager.latest_step()
        if step is None:
            return state
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
        try:
            restored = self.manager.restore(step, args=ocp.args.StandardRestore(abstract))
        except Exception as e:
            raise ValueError(f"checkpoint {step} in {self.ckpt_dir} cannot be read (truncated or corrupt?); "
                             f"delete that step's folder to resume from an earlier one: {e}") from e
        self._trim_metrics(int(restored["step"]))
        return restored

    def _trim_metrics(self, step: int) -> None:
        """Drop log records of steps after the restored one (they will be run again)."""
        if jax.process_index() != 0:
            return
        keep = [r for r in read_metrics(self.out_dir) if r["step"] <= step]
        with open(os.path.join(self.out_dir, METRICS), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in keep)

    def log(self, record: dict) -> None:
        append_metrics(self.out_dir, record)

    def save(self, state) -> None:
        self.manager.save(int(state["step"]), args=ocp.args.StandardSave(state))

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def fit(loss_fn: Callable, params, frozen, batches, cfg: TrainConfig, out_dir: str, settings: dict,
        resume: bool = False, evaluate: Callable | None = None, progress: bool = True,
        on_step: Callable | None = None, until: int | None = None):
    """Train params to cfg.steps (or stop after step `until`, saved, to resume later);
    -> (params, completed steps).

    loss_fn(params, frozen, batch) -> (loss, {name: array}); batches.batch(k) -> dict of arrays with
    the batch on axis 0; evaluate(params) -> dict, logged every cfg.eval_every steps and at the end;
    on_step(step, record) is called after every logged step (tests use it to simulate a kill).

    Sharded on training_mesh(): the batch over "data"; the parameters, the optimizer state and the
    frozen target over "model" where jaxspec.sharding's rules split them (FSDP-style; all replicated
    on a model axis of 1). A checkpoint restores onto the mesh of the run that resumes it."""
    mesh = training_mesh()
    rows_axis = mesh.shape["data"]
    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    opt = make_optimizer(cfg)
    run = Run(out_dir, {**settings, "train": dataclasses.asdict(cfg)}, resume)
    params = jax.tree.map(jnp.copy, params)            # the step donates its state, never the caller's arrays
    state = {"params": shard_params(params, mesh), "opt_state": shard_params(opt.init(params), mesh),
             "step": jax.device_put(jnp.int32(0), replicated)}
    if resume:
        state = run.restore(state)
    frozen = shard_params(frozen, mesh)
    placement = jax.tree.map(lambda x: x.sharding, state)
    step_fn = jax.jit(_step_fn(loss_fn, opt), donate_argnums=0, out_shardings=(placement, replicated))
    schedule = learning_rate(cfg)
    start = int(state["step"])
    stop = cfg.steps if until is None else max(start, min(int(until), cfg.steps))
    bar = tqdm(total=stop, initial=start, unit="step", desc="training", disable=not progress)
    tokens, t0 = 0, time.perf_counter()
    try:
        for k in range(start, stop):
            batch = batches.batch(k)
            rows = next(iter(batch.values())).shape[0]
            if rows % rows_axis:
                raise ValueError(f"a batch of {rows} rows cannot be split over {rows_axis} devices")
            state, metrics = step_fn(state, frozen, jax.device_put(batch, split))
            tokens += int(batch["mask"].sum())
            done = k + 1
            if done % cfg.log_every == 0 or done == stop:
                record = log_record(done, float(schedule(k)), time.perf_counter() - t0, tokens, metrics)
                tokens, t0 = 0, time.perf_counter()
                run.log(record)
                bar.set_postfix(loss=f"{record['loss']:.3f}")
                if on_step:
                    on_step(done, record)
            if done % cfg.save_every == 0 or done == stop:
                run.save(state)
            if evaluate and ((cfg.eval_every and done % cfg.eval_every == 0) or done == stop):
                run.log({"step": done, "eval": evaluate(state["params"])})
                t0 = time.perf_counter()
            bar.update(1)
    finally:
        bar.close()
        run.close()
    return jax.device_get(state["params"]), int(state["step"])
