"""A joint run's compact fallback (train/joint.py): what a run on a new machine resumes from when its
own state in $JAXSPEC_CACHE is gone. Meant to be committed (under checkpoints/<model>/runs/<name>/),
each one replacing the last:

  <kind>.safetensors   each head's trained parameters in bfloat16, flat names "a/b/0/c"
  run.json             {"step", "target", "written", "settings": {kind: the head's run settings}}

The data cursor and the random state are functions of the run's seed and step (train/batches.py), so
they are the step; optimizer moments are left out (they would triple the size) and re-warmed on resume.

A fallback may instead point at heads shipped from the same step (link): run.json's "heads" gives each
linked kind's folder and the digest of its parameters, and <kind>.safetensors is gone, so a session that
ships its heads commits their parameters once, not twice.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os

import jax
import numpy as np
from flax import nnx, traverse_util
from safetensors.numpy import load_file, save_file

from .loop import read_metrics, settings_changed

INDEX = "run.json"


def _pure(tree):
    return nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree


def _flat(tree) -> dict:
    """A parameter tree (an nnx.State or nested dicts) -> {"a/b/0": array}."""
    return {"/".join(map(str, k)): np.asarray(v) for k, v in traverse_util.flatten_dict(_pure(tree)).items()}


def write(folder: str, step: int, params: dict, settings: dict, target: str) -> None:
    """params {kind: tree}: each head's parameters, stored in bfloat16; files replaced atomically, run.json last."""
    import ml_dtypes

    os.makedirs(folder, exist_ok=True)
    for kind, tree in params.items():
        flat = {k: v.astype(ml_dtypes.bfloat16) for k, v in _flat(tree).items()}
        tmp = os.path.join(folder, f".{kind}.safetensors.tmp")
        save_file(flat, tmp)
        os.replace(tmp, os.path.join(folder, f"{kind}.safetensors"))
    _write_index(folder, {"step": int(step), "target": target, "settings": settings,
                          "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})


def _write_index(folder: str, index: dict) -> None:
    """run.json, replaced atomically."""
    tmp = os.path.join(folder, f".{INDEX}.tmp")
    with open(tmp, "w") as f:
        json.dump(index, f, indent=1)
    os.replace(tmp, os.path.join(folder, INDEX))


def read(folder: str, settings: dict) -> dict | None:
    """-> {"step", "written", "params": {kind: {flat name: float32 array}}, "logs": {kind: the run's log
    records up to the step, where a linked head carries them}} of the fallback in folder, None when there
    is none; ValueError when it was written by a run with other settings (another head, data or schedule)."""
    path = os.path.join(folder, INDEX)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        index = json.load(f)
    if sorted(index["settings"]) != sorted(settings):
        raise ValueError(f"the fallback in {folder} holds heads {sorted(index['settings'])}, this run "
                         f"{sorted(settings)}")
    for kind, mine in settings.items():
        theirs = index["settings"][kind]
        changed = settings_changed(theirs, mine)
        if changed:
            raise ValueError(f"cannot resume {kind} from the fallback in {folder}: settings differ in {changed}")
    params = {kind: _params(folder, index, kind) for kind in settings}
    logs = {kind: _linked_log(folder, index, kind) for kind in settings}
    return {"step": int(index["step"]), "written": index.get("written"), "params": params, "logs": logs}


def _linked_log(folder: str, index: dict, kind: str) -> list[dict]:
    """The records up to the fallback's step of the metrics.jsonl a linked head carries (the run's log when
    it was shipped, train/heads._copy_log); [] for a head stored in the fallback itself."""
    head = _linked_head(folder, index, kind)
    return [] if head is None else [r for r in read_metrics(head) if r["step"] <= index["step"]]


def _linked_head(folder: str, index: dict, kind: str) -> str | None:
    """The folder of the head a fallback's `kind` is linked to, None when the fallback stores it itself."""
    linked = index.get("heads", {}).get(kind)
    return None if linked is None else os.path.normpath(os.path.join(folder, linked["folder"]))


def _params(folder: str, index: dict, kind: str) -> dict:
    """{flat name: float32 array} of one head of the fallback: its own file, or the head it is linked to."""
    head = _linked_head(folder, index, kind)
    if head is None:
        return {k: np.asarray(v, np.float32) for k, v in load_file(os.path.join(folder, f"{kind}.safetensors")).items()}
    params = head_params(kind, head)
    if digest(params) != index["heads"][kind]["digest"]:
        raise ValueError(f"the {kind} head in {head} is not the one the fallback in {folder} was linked to "
                         f"(replaced since?): resume from the run's own state, or restore that head")
    return params


def head_params(kind: str, head: str) -> dict:
    """A saved head's trained parameters named as a fallback names them {"a/b/0": float32 array}: the
    inverse of its setup's drafter_of (train/eagle.py, train/mtp.py, train/draft.py)."""
    from jaxspec.drafters import MTP, DraftModel, Eagle
    from jaxspec.heads.eagle import DraftVocab
    from jaxspec.models.llama import stack_layers

    if kind == "draft":                     # a loaded model keeps one dict per layer, training stacks them
        params = DraftModel.load(head).model.params
        state = {"weights": {**params, "layers": stack_layers(params["layers"])}}
    elif kind in ("eagle", "mtp"):
        state = nnx.split({"eagle": Eagle, "mtp": MTP}[kind].load(head).head(), nnx.Param, DraftVocab)[1]
    else:
        raise ValueError(f"no {kind!r} head: eagle, mtp or draft")
    return {k: np.asarray(v, np.float32) for k, v in _flat(state).items()}


def digest(params: dict) -> str:
    """sha256 of {name: array} as stored (names sorted, values in bfloat16)."""
    import ml_dtypes

    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode() + b"\0" + np.ascontiguousarray(np.asarray(params[name]).astype(ml_dtypes.bfloat16)).tobytes())
    return h.hexdigest()


def link(folder: str, heads: dict) -> None:
    """Point the fallback in folder at heads {kind: head folder} saved from its parameters (the run stopped
    at the fallback's step with --until), dropping its own copies; ValueError, nothing changed, when a
    head's parameters differ from the fallback's in bfloat16."""
    with open(os.path.join(folder, INDEX)) as f:
        index = json.load(f)
    links = {}
    for kind, head in heads.items():
        theirs = digest(head_params(kind, head))
        if digest(_params(folder, index, kind)) != theirs:
            raise ValueError(f"the {kind} head in {head} does not hold the parameters of the fallback in {folder} "
                             f"(step {index['step']}): save the head at that step (--until) and link again")
        links[kind] = {"folder": os.path.relpath(head, folder), "digest": theirs}
    _write_index(folder, {**index, "heads": {**index.get("heads", {}), **links}})
    for kind in links:
        own = os.path.join(folder, f"{kind}.safetensors")
        if os.path.exists(own):
            os.remove(own)


def unflatten_like(template, flat: dict):
    """Fallback arrays {"a/b/0": array} in the structure of template (an nnx.State or nested dicts), each
    cast to the template's dtype."""
    keys = traverse_util.flatten_dict(_pure(template))
    missing = sorted("/".join(map(str, k)) for k in keys if "/".join(map(str, k)) not in flat)
    if missing:
        raise ValueError(f"the fallback lacks parameters {missing[:5]}")
    tree = traverse_util.unflatten_dict({k: np.asarray(flat["/".join(map(str, k))], np.asarray(v).dtype)
                                         for k, v in keys.items()})
    if not isinstance(template, nnx.State):
        return tree
    state = jax.tree.map(lambda x: x, template)
    nnx.replace_by_pure_dict(state, tree)
    return state
