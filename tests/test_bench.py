"""The bench harness runs end to end on a tiny model (no figure is asserted: speed is noisy)."""
from __future__ import annotations

import glob
import json
import os
import re

import pytest

from jaxspec import bench
from jaxspec.bench.glance import GLANCE_BEGIN, GLANCE_END
from jaxspec.drafters import NGram
from jaxspec.sampling import Sampling

from .conftest import tiny_model


def test_bench_decoders_fixed_and_adaptive():
    m = tiny_model()
    prompts = [[1, 2, 3, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    result = bench.bench_decoders(m, prompts, 12, {"ngram": NGram()}, ks=(1, 3), batch=2)
    assert set(result) == {"plain", "ngram K=1", "ngram K=3", "ngram adaptive K<=3"}
    for label, d in result.items():
        assert d["tokens"] == 4 * 12 and d["tokens_per_second"] > 0 and d["speedup"] > 0   # 2 batches of 2
        assert d["decode_tokens_per_second"] > 0 and d["decode_speedup"] > 0
    assert len(result["ngram K=3"]["per_position_acceptance"]) == 3
    assert 1.0 <= result["ngram K=3"]["mean_accepted_length"] <= 4.0
    fixed = result["ngram K=3"]
    assert 0.5 < fixed["step_cost"] < 4                    # in plain steps (not seconds): 3 lookups and one
    assert fixed["predicted_speedup"] == pytest.approx(    # 4-token pass cost less than 3 + 1 plain steps
        fixed["mean_accepted_length"] / fixed["step_cost"])
    assert sum(result["ngram adaptive K<=3"]["steps_per_k"].values()) == result["ngram adaptive K<=3"]["target_steps"]
    assert all(d["rows_as_plain"] == d["rows"] == 4 for d in result.values())    # greedy: lossless, row by row
    assert bench.batches([[1], [2], [3]], 2) == [[[1], [2]], [[3], [1]]]      # cycled to fill the last batch
    assert bench.batches([[1], [2]], 4) == [[[1], [2], [1], [2]]]


def test_bench_repeats_rotate_decoders_and_give_each_repeats_speedup(monkeypatch):
    import importlib

    gen = importlib.import_module("jaxspec.generation")
    calls, real = [], gen.generate

    def recorded(model, group, **kw):
        calls.append((kw["drafter"] is not None, kw["adaptive"], tuple(map(tuple, group))))
        return real(model, group, **kw)

    monkeypatch.setattr(gen, "generate", recorded)
    m = tiny_model()
    prompts = [[1, 2, 3, 1, 2, 3], [4, 5, 6, 7]]
    result = bench.bench_decoders(m, prompts, 6, {"ngram": NGram()}, ks=(2,), batch=1, repeats=3)
    plain, fixed, adapt = (False, False), (True, False), (True, True)
    timed = [c[:2] for c in calls[3:] if c[2] == (tuple(prompts[0]),)]        # after the 3 compile runs
    assert timed == [plain, fixed, adapt, fixed, adapt, plain, adapt, plain, fixed]   # order rotated per repeat
    for label, d in result.items():
        assert d["tokens"] == 3 * 2 * 6                             # every repeat ran both prompts
        assert len(d["speedups"]) == len(d["decode_speedups"]) == 3
        assert min(d["speedups"]) <= d["speedup"] * (1 + 1e-9) and max(d["speedups"]) >= d["speedup"] * (1 - 1e-9)
    assert result["plain"]["speedups"] == [1.0, 1.0, 1.0]
    table = bench.markdown({"model": "tiny", "backend": "cpu", "prompts": 2, "max_new_tokens": 6, "repeats": 3,
                            "runs": [{"batch": 1, "temperature": 0.0, "decoders": result}]})
    lo, hi = min(result["ngram K=2"]["speedups"]), max(result["ngram K=2"]["speedups"])
    assert f"x ({lo:.2f}-{hi:.2f})" in table and "3 repeat(s)" in table
    with pytest.raises(ValueError, match="repeats"):
        bench.bench_decoders(m, prompts, 6, {}, ks=(2,), repeats=0)


def test_bench_counts_greedy_rows_that_differ_from_plain(monkeypatch):
    import importlib

    gen = importlib.import_module("jaxspec.generation")
    real = gen.generate

    def lossy(model, group, **kw):                     # a decoder that changes its last row's last token
        out = real(model, group, **kw)
        if kw["drafter"] is not None and not kw["adaptive"]:
            out.tokens[-1][-1] += 1
        return out

    monkeypatch.setattr(gen, "generate", lossy)
    m = tiny_model()
    prompts = [[1, 2, 3, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    result = bench.bench_decoders(m, prompts, 5, {"ngram": NGram()}, ks=(2,), batch=2)
    assert (result["ngram K=2"]["rows_as_plain"], result["ngram K=2"]["rows"]) == (2, 4)     # 1 of 2 rows, 2 groups
    assert result["ngram adaptive K<=2"]["rows_as_plain"] == 4
    plain_rows = real(m, prompts[:2], max_new_tokens=5).tokens           # groups [0, 1] and [2, 0]: rows 1, 0 changed
    assert result["ngram K=2"]["differences"] == [{"prompt": i, "position": len(plain_rows[i]) - 1,
                                                   "plain": plain_rows[i][-1], "this": plain_rows[i][-1] + 1}
                                                  for i in (1, 0)]
    assert result["ngram adaptive K<=2"]["differences"] == []
    table = bench.markdown({"model": "tiny", "backend": "cpu", "prompts": 3, "max_new_tokens": 5,
                            "runs": [{"batch": 2, "temperature": 0.0, "decoders": result}]})
    assert "| 2/4 |" in table and "| 4/4 |" in table
    sampled = bench.bench_decoders(m, prompts[:1], 5, {"ngram": NGram()}, ks=(2,), sampling=Sampling(temperature=0.7),
                                   adaptive=False)
    assert "rows" not in sampled["ngram K=2"]                     # other random draws: not comparable


def test_bench_run_writes_json_table_and_plots(tmp_path):
    import json

    f = tmp_path / "p.jsonl"
    f.write_text("".join(f'{{"prompt": "question {i} {i} {i}"}}\n' for i in range(3)))
    out = tmp_path / "out"
    r = bench.run(tiny_model(), prompt_file=str(f), num_prompts=3, max_new_tokens=8, out_dir=str(out), drafters=("ngram",), ks=(2,), batch_sizes=(1, 2),
                  temperatures=(0.0, 0.7))
    assert [(run["batch"], run["temperature"]) for run in r["runs"]] == [(1, 0.0), (2, 0.0), (1, 0.7), (2, 0.7)]
    saved = json.loads((out / "bench.json").read_text())
    assert saved["runs"][3]["decoders"]["ngram K=2"]["tokens"] == 4 * 8
    table = (out / "bench.md").read_text()
    assert "Batch 2, temperature 0.7" in table and "| ngram adaptive K<=2 |" in table and "Bandwidth bound" in table
    partial = bench.markdown({k: v for k, v in r.items() if k not in ("bandwidth", "memory")})   # mid-sweep
    assert "| ngram adaptive K<=2 |" in partial and "Bandwidth bound" not in partial
    for name in ("speedup.png", "acceptance.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = bench.report([str(out / "bench.json")])          # BENCHMARKS.md from the JSON
    assert text.startswith("# Benchmarks") and "-k 2 --batch-sizes 1,2 --temperatures 0,0.7" in text
    assert "| ngram adaptive K<=2 |" in text and saved["date"] in text and saved["machine"] in text


def test_report_renders_coverage_scaling_and_replay_results(tmp_path):
    """`bench --report` also takes train vocab's coverage.json, train scaling's scaling.json and train
    replay's replay.json."""
    cov = {"sizes": [4096, 32768], "eval": {"humaneval": [0.9754, 0.999]}, "data": {"train.jsonl": [0.91, 0.993]},
           "eval_answer_tokens": {"humaneval": 1993}, "data_answer_tokens": 2032732,
           **bench.provenance("jaxspec train vocab --data D")}
    scl = {"epochs": 1, "tokens_per_batch": 4096, "date": "2026-01-02", "runs": [
        {"fraction": 0.125, "shards": 11, "answer_tokens": 250000, "steps": 130, "mean_accepted_length": 1.734,
         "per_position_acceptance": [0.5, 0.2]},
        {"fraction": 0.25, "shards": 22, "answer_tokens": 500000, "steps": 260, "mean_accepted_length": None}]}
    (tmp_path / "coverage.json").write_text(json.dumps(cov))
    (tmp_path / "scaling.json").write_text(json.dumps(scl))
    text = bench.report([str(tmp_path / "scaling.json"), str(tmp_path / "coverage.json")])
    assert "| Vd | humaneval | data kept out: train.jsonl |" in text
    assert "| 32768 | 99.90% | 99.30% |" in text and "`jaxspec train vocab --data D` on " in text
    assert "| 0.125 | 11 | 250000 | 130 | 1.73 | 0.50 0.20 |" in text and "| 0.25 | 22 | 500000 | 260 | - | - |" in text
    assert "(command not recorded)" in text                      # scaling.json above has none
    assert text.index("draft-vocabulary coverage") < text.index("EAGLE data scaling")   # newest first
    rep = {"test_shards": "80-84", "store_shards": "0-79", "k": 5, "store_tokens": 1900000, "store_mib": 15.0,
           "store_build_seconds": 4.2, "date": "2026-01-03", "command": "jaxspec train replay --data D",
           "pools": {"code": {"answers": 3, "answer_tokens": 1234, "ngram": 1.8, "suffix": 2.791}}}
    (tmp_path / "replay.json").write_text(json.dumps(rep))
    text = bench.report([str(tmp_path / "replay.json")])
    assert "| pool | answers | answer tokens | ngram | suffix |" in text and "| code | 3 | 1,234 | 1.80 | 2.79 |" in text
    assert "shards 80-84" in text and "shards 0-79 (1,900,000 tokens" in text


def test_bench_prompt_file_and_drafter_names(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("".join(f'{{"prompt": "q{i}"}}\n' for i in range(10)))
    assert bench.read_prompts(str(f), 3) == ["q0", "q4", "q9"]   # spread over the file
    assert bench.read_prompts(str(f), 50) == [f"q{i}" for i in range(10)]
    with pytest.raises(ValueError, match="not found"):
        bench.read_prompts(str(tmp_path / "none.jsonl"), 3)
    g = tmp_path / "sources.jsonl"
    g.write_text("".join(f'{{"source": "{"code" if i % 3 == 0 else "math"}", "prompt": "q{i}"}}\n' for i in range(12)))
    assert bench.read_prompts(str(g), 2, "code") == ["q0", "q9"]   # spread over that source's rows
    assert bench.read_prompts(str(g), 50, "math") == [f"q{i}" for i in range(12) if i % 3]
    with pytest.raises(ValueError, match="chat.*code, math"):
        bench.read_prompts(str(g), 2, "chat")
    with pytest.raises(ValueError, match="unknown drafter"):
        bench.make_drafter("magic", tiny_model())
    with pytest.raises(ValueError, match="drafter folder not found: no/such/head"):   # a path, not a name
        bench.make_drafter("no/such/head", tiny_model())
    assert bench.make_drafter("ngram:4:2", None).max_ngram == 4


def test_default_prompts_and_shipped_heads_come_from_the_documented_root(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSPEC_PROMPTS", str(tmp_path))
    with pytest.raises(ValueError, match="eval.jsonl.*JAXSPEC_PROMPTS"):    # no built-in prompts instead
        bench.read_prompts(None, 3)
    (tmp_path / "eval.jsonl").write_text('{"prompt": "mine"}\n')
    assert bench.read_prompts(None, 3) == ["mine"]
    monkeypatch.setenv("JAXSPEC_ROOT", str(tmp_path))
    m = tiny_model()
    with pytest.raises(ValueError, match="no shipped eagle head.*JAXSPEC_ROOT"):
        bench.make_drafter("eagle", m)
    (tmp_path / "checkpoints" / m.source / "draft").mkdir(parents=True)
    with pytest.raises(ValueError, match="model folder|not found|config"):   # found there, and it is empty
        bench.make_drafter("draft", m)


def test_drafter_memory_counts_own_weights_and_state():
    import jax

    from jaxspec.drafters import DraftModel
    from jaxspec.heads import MTPConfig, init_mtp_params
    from jaxspec.drafters import MTP

    from .conftest import TINY

    m, small = tiny_model(), tiny_model(seed=1)
    got = bench.drafter_memory(m, DraftModel(small), K=3, prompt_len=20, max_new_tokens=12)
    S = 32 + 16 + 3 + 1                                                    # buckets of 20 and 12, + K + 1
    assert got["capacity"] == S
    assert got["parameters"] == sum(x.size for x in jax.tree_util.tree_leaves(small.params))
    kv = 2 * TINY.num_layers * S * TINY.num_kv_heads * TINY.head_dim * 4   # k and v, float32, batch 1
    assert got["state_bytes"] == kv + 3 * 4                 # + int32: the cache's length, tokens written, drafts fed
    assert bench.drafter_memory(m, DraftModel(m), 3, 20, 12)["parameters"] == 0   # self-drafting adds none
    assert bench.drafter_memory(m, NGram(), 3, 20, 12)["weight_bytes"] == 0
    cfg = MTPConfig.for_target(TINY, num_modules=2, draft_vocab_size=40)
    head = init_mtp_params(cfg, jax.random.PRNGKey(0))
    got = bench.drafter_memory(m, MTP(head, cfg), 3, 20, 12)
    own = sum(x.size for x in jax.tree_util.tree_leaves(head) if x.dtype != jax.numpy.int32)
    assert got["parameters"] == own + TINY.hidden_size * 40                # + the target rows it gathers


def test_bench_trees_report_verify_costs_placement_and_a_plot(tmp_path):
    import json

    from jaxspec import Tree

    f = tmp_path / "p.jsonl"
    f.write_text("".join(f'{{"prompt": "question {i} {i} {i}"}}\n' for i in range(2)))
    out = tmp_path / "out"
    # one drafter: NGram trees are bench-run in the accelerator preset's test and verified in test_tree
    r = bench.run(tiny_model(), prompt_file=str(f), num_prompts=2, max_new_tokens=8, out_dir=str(out),
                  drafters=("truncated:1",), ks=(2,), trees=[Tree(4, 2, 2), Tree(8, 3, 2)])
    decoders = r["runs"][0]["decoders"]
    for name in ("truncated:1",):
        for n in (4, 8):
            d = decoders[f"{name} tree N={n}"]
            assert d["tree"]["budget"] == n and d["rows_as_plain"] == d["rows"] == 2 and d["step_cost"] > 0
        assert decoders[f"{name} adaptive K<=2 +tree N=8"]["rows_as_plain"] == 2
    assert set(r["verify_costs"]) == {"2", "4", "8"} and all(c > 0 for c in r["verify_costs"].values())
    saved = json.loads((out / "bench.json").read_text())
    assert saved["placement"]["mesh"] is None and saved["placement"]["device_kind"]
    assert "Cost of one target pass over N + 1 tokens" in (out / "bench.md").read_text()
    assert (out / "trees.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_accelerator_preset_fills_what_is_not_given_and_runs_in_a_tiny_setting(tmp_path):
    """`jaxspec bench --preset accelerator` on the CPU, shrunk by flags: the preset's K values, trees
    and temperatures reach the sweep, flags given win, and JSON, table and plots are written."""
    from jaxspec import cli
    from jaxspec.loading import default_dtype

    args = cli.build_parser().parse_args(["bench", "--preset", "accelerator", "--num-prompts", "2",
                                          "--max-new-tokens", "6", "--batch-sizes", "1,2", "--drafters", "ngram",
                                          "--trees", "4:2:2", "--out", str(tmp_path)])
    cli.bench_settings(args)
    assert (args.k, args.temperatures, args.num_prompts, args.out) == ("3,5", "0,0.7", 2, str(tmp_path))
    assert cli.build_parser().parse_args(["bench"]).k is None and str(default_dtype().dtype) == "float32"
    f = tmp_path / "p.jsonl"
    f.write_text("".join(f'{{"prompt": "question {i} {i} {i}"}}\n' for i in range(2)))
    r = bench.run(tiny_model(), prompt_file=str(f), num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens,
                  out_dir=args.out, drafters=["ngram"], ks=[int(k) for k in args.k.split(",")],
                  batch_sizes=[1, 2], temperatures=[float(t) for t in args.temperatures.split(",")],
                  trees=cli._trees(args.trees), adaptive=False)
    assert [(run["batch"], run["temperature"]) for run in r["runs"]] == [(1, 0.0), (2, 0.0), (1, 0.7), (2, 0.7)]
    assert {"ngram K=3", "ngram K=5", "ngram tree N=4"} <= set(r["runs"][3]["decoders"])
    for name in ("bench.json", "bench.md", "speedup.png", "trees.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_benchmarks_md_is_generated_from_the_committed_results():
    """BENCHMARKS.md is `make benchmarks`: `bench --report` over benchmarks/*.json, each dated, so no figure
    in it lacks the result file and command it came from."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = sorted(glob.glob(os.path.join(root, "benchmarks", "*.json")))
    assert paths, "benchmarks/ holds no result files"
    for path in paths:
        with open(path) as f:
            r = json.load(f)
        assert r.get("date") and r.get("command") and r.get("machine"), f"{path} lacks its date, command or machine"
        assert not re.search(r"(^| |=)/", r["command"]), f"{path}: a machine's absolute path in {r['command']!r}"
    with open(os.path.join(root, "BENCHMARKS.md")) as f:
        assert f.read() == bench.report(paths), "BENCHMARKS.md is stale: run `make benchmarks`"
    with open(os.path.join(root, "README.md")) as f:
        readme = f.read()
    table = bench.glance(bench.read_results(paths), "smollm2-135m-instruct")
    assert "| suffix K=5 |" in table and bench.with_glance(readme, table) == readme, \
        "README.md's table at a glance is stale: run `make benchmarks`"


def test_the_table_at_a_glance_keeps_the_newest_batch_1_greedy_result_of_each_shipped_drafter():
    def result(date, source, decoders, batch=1, temperature=0.0):
        return (date, f"{date}-{source}.json", {
            "model": "m", "source": source, "prompts": 8, "max_new_tokens": 128, "machine": "2 CPU cores",
            "command": f"jaxspec bench --source {source}",
            "runs": [{"batch": batch, "temperature": temperature,
                      "decoders": {name: {"mean_accepted_length": mal, "speedup": x} for name, (mal, x) in decoders.items()}}]})
    results = [result("2026-01-01", "code", {"plain": (1, 1), "eagle K=5": (1.2, 0.5), "eagle:runs/x K=5": (3, 3)}),
               result("2026-01-02", "code", {"eagle K=5": (2.2, 1.5), "suffix tree N=32": (2.9, 0.8)}),
               result("2026-01-03", "chat", {"eagle adaptive K<=5": (1.4, 1.1)}),
               result("2026-01-04", "chat", {"eagle K=5": (9, 9)}, batch=4),
               result("2026-01-04", "math", {"eagle K=5": (9, 9)}, temperature=0.7)]
    table = bench.glance(results)
    assert "| drafter | chat | code |" in table                         # batch 4 and sampled runs left out
    assert "| eagle K=5 | - | 2.20, 1.50x [2] |" in table                 # the newest of the two
    assert "| eagle adaptive K<=5 | 1.40, 1.10x [1] | - |" in table
    assert "| suffix tree N=32 | - | 2.90, 0.80x [2] |" in table
    assert "runs/x" not in table and "| plain |" not in table and "2026-01-01" not in table
    assert "[1] 2026-01-03, 8 prompts, up to 128 new tokens, 2 CPU cores: `jaxspec bench --source chat`" in table
    later = ("2026-01-02", "later-code.json", result("2026-01-02", "code", {"eagle K=5": (2.5, 1.7)})[2])   # same day
    later[2]["time"], results[1][2]["time"] = "18:00:00", "09:00:00"          # a later time
    assert "| eagle K=5 | - | 2.50, 1.70x [2] |" in bench.glance([later] + results)
    assert "| eagle K=5 | - | 2.50, 1.70x [2] |" in bench.glance(results + [later])
    readme = f"# x\n\n{GLANCE_BEGIN}\nold\n{GLANCE_END}\nafter\n"
    assert bench.with_glance(readme, "new") == f"# x\n\n{GLANCE_BEGIN}\nnew\n{GLANCE_END}\nafter\n"
    with pytest.raises(ValueError, match="block"):
        bench.with_glance("# no markers", "new")


def test_bench_defaults_to_every_shipped_drafter_and_a_dated_results_folder():
    from jaxspec import cli
    args = cli.build_parser().parse_args(["bench"])
    cli.bench_settings(args)
    assert args.drafters == "ngram,suffix,eagle,mtp,draft"
    assert re.fullmatch(r"runs/bench-\d{4}-\d\d-\d\d-\d{6}", args.out.replace(os.sep, "/")), args.out
    args = cli.build_parser().parse_args(["bench", "--model", "some/folder", "--out", "here"])
    cli.bench_settings(args)
    assert (args.drafters, args.out) == ("ngram", "here")


@pytest.mark.slow
def test_bench_keeps_its_results_without_out(tmp_path):
    """`jaxspec bench` run as a user would, no --out: bench.json lands in a new runs/bench-* folder of
    the working directory, and the command says where."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "jaxspec.cli", "bench", "--num-prompts", "1", "--max-new-tokens",
                           "16", "--drafters", "ngram", "--no-adaptive"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    kept = glob.glob(str(tmp_path / "runs" / "bench-*" / "bench.json"))
    assert len(kept) == 1 and json.load(open(kept[0]))["runs"][0]["decoders"]["ngram K=5"]["rows_as_plain"] == 1
    assert f"results kept in {os.path.relpath(os.path.dirname(kept[0]), tmp_path)}/" in done.stderr


def test_recorded_commands_name_no_machine_paths(monkeypatch, tmp_path):
    """A result file's command names the cache folder $JAXSPEC_CACHE and the repository's paths relative
    to it; other words stay as typed."""
    import tempfile

    from jaxspec import paths
    from jaxspec.bench.sweep import portable_paths
    monkeypatch.setenv("JAXSPEC_CACHE", str(tmp_path / "cache"))
    command = (f"jaxspec train vocab --data {paths.root()}/checkpoints/x/data --out {tmp_path}/cache/vocab "
               f"--eval-file {tempfile.gettempdir()}/e.jsonl --sizes 4096 --data-dir {paths.root()}")
    assert portable_paths(command) == ("jaxspec train vocab --data checkpoints/x/data --out $JAXSPEC_CACHE/vocab "
                                       "--eval-file $TMPDIR/e.jsonl --sizes 4096 --data-dir .")
