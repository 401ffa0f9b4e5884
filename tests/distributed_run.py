"""One of two jax.distributed processes on localhost (tests/test_sharding.py), 2 host devices each:
greedy generation on a mesh of the 4 global devices, then 1 EAGLE training step on it.
argv: process_id port data_dir out_dir. Prints one JSON object."""
from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{sys.argv[2]}", num_processes=2, process_id=int(sys.argv[1]))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jaxspec  # noqa: E402
from jaxspec.sharding import make_mesh  # noqa: E402
from jaxspec.train import loop  # noqa: E402
from tests.sharded_generate import PROMPTS, drafters  # noqa: E402
from tests.test_train_loop import TRAINERS, chain_model  # noqa: E402
from tests.conftest import tiny_model  # noqa: E402


def main() -> None:
    assert jax.device_count() == 4 and jax.local_device_count() == 2 and jax.process_count() == 2
    mesh, result = make_mesh(4, 1), {"tokens": {}}
    for name in ("plain", "eagle"):
        result["tokens"][name] = jaxspec.generate(tiny_model(), PROMPTS, max_new_tokens=12, drafter=drafters()[name],
                                                  num_draft_tokens=3, mesh=mesh).tokens
    train, kw, _ = TRAINERS["eagle"]
    cfg = loop.TrainConfig(steps=1, lr=3e-3, warmup=0, save_every=1, eval_every=0, log_every=1)
    with jax.set_mesh(mesh):
        train(chain_model(), sys.argv[3], sys.argv[4], cfg, **kw)
    result["losses"] = [r["loss"] for r in loop.read_metrics(sys.argv[4]) if "loss" in r]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
