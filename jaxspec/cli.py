"""Command line: `jaxspec demo | generate ...`."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from importlib.metadata import entry_points

DEFAULT_MODEL = "smollm2-135m-instruct"
DEMO_QUESTION = "Explain in three sentences why the sky is blue."


def _sampling_args(p: argparse.ArgumentParser):
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    _mesh_arg(p)


def _mesh_arg(p: argparse.ArgumentParser):
    p.add_argument("--mesh", default=None,
                   help="run sharded on a device mesh, e.g. data=4,model=2 (jaxspec/sharding.py)")


def _mesh(args):
    from .sharding import parse_mesh
    return parse_mesh(args.mesh) if getattr(args, "mesh", None) else None


class _Printer:
    """generate(stream=...) for one row: prints the text each target pass adds (decoding the whole
    answer so far, so pieces of a character or a word wait for the rest)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.tokens, self.shown = tokenizer, [], ""

    def __call__(self, rows: list) -> None:
        self.tokens += rows[0]
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self.shown):
            return
        sys.stdout.write(text[len(self.shown):])
        sys.stdout.flush()
        self.shown = text


def _run(model_name: str, prompt: str, args, chat: bool = True, stream: bool = False):
    import jaxspec
    from .tokenizer import prompt_ids

    sampling = jaxspec.Sampling(temperature=args.temperature, top_k=args.top_k,
                                top_p=args.top_p, min_p=args.min_p)  # bad settings fail before loading
    started = time.perf_counter()
    model = jaxspec.load(model_name)
    load_s = time.perf_counter() - started
    if chat:
        ids = prompt_ids(model.tokenizer, prompt)
    else:
        ids = model.tokenizer.encode(prompt)
    drafter = None
    if getattr(args, "drafter", None):
        from .bench import make_drafter
        drafter = make_drafter(args.drafter, model)
    trees = _trees(getattr(args, "tree", None))
    printer = _Printer(model.tokenizer) if stream else None
    out = jaxspec.generate(model, [ids], max_new_tokens=args.max_new_tokens, sampling=sampling,
                           seed=args.seed, mesh=_mesh(args), drafter=drafter, num_draft_tokens=getattr(args, "k", 5),
                           adaptive=not getattr(args, "no_adaptive", False), tree=trees[0] if trees else None,
                           stream=printer)
    if printer is not None:
        rest = out.texts[0][len(printer.shown):] if out.texts[0].startswith(printer.shown) else ""
        print(rest)                                         # what a last piece held back, and the line's end
    return model, out, load_s


def _speculation(s) -> str:
    """'; tokens per target pass, drafts kept, passes by draft length' for a speculative run, '' for plain."""
    if s.acceptance_rate is None:
        return " (decoded plainly)" if s.decoded_plainly else ""
    passes = ", ".join(f"{n} {'plain' if k == 0 else 'over a tree' if k == 'tree' else f'with {k} drafts'}"
                       for k, n in s.steps_per_k.items() if n)
    return (f"; {s.mean_accepted_length:.2f} tokens per target pass, {s.acceptance_rate:.0%} of drafts kept"
            + (f"; target passes: {passes}" if passes else ""))


def _why_slower(t) -> str:
    """One line on why a speculative run was slower than plain decoding: its costliest arm's step cost
    and the acceptance that cost needs, against the acceptance it got."""
    from .analysis import acceptance_to_pay
    if t.note:
        return t.note
    drafted = {k: c for k, c in t.step_costs.items() if k not in (0, "tree")}
    if not drafted or t.acceptance_rate is None:
        return "the loop's own work around each target pass outweighed what the drafts saved"
    k = max(drafted)
    return (f"on this CPU a target pass that checks {k} drafts costs {drafted[k]:.2f} plain steps, which pays "
            f"only when at least {acceptance_to_pay(k, drafted[k]):.0%} of drafts are kept per token; "
            f"this answer kept {t.acceptance_rate:.0%}")


def _timing(s) -> str:
    return f", timing step costs {s.cost_timing_seconds:.1f} s" if s.cost_timing_seconds else ""


