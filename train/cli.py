"""`jaxspec train ...` subcommands, registered through the jaxspec.commands entry point."""
from __future__ import annotations

import argparse
import os

DEFAULT_PROMPTS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "prompts",
                               "train.jsonl")


def cmd_data(args) -> int:
    import jaxspec

    from . import data

    model = jaxspec.load(args.target)
    manifest = data.make_data(model, args.prompts, args.out, num_prompts=args.num_prompts,
                              heldout=args.heldout, max_new_tokens=args.max_new_tokens,
                              batch_size=args.batch_size, shard_size=args.shard_size, seed=args.seed)
    counts = data.summary(args.out)
    print(f"{args.out}: {counts['examples']} examples, {counts['prompt_tokens']} prompt tokens, "
          f"{counts['answer_tokens']} answer tokens (target {manifest['settings']['target']})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `train` and its subcommands to the jaxspec command line."""
    train = sub.add_parser("train", help="make self-distilled data and train draft heads")
    tsub = train.add_subparsers(dest="train_command", required=True)
    d = tsub.add_parser("data", help="the target answers training prompts (resumable)")
    d.add_argument("--target", default="smollm2-135m-instruct")
    d.add_argument("--out", required=True)
    d.add_argument("--prompts", default=DEFAULT_PROMPTS, help="JSONL with a 'prompt' field")
    d.add_argument("--num-prompts", type=int, default=2048)
    d.add_argument("--heldout", type=int, default=64, help="prompts kept out for acceptance checks")
    d.add_argument("--max-new-tokens", type=int, default=256)
    d.add_argument("--batch-size", type=int, default=16)
    d.add_argument("--shard-size", type=int, default=64)
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(handler=cmd_data)
