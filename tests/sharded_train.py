"""Run as a script with 8 host devices (tests/test_sharding.py): EAGLE training steps on one device
and on meshes (8, 1), (4, 2), (2, 4), and a run stopped on (4, 2) resumed on (8, 1) and on (1, 1); MTP
and draft-model steps on one device and on the default mesh (every device on "data", no mesh set).
argv: data_dir out_dir. Prints one JSON object {run: [[step, loss], ...]}."""
from __future__ import annotations

import json
import os
import shutil
import sys

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxspec.sharding import make_mesh  # noqa: E402
from jaxspec.train import loop  # noqa: E402
from tests.test_train_loop import TRAINERS, chain_model  # noqa: E402


def losses(out: str) -> list:
    return [[r["step"], r["loss"]] for r in loop.read_metrics(out) if "loss" in r]


def main(data_dir: str, out: str) -> None:
    assert jax.device_count() == 8, jax.devices()
    train, kw, _ = TRAINERS["eagle"]
    cfg = loop.TrainConfig(steps=3, lr=3e-3, warmup=1, save_every=1, eval_every=0, log_every=1)
    result = {}
    for shape in [(1, 1), (8, 1), (4, 2), (2, 4)]:
        with jax.set_mesh(make_mesh(*shape)):
            until = None if shape == (1, 1) else 2              # (1, 1) runs all 3 steps: the reference
            train(chain_model(), data_dir, os.path.join(out, str(shape)), cfg, until=until, **kw)
        result[str(shape)] = losses(os.path.join(out, str(shape)))
    for shape in [(8, 1), (1, 1)]:                              # resume the (4, 2) run on another mesh
        resumed = os.path.join(out, f"resumed on {shape}")
        shutil.copytree(os.path.join(out, "(4, 2)"), resumed)
        with jax.set_mesh(make_mesh(*shape)):
            train(chain_model(), data_dir, resumed, cfg, resume=True, **kw)
        result[f"resumed on {shape}"] = losses(resumed)
    two = loop.TrainConfig(steps=2, lr=3e-3, warmup=1, save_every=2, eval_every=0, log_every=1)
    for kind in ("mtp", "draft"):
        train, kw, _ = TRAINERS[kind]
        with jax.set_mesh(make_mesh(1, 1)):
            train(chain_model(), data_dir, os.path.join(out, f"{kind} (1, 1)"), two, **kw)
        train(chain_model(), data_dir, os.path.join(out, f"{kind} default"), two, **kw)
        result.update({f"{kind} {m}": losses(os.path.join(out, f"{kind} {m}")) for m in ("(1, 1)", "default")})
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