def cmd_generate(args) -> int:
    if not args.prompt.strip():
        raise ValueError("--prompt is empty")
    stream = not (args.json or args.no_stream)
    _, out, load_s = _run(args.model, args.prompt, args, chat=not args.no_chat, stream=stream)
    s = out.stats
    if args.json:
        print(json.dumps({"text": out.texts[0], "tokens": out.tokens[0], "load_seconds": load_s,
                          "stats": s.__dict__}))
        return 0
    if not stream:
        print(out.texts[0])
    print(f"\n[{s.new_tokens} tokens; the first {s.first_token_seconds:.1f} s after the call (compiling "
          f"{s.compile_seconds:.1f} s{_timing(s)}, the prompt's pass {s.prefill_seconds:.2f} s), then "
          f"{s.decode_tokens_per_second:.1f} tokens/s{_speculation(s)}; load {load_s:.1f} s]", file=sys.stderr)
    if s.note:
        print(f"[{s.note}]", file=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    """A chat answer plain, then with a drafter (--drafter, default ngram), side by side."""
    import jaxspec
    from .bench import make_drafter
    from .tokenizer import prompt_ids

    print(f"jaxspec demo: {args.model}, greedy: plain decoding, then speculative with {args.drafter}\n")
    print(f"user> {DEMO_QUESTION}\n")
    drafter_spec, args.drafter = args.drafter, None
    model, out, load_s = _run(args.model, DEMO_QUESTION, args)
    s = out.stats
    print(f"assistant> {out.texts[0]}\n")
    print(f"{s.new_tokens} new tokens in {s.wall_seconds:.2f} s = {s.tokens_per_second:.1f} tokens/s: the prompt "
          f"{s.prefill_seconds:.2f} s, then {s.decode_tokens_per_second:.1f} tokens/s "
          f"(compile {s.compile_seconds:.1f} s, load {load_s:.1f} s)")
    ids = prompt_ids(model.tokenizer, DEMO_QUESTION)
    spec = jaxspec.generate(model, [ids], max_new_tokens=args.max_new_tokens, seed=args.seed,
                            drafter=make_drafter(drafter_spec, model), num_draft_tokens=args.k)
    t = spec.stats
    print(f"\nspeculative ({drafter_spec}, adaptive K <= {args.k}): "
          f"{'the same answer' if spec.tokens == out.tokens else 'A DIFFERENT ANSWER'}; {t.new_tokens} new tokens "
          f"in {t.wall_seconds:.2f} s = {t.tokens_per_second:.1f} tokens/s "
          f"({t.decode_tokens_per_second / s.decode_tokens_per_second:.2f}x plain after the prompt)"
          f"{_speculation(t)} (compile {t.compile_seconds:.1f} s{_timing(t)})")
    if t.decode_tokens_per_second < s.decode_tokens_per_second:
        print(f"why slower: {_why_slower(t)}")
    return 0


def _numbers(text: str, kind, flag: str) -> list:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated numbers, got {text!r}") from None
    if not values:
        raise ValueError(f"{flag} is empty")
    return values


def _trees(text: str | None) -> list:
    """--trees "16,32" or "32:5:4": budgets N (depth min(5, N), top-k 4) or N:depth:top_k -> [Tree]."""
    from .tree import Tree
    trees = []
    for spec in (text or "").split(","):
        if spec.strip():
            parts = _numbers(spec.replace(":", ","), int, "--trees")
            if len(parts) not in (1, 3):
                raise ValueError(f"--trees takes N or N:depth:top_k, got {spec!r}")
            trees.append(Tree(parts[0], min(5, parts[0]), 4) if len(parts) == 1 else Tree(*parts))
    return trees


BENCH_DEFAULTS = {"num_prompts": 4, "max_new_tokens": 128, "drafters": None, "k": "5", "batch_sizes": "1",
                  "temperatures": "0", "trees": None, "out": None}      # drafters, out: see bench_settings
# --preset accelerator: the sweep to run when a GPU or TPU is at hand (bfloat16 there, jaxspec.load)
PRESETS = {"accelerator": {"num_prompts": 128, "max_new_tokens": 128, "drafters": "ngram,eagle,mtp,draft",
                           "k": "3,5", "batch_sizes": "1,8,32,128", "temperatures": "0,0.7", "trees": "32",
                           "out": "runs/accelerator"}}


def bench_settings(args) -> None:
    """Fill the bench flags left unset: from --preset, else BENCH_DEFAULTS (flags given win); then
    drafters: ngram and every drafter shipped for the model; out: a new dated folder under runs/."""
    from .drafters import shipped_kinds
    preset = PRESETS[args.preset] if args.preset else {}
    for name, default in BENCH_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, preset.get(name, default))
    if args.drafters is None:
        args.drafters = ",".join(["ngram"] + shipped_kinds(args.model))
    if args.out is None:
        args.out = os.path.join("runs", time.strftime("bench-%Y-%m-%d-%H%M%S"))


