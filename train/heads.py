"""What every head's training shares around the loop: the run settings, the held-out acceptance
check, and the head written at the end with metadata (target, data, steps, measured acceptance)."""
from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from typing import Any

import jax
from jax.experimental import multihost_utils

from . import loop
from .acceptance import acceptance
from .data import read_manifest, summary
from .plots import plot_run


@dataclasses.dataclass
class HeadSetup:
    """One head ready to train, whatever feeds its batches (train/heads.train_head, train/joint.py):
    loss_fn(params, frozen, batch) -> (loss, {name: array}); params its trained state; frozen what the
    loss reads but does not train (the target's rows, embeddings); drafter_of(params) -> the drafter;
    settings the run guard's part that names this head; feature_layers the target features it reads."""
    kind: str
    loss_fn: Callable
    params: Any
    frozen: Any
    drafter_of: Callable
    settings: dict
    feature_layers: tuple
    training_meta: dict = dataclasses.field(default_factory=dict)
    data_meta: dict = dataclasses.field(default_factory=dict)


def data_settings(data_dir: str) -> list[dict]:
    """The settings of each part of the data (train/data.py)."""
    return [p["settings"] for p in read_manifest(data_dir)["parts"]]


def train_setup(model, data_dir: str, out_dir: str, train_cfg: loop.TrainConfig, setup: HeadSetup,
                tokens_per_batch: int, seed: int, answer_only: bool, shards: list[str] | None, **fit_kw):
    """Train one head on cached target features (computed first when missing): `train eagle|mtp|draft`.
    fit_kw: train_head's eval_prompts, eval_tokens, resume, progress, on_step, until."""
    from .batches import FeatureBatches
    from .features import cache_features

    feat_dir = cache_features(model, data_dir, setup.feature_layers, progress=fit_kw.get("progress", True),
                              names=shards)
    batches = FeatureBatches(data_dir, feat_dir, tokens_per_batch, rows_multiple=jax.device_count(), seed=seed,
                             answer_only=answer_only, names=shards)
    settings = {**setup.settings, "tokens_per_batch": tokens_per_batch, "examples": len(batches.seqs),
                "answer_only": answer_only, **({"shards": list(shards)} if shards is not None else {})}
    return train_head(model, data_dir, out_dir, train_cfg, setup.loss_fn, setup.params, setup.frozen, batches,
                      settings, setup.drafter_of, data_meta=setup.data_meta,
                      training_meta={"answer_only": answer_only, "tokens_per_batch": tokens_per_batch,
                                     **setup.training_meta}, **fit_kw)


def train_head(model, data_dir: str, out_dir: str, train_cfg: loop.TrainConfig, loss_fn: Callable, params,
               frozen, batches, settings: dict, drafter_of: Callable, training_meta: dict, data_meta: dict,
               eval_prompts=None, eval_tokens: int = 64, resume: bool = False, progress: bool = True,
               on_step=None, until: int | None = None):
    """Run loop.fit, then save drafter_of(params) (its .metadata filled in) to out_dir with training.png.

    drafter_of(params) -> a drafter with .metadata and .save(path); its held-out acceptance is
    measured every train_cfg.eval_every steps and at the end. -> the saved drafter."""
    evaluate = (lambda p: acceptance(model, drafter_of(p), eval_prompts, eval_tokens)) if eval_prompts else None
    params, done = loop.fit(loss_fn, params, frozen, batches, train_cfg, out_dir, settings, resume=resume,
                            evaluate=evaluate, progress=progress, on_step=on_step, until=until)
    return save_trained(model, data_dir, out_dir, out_dir, train_cfg, params, done, settings, drafter_of,
                        training_meta, {"trained_on": batches.seen(done), **data_meta}, evaluate)


def _copy_log(run_dir: str, out_dir: str) -> None:
    """The run's metrics.jsonl and train_settings.json beside the head when the run logs elsewhere (a joint
    run's $JAXSPEC_CACHE/runs/NAME/<kind>), so a shipped head keeps its training log."""
    if os.path.abspath(run_dir) == os.path.abspath(out_dir):
        return
    for name in (loop.METRICS, loop.SETTINGS):
        if os.path.exists(os.path.join(run_dir, name)):
            shutil.copyfile(os.path.join(run_dir, name), os.path.join(out_dir, name))


def save_trained(model, data_dir: str, run_dir: str, out_dir: str, train_cfg: loop.TrainConfig, params, done: int,
                 settings: dict, drafter_of: Callable, training_meta: dict, data_meta: dict,
                 evaluate: Callable | None = None):
    """Save drafter_of(params) after `done` steps to out_dir, its metadata from the run's log in run_dir
    (final loss, training time, the last held-out acceptance: measured now by evaluate if the log has
    none for this step), with training.png. -> the drafter."""
    records = loop.read_metrics(run_dir)
    evals = [{"step": r["step"], **r["eval"]} for r in records if "eval" in r]
    steps = [r for r in records if "eval" not in r]
    last_eval, record = (evals[-1] if evals else None), (steps[-1] if steps else {})
    if evaluate and (last_eval is None or last_eval["step"] != done):     # e.g. a resume with nothing left to run
        result = evaluate(params)
        loop.append_metrics(run_dir, {"step": done, "eval": result})
        last_eval = {"step": done, **result}
    train_seconds = (round(sum(r["seconds"] for r in steps), 1)           # None if a record lacks its time
                     if steps and all("seconds" in r for r in steps) else None)
    drafter = drafter_of(params)
    drafter.metadata = dataclasses.replace(
        drafter.metadata, target=model.source, target_fingerprint=model.fingerprint,
        data={**summary(data_dir, settings.get("shards")),
              **({"shards": settings["shards"]} if "shards" in settings else {}),
              "mix": [s["mix"] for s in data_settings(data_dir)], **data_meta},
        training={"steps": done, "schedule_steps": train_cfg.steps, "lr": train_cfg.lr,
                  "final_loss": record.get("loss"), "final_top1": record.get("top1_j"),
                  "train_seconds": train_seconds, **training_meta},
        heldout_acceptance=last_eval)
    if jax.process_index() == 0:                # several processes (jax.distributed): one writer
        drafter.save(out_dir)                  # bfloat16 on disk
        plot_run(run_dir, out_dir)
        _copy_log(run_dir, out_dir)
    if jax.process_count() > 1:                 # the others read the head only once it is written
        multihost_utils.sync_global_devices(f"head saved to {out_dir}")
    return drafter
