"""`jaxspec train ...` subcommands, registered through the jaxspec.commands entry point."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from .prompts import DEFAULT_DIR

DEFAULT_MIX = "train.jsonl=0.2,train-mix.jsonl:code=0.4,train-mix.jsonl:chat=0.4"


def cmd_data(args) -> int:
    import jaxspec

    from . import data

    model = jaxspec.load(args.target)
    writer = None
    if args.writer:
        from jaxspec.drafters import DraftModel
        draft = DraftModel.load(args.writer)
        draft.check_target(model)
        writer = draft.model
    manifest = data.make_data(model, args.prompts or args.mix, args.out, num_prompts=args.num_prompts,
                              heldout=args.heldout, max_new_tokens=args.max_new_tokens,
                              batch_size=args.batch_size, shard_size=args.shard_size, seed=args.seed,
                              sampled_fraction=args.sampled_fraction, temperature=args.temperature,
                              prompts_dir=None if args.prompts else args.prompts_dir, new_part=args.new_part,
                              writer=writer)
    counts = data.summary(args.out)
    print(f"{args.out}: {counts['examples']} examples, {counts['prompt_tokens']} prompt tokens, "
          f"{counts['answer_tokens']} answer tokens ({counts['sampled_answers']} answers sampled; "
          f"target {manifest['target']})")
    for pool, c in counts["pools"].items():
        print(f"  {pool}: {c['examples']} examples, {c['answer_tokens']} answer tokens")
    return 0


def _provenance() -> dict:
    """The date, machine and this command line, for the result files a command writes."""
    from jaxspec.bench import provenance
    return provenance("jaxspec " + " ".join(sys.argv[1:]))


def cmd_vocab(args) -> int:
    import jaxspec

    from .coverage import vocab_report

    model = jaxspec.load(args.target)
    sizes = [int(x) for x in args.sizes.split(",") if x]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--sizes needs positive integers, got {args.sizes!r}")
    r = vocab_report(model, args.data, sizes, args.eval_file, args.eval_prompts, args.eval_tokens, args.out,
                     provenance=_provenance())
    print(f"coverage of the target's answer tokens ({r['data_answer_tokens']} answer tokens in {args.data}; "
          f"eval: greedy answers to {args.eval_prompts} prompts per source, {args.eval_tokens} tokens)")
    print("| Vd | " + " | ".join(list(r["eval"]) + [f"data kept out: {p}" for p in r["data"]]) + " |")
    print("|---:|" + "---:|" * (len(r["eval"]) + len(r["data"])))
    for i, size in enumerate(r["sizes"]):
        cells = [f"{v[i]:.2%}" for v in list(r["eval"].values()) + list(r["data"].values())]
        print(f"| {size} | " + " | ".join(cells) + " |")
    return 0


def _schedule(args):
    """The TrainConfig of a `jaxspec train HEAD` command; warm-up defaults to a tenth of --steps, at most 100."""
    from . import loop

    warmup = min(100, args.steps // 10) if args.warmup is None else args.warmup
    if not 0 <= warmup < args.steps:
        raise ValueError(f"--warmup {warmup} must be at least 0 and below --steps {args.steps}")
    return loop.TrainConfig(steps=args.steps, lr=args.lr, warmup=warmup, save_every=args.save_every,
                            eval_every=args.eval_every, log_every=args.log_every)


def _train(args, what: str, train_fn, **kwargs) -> int:
    """The part every `jaxspec train HEAD` shares: load the target, the schedule, held-out prompts;
    train_fn(model, data, out, cfg, **common, **kwargs) -> drafter; print its held-out acceptance."""
    import jaxspec

    from .acceptance import heldout_prompts

    cfg = _schedule(args)
    model = jaxspec.load(args.target)
    eval_data = getattr(args, "eval_data", None) or args.data
    held = heldout_prompts(model, eval_data, args.prompts_dir, args.eval_prompts) if args.eval_prompts else None
    drafter = train_fn(model, args.data, args.out, cfg, tokens_per_batch=args.batch_tokens, seed=args.seed,
                       resume=args.resume, eval_prompts=held, eval_tokens=args.eval_tokens, until=args.until,
                       answer_only=args.answer_only, **kwargs)
    mal = drafter.metadata.mean_accepted_length
    print(f"{args.out}: {what} for {args.target}; held-out mean accepted length (K=5, greedy): "
          f"{mal if mal is not None else 'not measured'}")
    return 0


def _shards(args) -> list[str] | None:
    """The data shards --shards names (None: all)."""
    from .data import select_shards
    return select_shards(args.data, args.shards) if args.shards else None


def cmd_eagle(args) -> int:
    from .eagle import train_eagle
    return _train(args, "EAGLE head", train_eagle, draft_vocab_size=args.draft_vocab, ttt_steps=args.ttt_steps,
                  tied_head=args.tied_head, shards=_shards(args))


def cmd_mtp(args) -> int:
    from .mtp import train_mtp
    return _train(args, f"MTP head ({args.modules} modules)", train_mtp, num_modules=args.modules,
                  draft_vocab_size=args.draft_vocab, shards=_shards(args))


def cmd_draft(args) -> int:
    from .draft import train_draft
    return _train(args, f"draft model ({args.layers} layers, width {args.width})", train_draft,
                  hidden_size=args.width, num_layers=args.layers, init=args.init, loss=args.loss,
                  shards=_shards(args))


def cmd_onpolicy(args) -> int:
    from .onpolicy import onpolicy_rounds

    def rounds(model, data_dir, out, cfg, **kw):
        for unused in ("resume", "until", "answer_only"):
            kw.pop(unused)
        return onpolicy_rounds(model, args.draft, data_dir, out, cfg, rounds=args.rounds,
                               prompts_per_round=args.prompts_per_round, mix=args.mix,
                               prompts_dir=args.prompts_dir, batch_size=args.batch_size, keep_out=args.eval_data, **kw)
    return _train(args, f"on-policy draft model ({args.rounds} rounds from {args.draft})", rounds)


def cmd_scaling(args) -> int:
    from .scaling import scaling_curve

    fractions = [float(x) for x in args.fractions.split(",") if x]

    def curve(model, data_dir, out, cfg, **kw):
        for unused in ("resume", "until", "tokens_per_batch", "seed"):
            kw.pop(unused)
        result = scaling_curve(model, data_dir, out, cfg, fractions=fractions, epochs=args.epochs,
                               tokens_per_batch=args.batch_tokens, draft_vocab_size=args.draft_vocab,
                               ttt_steps=args.ttt_steps, tied_head=args.tied_head, seed=args.seed,
                               provenance=_provenance(), **kw)
        for r in result["runs"]:
            print(f"  {r['fraction']:g} of the data: {r['answer_tokens']} answer tokens, {r['steps']} steps, "
                  f"held-out mean accepted length {r['mean_accepted_length']}")
        from jaxspec.drafters import Eagle
        return Eagle.load(os.path.join(out, f"frac-{max(fractions):g}"))
    return _train(args, "EAGLE data-scaling curve", curve)


def cmd_heads(args) -> int:
    import jaxspec

    from .acceptance import heldout_prompts
    from .joint import evaluate_fallback, joint_steps, train_heads

    model = jaxspec.load(args.target)
    shards = _shards(args)
    setups, outs, lrs = _head_setups(args, model, shards)
    steps = joint_steps(args.data, args.batch_tokens, args.epochs, shards) if args.epochs else args.steps
    cfg = dataclasses.replace(_joint_config(args, steps, lrs, args.name), save_every=args.save_every,
                              log_every=args.log_every, fallback_minutes=args.fallback_minutes)
    fallback_dir = args.fallback or os.path.join(os.path.dirname(os.path.abspath(args.data)), "runs", args.name)
    held = heldout_prompts(model, args.data, args.prompts_dir, args.eval_prompts) if args.eval_prompts else None
    if args.evaluate_fallback:
        point = evaluate_fallback(model, args.data, setups, cfg, fallback_dir, held or [], args.eval_tokens, shards)
        print(json.dumps(point))
        return 0
    print(f"run {args.name}: {steps} steps of {'+'.join(outs)}; state in $JAXSPEC_CACHE/runs/{args.name}, "
          f"fallback in {fallback_dir}", file=sys.stderr)
    drafters = train_heads(model, args.data, setups, outs, cfg, fallback_dir, until=args.until, shards=shards,
                           eval_prompts=held, eval_tokens=args.eval_tokens)
    for kind, drafter in drafters.items():
        print(f"{outs[kind]}: {kind}; held-out mean accepted length (K=5, greedy): "
              f"{drafter.metadata.mean_accepted_length}")
    return 0


def cmd_link_fallback(args) -> int:
    from . import fallback

    heads = {kind: getattr(args, kind) for kind in ("eagle", "mtp", "draft") if getattr(args, kind)}
    if not heads:
        raise ValueError("name the shipped heads to link: --eagle DIR, --mtp DIR, --draft DIR")
    fallback.link(args.fallback, heads)
    print(f"{args.fallback}: {', '.join(heads)} now read from {', '.join(heads.values())}")
    return 0


def cmd_curve(args) -> int:
    from .curve import run_curve, write_curve

    result = {**_provenance(), **run_curve(args.fallback, args.profile)}
    for p in result["points"]:
        heads = ", ".join(f"{kind} {p[kind]:.2f} ({p['hours'][kind]:.2f} h)" for kind in ("eagle", "mtp", "draft")
                          if kind in p)
        print(f"step {p['step']}: {heads}")
    if args.out:
        print("wrote", *write_curve(result, args.out))
    return 0


def _head_setups(args, model, shards, kinds=None):
    """The heads `train heads` names (--eagle, --mtp, --draft), or `kinds` -> (setups, {kind: out folder or
    None}, {kind: lr})."""
    from .draft import draft_setup
    from .eagle import eagle_setup
    from .mtp import mtp_setup

    made = {"eagle": lambda: eagle_setup(model, args.data, args.eagle_vocab, args.ttt_steps, tied_head=True,
                                         seed=args.seed, shards=shards),
            "mtp": lambda: mtp_setup(model, args.data, args.modules, args.mtp_vocab, seed=args.seed, shards=shards),
            "draft": lambda: draft_setup(model, args.data, args.width, args.layers, seed=args.seed)}
    if kinds is not None:
        unknown = sorted(set(kinds) - set(made))
        if unknown:
            raise ValueError(f"unknown heads {unknown}: choose from {sorted(made)}")
    outs = ({kind: getattr(args, kind) for kind in made if getattr(args, kind)} if kinds is None
            else {kind: None for kind in kinds})
    if not outs:
        raise ValueError("name at least one head to train: --eagle OUT, --mtp OUT, --draft OUT" if kinds is None
                         else "name at least one head: --heads eagle,mtp,draft")
    lrs = {kind: getattr(args, f"{kind}_lr") for kind in outs}
    return [made[kind]() for kind in outs], outs, lrs


def _joint_config(args, steps: int, lrs: dict, name: str):
    """The JointConfig of _head_options' flags (saving and logging at their defaults)."""
    from .joint import JointConfig

    warmup = min(100, steps // 10) if args.warmup is None else args.warmup
    return JointConfig(name=name, steps=steps, lrs=lrs, warmup=warmup, tokens_per_batch=args.batch_tokens,
                       answer_only=not args.all_positions, seed=args.seed, optimizer=args.optimizer)


def cmd_profile_heads(args) -> int:
    import jaxspec

    from .profile import joint_markdown, profile_joint_step

    model = jaxspec.load(args.target)
    setups, _, lrs = _head_setups(args, model, None, kinds=[k for k in args.heads.split(",") if k])
    result = profile_joint_step(model, args.data, setups, _joint_config(args, args.steps, lrs, "profile"), args.step)
    print(f"the batch of step {args.step}: {result['settings']}\n{joint_markdown(result)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"provenance": _provenance(), **result}, f, indent=1)
    return 0


def cmd_profile(args) -> int:
    import jaxspec

    from .profile import ProfileConfig, markdown, profile_eagle_step

    model = jaxspec.load(args.target)
    runs = {}
    for bf16 in ([False, True] if args.precision == "both" else [args.precision == "bf16"]):
        cfg = ProfileConfig(tokens_per_batch=args.batch_tokens, seq_len=args.seq_len, draft_vocab_size=args.draft_vocab,
                            ttt_steps=args.ttt_steps, bf16=bf16, answer_fraction=args.answer_fraction)
        runs["bfloat16 operands" if bf16 else "float32"] = result = profile_eagle_step(model, cfg)
        print(f"\n{'bfloat16 operands, float32 accumulation' if bf16 else 'float32'}: {cfg}\n{markdown(result)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"provenance": _provenance(), "runs": runs}, f, indent=1)
    return 0


def cmd_replay(args) -> int:
    from .replay import run_replay

    result = run_replay(args.data, args.test_shards, args.store_shards, args.drafters.split(","), args.k)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**_provenance(), **result}, f, indent=1)
    return 0


def cmd_compare(args) -> int:
    from .compare import compare_runs, write_comparison

    result = {**compare_runs(args.runs.split(","), args.until, args.window), **({"note": args.note} if args.note else {})}
    for kind, head in result["heads"].items():
        cells = ", ".join(f"{name} {r['window_top1_first']:.3f} (loss {r['window_loss_first']:.3f}, "
                          f"{r['median_seconds_per_step']:.1f} s/step)" for name, r in head["runs"].items())
        print(f"{kind}, first-draft-step top-1 over steps {head['window_steps']}: {cells}")
    if args.out:
        print("wrote", *write_comparison({**_provenance(), **result}, args.out))
    return 0


def _training_args(p: argparse.ArgumentParser, steps: int, lr: float) -> None:
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--data", required=True, help="a folder made by `jaxspec train data`")
    p.add_argument("--out", required=True, help="where the head, checkpoints and metrics.jsonl go")
    p.add_argument("--prompts-dir", default=DEFAULT_DIR, help="the folder of the prompt files the data was made from")
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--warmup", type=int, default=None, help="learning-rate warm-up steps (default: a tenth of "
                   "--steps, at most 100)")
    p.add_argument("--batch-tokens", type=int, default=4096, help="tokens per batch (rows x length bucket)")
    p.add_argument("--save-every", type=int, default=100, help="checkpoint interval in steps")
    p.add_argument("--eval-every", type=int, default=500, help="acceptance check interval (0: only at the end)")
    p.add_argument("--eval-prompts", type=int, default=8, help="held-out prompts per acceptance check (0: none)")
    p.add_argument("--eval-tokens", type=int, default=64)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--until", type=int, default=None,
                   help="stop after this step (saved, head written); --resume later continues the schedule")
    p.add_argument("--answer-only", action="store_true",
                   help="train only on positions whose drafts fall in the answers (not the prompts)")
    p.add_argument("--mesh", default=None, help="train on a device mesh, e.g. data=4,model=2: the batch over data, "
                   "weights and optimizer state over model (default: every device over data)")