def cmd_bench(args) -> int:
    from . import bench

    if args.report:
        text = bench.report(args.report)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        else:
            print(text)
        if args.readme:
            with open(args.readme) as f:
                readme = f.read()
            table = bench.glance(bench.read_results(args.report), DEFAULT_MODEL)
            with open(args.readme, "w") as f:
                f.write(bench.with_glance(readme, table))
        return 0
    bench_settings(args)
    drafters = [d for d in args.drafters.split(",") if d]
    ks = _numbers(args.k, int, "-k")
    batch_sizes = _numbers(args.batch_sizes, int, "--batch-sizes")
    temperatures = _numbers(args.temperatures, float, "--temperatures")
    if min(ks) < 1 or min(batch_sizes) < 1 or min(temperatures) < 0 or args.repeats < 1:
        raise ValueError("-k, --batch-sizes and --repeats need values >= 1, --temperatures values >= 0")
    result = bench.run(args.model, prompt_file=args.prompts, num_prompts=args.num_prompts,
                       max_new_tokens=args.max_new_tokens, peer=args.peer, out_dir=args.out,
                       drafters=drafters, ks=ks, batch_sizes=batch_sizes, temperatures=temperatures,
                       adaptive=not args.no_adaptive, repeats=args.repeats, source=args.source,
                       trees=_trees(args.trees), mesh=_mesh(args), command="jaxspec " + " ".join(sys.argv[1:]))
    print(bench.markdown(result))
    print(f"results kept in {args.out}/: bench.json, bench.md and the plots", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxspec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="a chat answer from the default model, with tokens/s")
    demo.add_argument("--model", default=DEFAULT_MODEL)
    demo.add_argument("--drafter", default="ngram", help="the drafter of the speculative run (as generate's)")
    demo.add_argument("-k", "--k", type=int, default=5, help="draft tokens per step, at most")
    _sampling_args(demo)
    gen = sub.add_parser("generate", help="generate from one prompt")
    gen.add_argument("--model", default=DEFAULT_MODEL, help="a named model, a .gguf file or a HF folder")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--no-chat", action="store_true", help="encode the prompt as is, no chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object (not streamed)")
    gen.add_argument("--no-stream", action="store_true", help="print the answer at the end, not as it is made")
    gen.add_argument("--drafter", default=None, help="speculate with ngram, suffix, eagle, mtp, draft (shipped for "
                     "the model), suffix:DATA, eagle:PATH, mtp:PATH, draft:PATH or a head's folder (default: "
                     "plain decoding)")
    gen.add_argument("-k", "--k", type=int, default=5, help="draft tokens per step (adaptive: at most)")
    gen.add_argument("--no-adaptive", action="store_true", help="draft K tokens every step")
    gen.add_argument("--tree", default=None, help="also draft token trees: N or N:depth:top_k")
    _sampling_args(gen)
    b = sub.add_parser("bench", help="decoding speed, measured as ratios in one run")
    b.add_argument("--model", default=DEFAULT_MODEL)
    b.add_argument("--prompts", default=None, help="JSONL with a 'prompt' field (default: eval.jsonl)")
    b.add_argument("--source", default=None,
                   help="only the prompts of this source (the rows' 'source' field: gsm8k-test, humaneval, vicuna-80)")
    b.add_argument("--report", nargs="+", default=None, metavar="JSON",
                   help="write BENCHMARKS.md (to --out, else print it) from these result files: bench.json, "
                        "coverage.json of `train vocab`, scaling.json of `train scaling`; runs nothing")
    b.add_argument("--readme", default=None, metavar="FILE",
                   help="with --report: also write the default model's table at a glance into FILE (README.md) "
                        "between its markers")
    b.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="accelerator: every drafter at K = 3, 5 and a 32-node tree, batch 1-128, greedy and 0.7, "
                        "128 prompts, into runs/accelerator (flags given override it)")
    b.add_argument("--num-prompts", type=int, default=None, help="default 4")
    b.add_argument("--max-new-tokens", type=int, default=None, help="default 128")
    b.add_argument("--peer", choices=["transformers"], default=None)
    b.add_argument("--out", default=None, help="folder for bench.json, bench.md, speedup.png, acceptance.png "
                                                   "(default: runs/bench-DATE-TIME)")
    b.add_argument("--drafters", default=None,
                   help="comma-separated: ngram, ngram:MAX:MIN, suffix, eagle, mtp, draft (shipped for the "
                        "model), suffix:DATA, eagle:PATH, mtp:PATH, draft:PATH, truncated:N ('' = plain only; "
                        "default: ngram and every drafter shipped for the model)")
    b.add_argument("-k", "--k", default=None, help="comma-separated fixed draft lengths K (adaptive: up to the "
                                                   "largest; default 5)")
    b.add_argument("--batch-sizes", default=None, help="comma-separated, e.g. 1,4,16,64 (default 1)")
    b.add_argument("--temperatures", default=None, help="comma-separated, e.g. 0,0.7 (0 = greedy; default 0)")
    b.add_argument("--no-adaptive", action="store_true", help="fixed K only: leave out adaptive speculation")
    b.add_argument("--trees", default=None,
                   help="token trees to bench too: comma-separated budgets N (depth 5, top-k 4) or N:depth:top_k")
    _mesh_arg(b)
    b.add_argument("--repeats", type=int, default=1,
                   help="run every decoder this many times (order rotated), with the range of its speedups")
    for plugin in entry_points(group="jaxspec.commands"):   # e.g. `train`, from the train package
        plugin.load()(sub)
    _show_defaults(parser)
    return parser


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" where the help does not already say the default and X is not None."""

    def _get_help_string(self, action):
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """--help of every command and subcommand shows each option's default."""
    parser.formatter_class = _DefaultsFormatter
    for action in parser._actions:
        if action.help is None and action.option_strings and action.default is not None:
            action.help = "default: %(default)s"
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _show_defaults(child)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"demo": cmd_demo, "generate": cmd_generate, "bench": cmd_bench}
    try:
        if args.command not in handlers:                 # train: its mesh (if any) set for the whole command
            mesh = _mesh(args)
            if mesh is None:
                return args.handler(args)
            import jax
            with jax.set_mesh(mesh):
                return args.handler(args)
        return handlers[args.command](args)
    except ValueError as e:
        print(f"jaxspec: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
