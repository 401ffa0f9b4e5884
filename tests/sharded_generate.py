"""Run as a script with XLA_FLAGS=--xla_force_host_platform_device_count=8 (tests/test_sharding.py):
generation on one device and on meshes (8, 1), (4, 2), (2, 4); prints one JSON object."""
from __future__ import annotations

import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jaxspec  # noqa: E402
from jaxspec.decode import programs  # noqa: E402
from jaxspec.drafters import MTP, DraftModel, Eagle, NGram  # noqa: E402
from jaxspec.heads import EagleConfig, MTPConfig, init_eagle_params, init_mtp_params  # noqa: E402
from jaxspec.sharding import make_mesh  # noqa: E402
from tests.conftest import TINY, tiny_model  # noqa: E402

MESHES = [(8, 1), (4, 2), (2, 4)]
PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2][: 2 + i] for i in range(7)] + [[5] * 11]     # 8 lengths (distributed_run)


def drafters():
    ec = EagleConfig.for_target(TINY, draft_vocab_size=TINY.vocab_size)
    mc = MTPConfig.for_target(TINY, num_modules=2, draft_vocab_size=TINY.vocab_size)
    return {"plain": None, "ngram": NGram(), "draft": DraftModel(tiny_model(seed=1)),
            "eagle": Eagle(init_eagle_params(ec, jax.random.PRNGKey(5), scale=0.5), ec),
            "mtp": MTP(init_mtp_params(mc, jax.random.PRNGKey(4), scale=0.5), mc)}


def placements() -> list:
    """The PartitionSpecs the newest compiled program takes its arguments with."""
    exe = next(reversed(programs._PROGRAMS.values()))
    return sorted({str(s.spec) for s in jax.tree_util.tree_leaves(exe.input_shardings)
                   if isinstance(s, jax.sharding.NamedSharding)})


def main() -> None:
    assert jax.device_count() == 8, jax.devices()
    model = tiny_model()
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2, 3, 4][: 2 + i] for i in range(7)] + [[5] * 13]   # 8 lengths
    result = {"greedy": {}, "sampled": {}, "specs": {}}
    runs = [(name, d, None) for name, d in drafters().items()] + [("eagle tree", drafters()["eagle"],
                                                                   jaxspec.Tree(8, 3, 2))]
    for name, drafter, tree in runs:
        kw = dict(max_new_tokens=16, drafter=drafter, adaptive=False, num_draft_tokens=3, tree=tree)
        one = jaxspec.generate(model, prompts, **kw).tokens
        sampled_one = jaxspec.generate(model, prompts, sampling=jaxspec.Sampling(temperature=1.0), seed=3, **kw).tokens
        result["greedy"][name] = {"one": one}
        result["sampled"][name] = {"one": sampled_one}
        for shape in MESHES:
            mesh = make_mesh(*shape)
            result["greedy"][name][str(shape)] = jaxspec.generate(model, prompts, mesh=mesh, **kw).tokens
            result["specs"][f"{name} {shape}"] = placements()
            result["sampled"][name][str(shape)] = jaxspec.generate(
                model, prompts, sampling=jaxspec.Sampling(temperature=1.0), seed=3, mesh=mesh, **kw).tokens
    # the single-device logits where a greedy row departs (a float near-tie is the only excuse)
    result["top2_gap"] = {}
    for name, runs_ in result["greedy"].items():
        for shape, rows in runs_.items():
            for i, (a, b) in enumerate(zip(runs_["one"], rows)):
                if a != b:
                    pos = next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)
                    logits = np.asarray(model.logits([prompts[i] + a[:pos]])[0, -1])
                    top = np.sort(logits)[-2:]
                    result["top2_gap"][f"{name} {shape} row {i}"] = float(top[1] - top[0])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