def _shards_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shards", default=None,
                   help="train on these data shards only, e.g. 48-51,60 (shard indices; default: all)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `train` and its subcommands to the jaxspec command line."""
    train = sub.add_parser("train", help="make self-distilled data and train draft heads")
    tsub = train.add_subparsers(dest="train_command", required=True)
    _data_commands(tsub)
    _eagle_commands(tsub)
    _draft_commands(tsub)
    _joint_commands(tsub)
    _fallback_commands(tsub)


def _data_commands(tsub) -> None:
    """train data, train vocab."""
    d = tsub.add_parser("data", help="the target answers training prompts (resumable)")
    d.add_argument("--target", default="smollm2-135m-instruct")
    d.add_argument("--out", required=True)
    d.add_argument("--mix", default=DEFAULT_MIX,
                   help="prompt pools and weights: FILE[:KIND]=WEIGHT,... (files in --prompts-dir, KIND filters "
                        "on the rows' 'kind' field)")
    d.add_argument("--prompts-dir", default=DEFAULT_DIR)
    d.add_argument("--prompts", default=None, help="one JSONL prompt file instead of --mix")
    d.add_argument("--num-prompts", type=int, default=2048)
    d.add_argument("--heldout", type=int, default=16, help="prompts of each pool kept out for acceptance checks")
    d.add_argument("--max-new-tokens", type=int, default=256)
    d.add_argument("--batch-size", type=int, default=64,
                   help="rows per generate call (64 gave the most answer tokens/s on a 2-core CPU)")
    d.add_argument("--shard-size", type=int, default=256, help="prompts per shard (the resume unit)")
    d.add_argument("--sampled-fraction", type=float, default=0.25,
                   help="share of each shard's answers sampled at --temperature (the rest greedy)")
    d.add_argument("--temperature", type=float, default=0.7)
    d.add_argument("--writer", default=None,
                   help="a draft model folder that writes the answers instead of the target (on-policy data)")
    d.add_argument("--new-part", action="store_true",
                   help="add a part with these settings after the existing data (prompts not used before)")
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(handler=cmd_data)
    v = tsub.add_parser("vocab", help="share of the target's answer tokens that draft vocabularies of each "
                                      "size hold, per eval source and data pool (table, coverage.json, plot)")
    v.add_argument("--target", default="smollm2-135m-instruct")
    v.add_argument("--data", required=True)
    v.add_argument("--sizes", default="4096,8192,16384,24576,32768")
    v.add_argument("--eval-file", default=os.path.join(DEFAULT_DIR, "eval.jsonl"))
    v.add_argument("--eval-prompts", type=int, default=20, help="prompts per source")
    v.add_argument("--eval-tokens", type=int, default=128)
    v.add_argument("--out", default=None, help="folder for coverage.json, coverage.png and the eval answers")
    v.set_defaults(handler=cmd_vocab)


