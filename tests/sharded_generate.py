"""Run as a script with XLA_FLAGS=--xla_force_host_platform_device_count=8 (tests/test_sharding.py):
generation on one device and on meshes (8, 1), (2, 4) and, for SmolLM2, (4, 2); prints one JSON object.

A random tiny target with every drafter fixed and an EAGLE tree; with argv[1] "real" also SmolLM2 with
its shipped drafters, adaptive (the case that deadlocked on (4, 2))."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jaxspec  # noqa: E402
from jaxspec.analysis import expected_tokens  # noqa: E402
from jaxspec.decode import programs  # noqa: E402
from jaxspec.drafters import MTP, DraftModel, Eagle, NGram, shipped  # noqa: E402
from jaxspec.heads import EagleConfig, MTPConfig, init_eagle_params, init_mtp_params  # noqa: E402
from jaxspec.models import stack_layers  # noqa: E402
from jaxspec.sharding import make_mesh  # noqa: E402
from tests.conftest import TINY, tiny_model  # noqa: E402

MESHES = [(8, 1), (4, 2), (2, 4)]
TINY_MESHES = [(8, 1), (2, 4)]          # rows over data, weights over model; (4, 2): the real runs
PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2][: 2 + i] for i in range(7)] + [[5] * 11]     # 8 lengths (distributed_run)
NGRAM_COSTS = {0: 1.0, 2: 1.3}         # pinned step costs (plain steps) for NGram's contexts
BREAK_EVEN = 1.001                      # a model drafter's arms cost this much more than its prior pays for
QUESTIONS = ["Hi", "What is 2+2?", "Write a haiku about the sea.", "Name three colors.", "Tell me a joke.",
             "How do I sort a list in Python?", "Explain gravity to a child in simple words.", "Why?"]


def drafters():
    ec = EagleConfig.for_target(TINY, draft_vocab_size=TINY.vocab_size)
    mc = MTPConfig.for_target(TINY, num_modules=2, draft_vocab_size=TINY.vocab_size)
    return {"plain": None, "ngram": NGram(), "draft": DraftModel(tiny_model(seed=1)),
            "eagle": Eagle(init_eagle_params(ec, jax.random.PRNGKey(5), scale=0.5), ec),
            "mtp": MTP(init_mtp_params(mc, jax.random.PRNGKey(4), scale=0.5), mc)}


def tiny_runs(model) -> list:
    """(name, target, drafter, generate kwargs): every drafter fixed at K = 3 and an EAGLE tree (adaptive
    loops: real_runs)."""
    fixed = dict(max_new_tokens=16, adaptive=False, num_draft_tokens=3)
    runs = [(name, model, d, fixed) for name, d in drafters().items()]
    return runs + [("eagle tree", model, drafters()["eagle"], {**fixed, "tree": jaxspec.Tree(8, 3, 2)})]


def real_runs(model) -> list:
    """SmolLM2's shipped drafters, adaptive (the default) with switching costs (switching_costs), K = 2
    (arms 0 and 2) and a tree offered to EAGLE. EAGLE runs on the model as loaded (30 layers unrolled:
    the case that deadlocked on (4, 2)); the others on the same weights stacked (scanned layers: a third
    of the compile time). Then EAGLE and MTP at K = 2 fixed for 16 tokens: sampled drafts in every step
    (their draft vocabularies once made (2, 4)'s sampled rows differ from one device's)."""
    stacked = dataclasses.replace(model, params={**model.params, "layers": stack_layers(model.params["layers"])})
    kw = dict(max_new_tokens=10, num_draft_tokens=2)
    tree = jaxspec.Tree(8, 3, 2)
    eagle = shipped(model, "eagle")
    runs = [("eagle", model, eagle, {**kw, "tree": tree, "step_costs": switching_costs(eagle, tree)})]
    heads = {kind: shipped(model, kind) for kind in ("mtp", "draft")}
    runs += [(kind, stacked, d, {**kw, "step_costs": switching_costs(d)}) for kind, d in heads.items()]
    runs += [("ngram", stacked, NGram(), {**kw, "step_costs": NGRAM_COSTS})]
    fixed = dict(max_new_tokens=16, adaptive=False, num_draft_tokens=2)    # K = 2 every step: many sampled drafts
    return runs + [(f"{kind} K=2", stacked, d, fixed) for kind, d in (("eagle", eagle), ("mtp", heads["mtp"]))]


def switching_costs(drafter, tree=None) -> dict:
    """Pinned step costs (plain steps) that put every speculative arm just short of paying at the drafter's
    prior acceptance a: K = 0 wins the first step, and as its expected loss is near 0 the next step
    probes K = 2 (policy.choose), whatever the heads' strength; then the text's acceptance decides."""
    a = max(drafter.prior_acceptance)
    costs = {0: 1.0, 2: BREAK_EVEN * float(expected_tokens(a, 2))}
    return costs if tree is None else {**costs, "tree": BREAK_EVEN * float(expected_tokens(a, tree.depth))}


def placements() -> list:
    """The PartitionSpecs the newest compiled program takes its arguments with."""
    exe = next(reversed(programs._PROGRAMS.values()))
    return sorted({str(s.spec) for s in jax.tree_util.tree_leaves(exe.input_shardings)
                   if isinstance(s, jax.sharding.NamedSharding)})


def cross_row_collectives() -> list:
    """Collectives of the newest compiled loop that move rows between devices: on a (data, 1) mesh a
    row's work needs none, only all-reduces for batch-wide decisions (every row done, the policy's
    worst row). top_k is exempt: XLA gathers its input whatever its sharding (trees; see rowwise.py)."""
    text = next(reversed(programs._PROGRAMS.values())).as_text()
    pattern = r"= \S+ (all-gather|collective-permute|all-to-all|reduce-scatter)\(.*?op_name=\"([^\"]*)\""
    found = re.findall(pattern, text)
    return sorted({f"{kind} from {op.split('/')[-1]}" for kind, op in found if op.split("/")[-1] != "top_k"})


def run_all(prompts, runs, meshes) -> dict:
    """Each run on one device and on every mesh; a batch holds each prompt twice, greedy and sampled at
    temperature 1 (per-row sampling: one compiled loop serves both)."""
    result = {"greedy": {}, "sampled": {}, "specs": {}, "collectives": {}, "arms": {},
              "meshes": [str(shape) for shape in meshes]}
    sampling = [jaxspec.Sampling()] * len(prompts) + [jaxspec.Sampling(temperature=1.0)] * len(prompts)
    for name, model, drafter, kw in runs:
        for shape in [None] + meshes:
            key = "one" if shape is None else str(shape)
            out = jaxspec.generate(model, prompts * 2, sampling=sampling, seed=3, drafter=drafter,
                                   mesh=None if shape is None else make_mesh(*shape), **kw)
            result["greedy"].setdefault(name, {})[key] = out.tokens[:len(prompts)]
            result["sampled"].setdefault(name, {})[key] = out.tokens[len(prompts):]
            result["arms"].setdefault(name, {})[key] = out.stats.steps_per_k
            if shape is not None:
                result["specs"][f"{name} {shape}"] = placements()
            if shape is not None and shape[1] == 1:
                result["collectives"][name] = cross_row_collectives()
    result["top2_gap"] = near_ties(runs[0][1], prompts, result["greedy"])
    return result


def near_ties(model, prompts, greedy: dict) -> dict:
    """The single-device top-2 logit gap where a greedy row departs (a float near-tie is the only excuse)."""
    gaps = {}
    for name, runs_ in greedy.items():
        for shape, rows in runs_.items():
            for i, (a, b) in enumerate(zip(runs_["one"], rows)):
                if a != b:
                    pos = next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)
                    logits = np.asarray(model.logits([prompts[i] + a[:pos]])[0, -1])
                    top = np.sort(logits)[-2:]
                    gaps[f"{name} {shape} row {i}"] = float(top[1] - top[0])
    return gaps


def main() -> None:
    """One JSON object: {"tiny": results, "real": results} (real only with argv[1] == "real")."""
    assert jax.device_count() == 8, jax.devices()
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2, 3, 4][: 2 + i] for i in range(7)] + [[5] * 13]   # 8 lengths
    result = {"tiny": run_all(prompts, tiny_runs(tiny_model()), TINY_MESHES)}
    if sys.argv[1:] == ["real"]:
        model = jaxspec.load("smollm2-135m-instruct")
        chats = [model.tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
                 for q in QUESTIONS]
        programs.clear()                                   # the tiny programs are done with
        result["real"] = run_all(chats, real_runs(model), MESHES)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
