"""Benchmark harness: speeds measured as ratios within one process and run.

For each batch size and sampling setting: plain decoding and speculative decoding with the chosen
drafters (each fixed K, and adaptive K) on the same prompts, interleaved batch by batch so machine
noise hits all alike. For each speculative decoder the speedup the Leviathan et al. (2023) model
predicts from the measured acceptance and measured step costs: tokens per step / cost of a step
(K draft steps + verifying K+1 tokens, timed in the loop, in units of one plain step). Optionally Hugging
Face transformers (torch, same weights): plain greedy and prompt-lookup decoding, batch 1. And the
memory-bandwidth bound (one decode step reads every weight once: bound = read bandwidth / weight
bytes), against plain decoding's tokens/s after the prompt pass. Writes bench.json, bench.md and PNG plots.

One module per stage: inputs (prompts, drafters, memory), decoders (one setting: every decoder on the
same prompts), peer (transformers), sweep (`jaxspec bench`: settings in turn, saved as it goes),
report (markdown, BENCHMARKS.md), glance (the table at a glance, also in README.md), plots.
"""
from .decoders import MAX_DIFFERENCES, bench_decoders, first_difference, step_cost, verify_costs
from .glance import glance, with_glance
from .inputs import EVAL_PROMPTS, batches, drafter_memory, make_drafter, read_bandwidth, read_prompts, weight_bytes
from .peer import bench_transformers
from .plots import plot, plot_trees
from .report import (command_of, coverage_markdown, markdown, read_results, replay_markdown, report,
                     scaling_markdown)
from .sweep import provenance, run

__all__ = ["EVAL_PROMPTS", "MAX_DIFFERENCES", "batches", "bench_decoders", "bench_transformers", "command_of",
           "coverage_markdown", "drafter_memory", "first_difference", "glance", "make_drafter", "markdown", "plot",
           "plot_trees", "provenance", "read_bandwidth", "read_prompts", "read_results", "replay_markdown", "report",
           "run", "scaling_markdown", "step_cost", "verify_costs", "weight_bytes", "with_glance"]