def _eagle_commands(tsub) -> None:
    """train eagle, train scaling, train mtp (heads on the target's features)."""
    e = tsub.add_parser("eagle", help="train an EAGLE-3-style head on the data (resumable)")
    _training_args(e, steps=2000, lr=1e-3)
    e.add_argument("--draft-vocab", type=int, default=8192, help="draft vocabulary size Vd")
    e.add_argument("--ttt-steps", type=int, default=5, help="draft steps unrolled in training")
    e.add_argument("--tied-head", action="store_true",
                   help="draft through the target's frozen output rows (no stored lm_head: a large --draft-vocab "
                        "costs no checkpoint size)")
    _shards_arg(e)
    e.set_defaults(handler=cmd_eagle)
    sc = tsub.add_parser("scaling", help="EAGLE heads on 1/8, 1/4, 1/2 and all of the data, the same epochs "
                                         "each: held-out acceptance against data size (scaling.json, scaling.png)")
    _training_args(sc, steps=1000, lr=1e-3)      # --steps is ignored: each fraction runs --epochs
    sc.set_defaults(eval_every=0, eval_prompts=48)
    sc.add_argument("--fractions", default="0.125,0.25,0.5,1")
    sc.add_argument("--epochs", type=float, default=1.0, help="passes over each subset (steps follow its tokens)")
    sc.add_argument("--draft-vocab", type=int, default=16384)
    sc.add_argument("--ttt-steps", type=int, default=4)
    sc.add_argument("--tied-head", action="store_true", help="as for `train eagle`")
    sc.set_defaults(handler=cmd_scaling)
    m = tsub.add_parser("mtp", help="train DeepSeek-V3-style multi-token-prediction modules (resumable)")
    _training_args(m, steps=2000, lr=1e-3)
    m.add_argument("--modules", type=int, default=2, help="number of MTP modules D (1-4 is usual)")
    m.add_argument("--draft-vocab", type=int, default=4096, help="draft vocabulary size Vd")
    _shards_arg(m)
    m.set_defaults(handler=cmd_mtp)


def _draft_commands(tsub) -> None:
    """train draft, train onpolicy (the independent draft model)."""
    dm = tsub.add_parser("draft", help="distil a small draft model from the target's distributions (resumable)")
    _training_args(dm, steps=2000, lr=1e-3)
    dm.set_defaults(batch_tokens=2048)
    dm.add_argument("--width", type=int, default=192, help="the draft model's width E (tied embeddings)")
    dm.add_argument("--layers", type=int, default=4, help="the draft model's decoder layers")
    dm.add_argument("--init", default=None, help="a draft model folder to start from (its shape wins)")
    dm.add_argument("--loss", choices=["kl", "tv"], default="kl",
                    help="kl: soft cross-entropy to the target; tv: total variation (DistillSpec)")
    _shards_arg(dm)
    dm.set_defaults(handler=cmd_draft)
    op = tsub.add_parser("onpolicy", help="on-policy rounds: the draft answers new prompts, the target scores "
                                          "them, the draft is fine-tuned with the TV loss (DistillSpec)")
    _training_args(op, steps=200, lr=2e-4)
    op.set_defaults(batch_tokens=2048, eval_every=0)
    op.add_argument("--draft", required=True, help="the draft model folder to start from")
    op.add_argument("--eval-data", required=True,
                    help="the data folder whose held-out prompts check acceptance (never drawn for training)")
    op.add_argument("--rounds", type=int, default=1)
    op.add_argument("--prompts-per-round", type=int, default=512)
    op.add_argument("--mix", default=DEFAULT_MIX)
    op.add_argument("--batch-size", type=int, default=64, help="rows per generate call of the draft")
    op.set_defaults(handler=cmd_onpolicy)


def _head_options(p: argparse.ArgumentParser) -> None:
    """The options that shape a joint run's heads, batches and optimizer (train heads, train profile-heads)."""
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--data", required=True, help="a folder made by `jaxspec train data`")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--all-positions", action="store_true", help="score prompt positions too (default: answers)")
    p.add_argument("--optimizer", choices=("adamw", "muon"), default="adamw",     # loop.OPTIMIZERS
                   help="muon: Muon on the 2-D weights, AdamW on the rest (optax.contrib.muon)")
    p.add_argument("--eagle-lr", type=float, default=5e-4)
    p.add_argument("--mtp-lr", type=float, default=6e-4)
    p.add_argument("--draft-lr", type=float, default=1e-3)
    p.add_argument("--eagle-vocab", type=int, default=8192)
    p.add_argument("--ttt-steps", type=int, default=4)
    p.add_argument("--mtp-vocab", type=int, default=8192)
    p.add_argument("--modules", type=int, default=2)
    p.add_argument("--width", type=int, default=192)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)


def _joint_commands(tsub) -> None:
    """train heads (one pass of the target for every head), train profile-heads (its step timed by part)."""
    h = tsub.add_parser("heads", help="train EAGLE, MTP and the draft model together: one pass of the target per "
                                      "batch; state in $JAXSPEC_CACHE/runs/NAME, a fallback to commit")
    _head_options(h)
    h.add_argument("--name", required=True, help="the run's name: rerun the same command to resume it")
    h.add_argument("--eagle", default=None, help="train an EAGLE head (tied output rows) and write it here")
    h.add_argument("--mtp", default=None, help="train MTP modules and write them here")
    h.add_argument("--draft", default=None, help="train a draft model and write it here")
    h.add_argument("--fallback", default=None, help="the fallback folder (default: DATA/../runs/NAME)")
    h.add_argument("--fallback-minutes", type=float, default=60.0, help="write the fallback this often")
    h.add_argument("--epochs", type=float, default=None, help="passes over the data (sets --steps)")
    h.add_argument("--save-every", type=int, default=50)
    h.add_argument("--log-every", type=int, default=10)
    h.add_argument("--until", type=int, default=None, help="stop after this step; rerun to continue")
    h.add_argument("--evaluate-fallback", action="store_true",
                   help="train nothing: measure the held-out acceptance of the run's fallback as it stands and add "
                        "it to FALLBACK/curve.jsonl")
    h.add_argument("--eval-prompts", type=int, default=8)
    h.add_argument("--eval-tokens", type=int, default=64)
    h.add_argument("--prompts-dir", default=DEFAULT_DIR)
    _shards_arg(h)
    h.set_defaults(handler=cmd_heads)
    ph = tsub.add_parser("profile-heads", help="a joint run's step timed by part on its real batch: the target's "
                                               "features and each head's step, with XLA's FLOP counts")
    _head_options(ph)
    ph.add_argument("--heads", default="eagle,mtp,draft", help="comma-separated: eagle, mtp, draft")
    ph.add_argument("--step", type=int, default=0, help="time the batch of this step")
    ph.add_argument("--out", default=None, help="a JSON file for the result")
    ph.set_defaults(handler=cmd_profile_heads)
    pr = tsub.add_parser("profile", help="one EAGLE training step timed by part, with XLA's FLOP counts")
    pr.add_argument("--target", default="smollm2-135m-instruct")
    pr.add_argument("--precision", choices=["f32", "bf16", "both"], default="both")
    pr.add_argument("--batch-tokens", type=int, default=4096)
    pr.add_argument("--seq-len", type=int, default=512)
    pr.add_argument("--draft-vocab", type=int, default=32768)
    pr.add_argument("--ttt-steps", type=int, default=4)
    pr.add_argument("--answer-fraction", type=float, default=1.0,
                    help="share of each row in the loss (< 1: logits at those positions only)")
    pr.add_argument("--out", default=None, help="a JSON file for the result")
    pr.set_defaults(handler=cmd_profile)
    rp = tsub.add_parser("replay", help="drafters that read only the text (ngram, suffix) replayed over held-out "
                                        "greedy answers, per prompt pool, without the target")
    rp.add_argument("--data", required=True, help="a folder made by `jaxspec train data`")
    rp.add_argument("--test-shards", required=True, help="shards replayed, e.g. 80-84")
    rp.add_argument("--store-shards", required=True, help="shards whose answers make the suffix store, e.g. 0-79")
    rp.add_argument("--drafters", default="ngram,suffix:none,suffix,suffix:longer,suffix:request,suffix:store",
                    help="ngram, suffix (rule score), suffix:RULE, suffix:none (the row's own text only)")
    rp.add_argument("-k", "--k", type=int, default=5)
    rp.add_argument("--out", default=None, help="a JSON file for the result")
    rp.set_defaults(handler=cmd_replay)
    cp = tsub.add_parser("compare", help="joint runs of the same heads and seed side by side: top-1 and loss "
                                         "at the steps all logged (the same batches: a paired comparison)")
    cp.add_argument("--runs", required=True, help="run names, e.g. all-v1,all-muon ($JAXSPEC_CACHE/runs/NAME)")
    cp.add_argument("--until", type=int, default=10 ** 9, help="steps up to this one")
    cp.add_argument("--window", type=int, default=50, help="the summary averages the last this many steps")
    cp.add_argument("--note", default=None, help="what the runs differ in, for the report")
    cp.add_argument("--out", default=None, help="OUT.json and OUT.png")
    cp.set_defaults(handler=cmd_compare)


def _fallback_commands(tsub) -> None:
    """train link-fallback, train curve."""
    lk = tsub.add_parser("link-fallback", help="point a run's fallback at heads saved from it at its step (shipped "
                                               "with --until), dropping its own copies of their parameters")
    lk.add_argument("fallback", help="the fallback folder, e.g. checkpoints/MODEL/runs/NAME")
    for kind in ("eagle", "mtp", "draft"):
        lk.add_argument(f"--{kind}", default=None, help=f"the {kind} head's folder")
    lk.set_defaults(handler=cmd_link_fallback)
    cv = tsub.add_parser("curve", help="a run's held-out curve (its fallback's curve.jsonl) against the hours of "
                                       "a profiled step, as a result file for BENCHMARKS.md")
    cv.add_argument("fallback", help="the fallback folder, e.g. checkpoints/MODEL/runs/NAME")
    cv.add_argument("--profile", required=True, help="a `train profile-heads --out` result of the run's step")
    cv.add_argument("--out", default=None, help="OUT.json and OUT.png (e.g. benchmarks/run-NAME.json)")
    cv.set_defaults(handler=cmd_curve)
