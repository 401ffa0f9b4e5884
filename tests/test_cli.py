"""The command line, run as a user would (subprocess, real model)."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest


def _jaxspec(*args):
    return subprocess.run([sys.executable, "-m", "jaxspec.cli", *args], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_generate_json_and_demo():
    r = _jaxspec("generate", "--prompt", "What is the capital of France?", "--max-new-tokens", "12", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert len(got["tokens"]) <= 12 and "Paris" in got["text"]
    assert got["stats"]["new_tokens"] == len(got["tokens"])
    r = _jaxspec("demo", "--max-new-tokens", "24")
    assert r.returncode == 0, r.stderr
    assert "user> Explain in three sentences why the sky is blue." in r.stdout
    answer = r.stdout.split("assistant> ", 1)[1]
    assert re.search(r"scatter|light|wavelength", answer, re.I), answer
    assert re.search(r"^(\d+) new tokens in [\d.]+ s", answer, re.M).group(1) == "24"
    assert "speculative (ngram, adaptive K <= 5): the same answer; 24 new tokens" in r.stdout


def test_cli_errors_are_clear():
    r = _jaxspec("generate", "--model", "no-such-model", "--prompt", "hi")
    assert r.returncode == 2 and re.search(r"known models: .*smollm2-135m-instruct", r.stderr), r.stderr
    r = _jaxspec("generate", "--prompt", "hi", "--temperature", "-1")
    assert r.returncode == 2 and "temperature" in r.stderr
    r = _jaxspec("train", "eagle", "--data", "d", "--out", "o", "--steps", "50", "--warmup", "50")
    assert r.returncode == 2 and "--warmup 50 must be at least 0 and below --steps 50" in r.stderr, r.stderr


def test_a_short_training_run_warms_up_for_a_tenth_of_its_steps():
    from jaxspec.cli import build_parser
    from train.cli import _schedule

    for steps, warmup in ((2, 0), (500, 50), (5000, 100)):
        args = build_parser().parse_args(["train", "mtp", "--data", "d", "--out", "o", "--steps", str(steps)])
        assert _schedule(args).warmup == warmup
    args = build_parser().parse_args(["train", "mtp", "--data", "d", "--out", "o", "--steps", "9", "--warmup", "3"])
    assert _schedule(args).warmup == 3


@pytest.mark.slow
def test_generate_speculates_from_the_command_line():
    r = _jaxspec("generate", "--prompt", "List the numbers from 1 to 20, separated by commas.", "--max-new-tokens",
                 "32", "--drafter", "ngram", "-k", "3", "--no-adaptive", "--json")
    assert r.returncode == 0, r.stderr
    spec = json.loads(r.stdout)
    plain = json.loads(_jaxspec("generate", "--prompt", "List the numbers from 1 to 20, separated by commas.",
                                "--max-new-tokens", "32", "--json").stdout)
    assert spec["tokens"] == plain["tokens"] and spec["stats"]["mean_accepted_length"] > 1.0
    r = _jaxspec("generate", "--prompt", "Hi", "--max-new-tokens", "8", "--drafter", "eagle", "--tree", "8:3:2")
    assert r.returncode == 0 and "tokens per target pass" in r.stderr, r.stderr


def test_heads_load_by_model_name_and_a_missing_folder_says_not_found(tmp_path, monkeypatch):
    from jaxspec.drafters import MTP, Eagle, shipped

    monkeypatch.chdir(tmp_path)                     # relative paths resolve elsewhere
    with pytest.raises(ValueError, match="eagle head not found: .*checkpoints/smollm2-135m-instruct/eagle"):
        Eagle.load("checkpoints/smollm2-135m-instruct/eagle")
    assert Eagle.load("smollm2-135m-instruct").cfg == shipped("smollm2-135m-instruct", "eagle").cfg
    assert MTP.load("smollm2-135m-instruct").cfg.num_modules >= 1
    with pytest.raises(ValueError, match="kind must be one of"):
        shipped("smollm2-135m-instruct", "medusa")
    r = _jaxspec("generate", "--prompt", "hi", "--drafter", "eagle:no/such/head")
    assert r.returncode == 2 and "not found" in r.stderr


@pytest.mark.slow
def test_a_second_load_reads_the_kept_weights_and_gives_the_same_model(smollm, monkeypatch):
    """jaxspec/warm.py: after one load of the GGUF, the next reads the kept float weights and fields
    (the GGUF reader is not called) and gives the same config, weights and tokenizer."""
    import gguf
    import jax
    import numpy as np

    import jaxspec

    jaxspec.load("smollm2-135m-instruct")                # keeps them (this session's cache folder)
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: (_ for _ in ()).throw(AssertionError("read the GGUF")))
    warm = jaxspec.load("smollm2-135m-instruct")
    assert warm.config == smollm.config
    for a, b in zip(jax.tree_util.tree_leaves(warm.params), jax.tree_util.tree_leaves(smollm.params)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    chat = [{"role": "user", "content": "Hi <|im_end|> there"}]
    assert warm.tokenizer.apply_chat_template(chat, add_generation_prompt=True) == \
        smollm.tokenizer.apply_chat_template(chat, add_generation_prompt=True)
    monkeypatch.setenv("JAXSPEC_WARM_START", "0")                 # off: the GGUF is read again
    with pytest.raises(ValueError, match="read the GGUF"):
        jaxspec.load("smollm2-135m-instruct")


@pytest.mark.slow
def test_the_readme_python_example_runs_as_written(tmp_path):
    """The README's Python example, cut from the file and run in a fresh process."""
    import os

    readme = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "README.md")).read()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "example.py").write_text(code)
    r = subprocess.run([sys.executable, str(tmp_path / "example.py")], capture_output=True, text=True, timeout=900,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip()


ENV_PREFIX = re.compile(r"^(\w+=\S+\s+)+")        # VAR=value before a command


def _readme_command_lines() -> list[list[str]]:
    """The `jaxspec ...` lines of the README's bash blocks as argument lists: comments cut, continuation
    lines joined, optional parts `[...]` kept and `a|b|c` choices expanded into one line each."""
    import os
    import shlex

    readme = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "README.md")).read()
    lines = []
    for block in readme.split("```bash\n")[1:]:
        for line in block.split("```", 1)[0].splitlines():
            line = ENV_PREFIX.sub("", line.split("#", 1)[0].rstrip())
            if line.startswith("jaxspec"):
                lines.append(line)
            elif line.strip().startswith("[") and lines:
                lines[-1] += " " + line.strip()
    out = []
    for line in lines:
        words = shlex.split(line.replace("[", " ").replace("]", " "))[1:]
        choice = next((i for i, w in enumerate(words) if "|" in w), None)
        alternatives = words[choice].split("|") if choice is not None else [None]
        for alt in alternatives:
            argv = [alt if i == choice else w.split("|")[0] for i, w in enumerate(words)]
            out.append([a for a in argv if a != "..."] + (["--help"] if "..." in argv else []))
    return out


def test_every_readme_command_line_parses():
    """Each command the README shows is accepted by the parser as written (a synopsis line ending in
    '...' by its subcommand's --help), so the README cannot drift from the CLI's options."""
    from jaxspec.cli import build_parser

    commands = _readme_command_lines()
    assert len(commands) >= 10 and ["demo"] in commands
    for argv in commands:
        if argv[-1] == "--help":
            with pytest.raises(SystemExit) as e:
                build_parser().parse_args(argv)
            assert e.value.code == 0, argv
        else:
            args = build_parser().parse_args(argv)
            assert args.command == argv[0], argv


def test_help_shows_every_default_once_and_never_none():
    """Each subcommand's --help states each option's non-None default, and never '(default: None)'."""
    import argparse

    from jaxspec.cli import build_parser

    def walk(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    yield from walk(child)

    for parser in walk(build_parser()):
        text = "".join(parser.format_help().split())          # help wraps long defaults at hyphens
        assert "(default:None)" not in text, parser.prog
        for action in parser._actions:
            if action.option_strings and action.default not in (None, argparse.SUPPRESS) \
                    and action.help != argparse.SUPPRESS:
                assert f"default:{action.default}".replace(" ", "") in text or "default" in (action.help or ""), \
                    (parser.prog, action.dest)


@pytest.mark.slow
def test_generate_streams_the_answer_as_it_is_made():
    """The first answer text reaches the terminal well before the last (64 tokens), the streamed text
    is the answer --no-stream prints, and the stats line names where the first token's time went."""
    import os
    import time
    args = ["generate", "--prompt", "Write a short poem about the sea.", "--max-new-tokens", "64"]
    proc = subprocess.Popen([sys.executable, "-m", "jaxspec.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    arrivals = []
    while chunk := os.read(proc.stdout.fileno(), 4096):
        arrivals.append((time.perf_counter(), chunk))
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=600) == 0, err
    streamed = b"".join(c for _, c in arrivals).decode()
    text = [t for t, c in arrivals if c.strip()]
    assert text[-1] - text[0] >= 1.0, [round(t - text[0], 2) for t in text]
    assert re.search(r"\[\d+ tokens; the first [\d.]+ s after the call \(compiling [\d.]+ s", err), err
    plain = _jaxspec(*args, "--no-stream")
    assert plain.returncode == 0 and plain.stdout == streamed


@pytest.mark.slow
def test_the_readme_generate_lines_without_options_run_as_written():
    """The README's `jaxspec generate` lines that are complete commands (no [optional] parts) run as
    written on this CPU, their environment included (the mesh line's device count)."""
    import os
    import shlex
    readme = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "README.md")).read()
    lines = [line.split("  #", 1)[0].strip() for block in readme.split("```bash\n")[1:]
             for line in block.split("```", 1)[0].splitlines()]
    lines = [line for line in lines if ENV_PREFIX.sub("", line).startswith("jaxspec generate") and "[" not in line]
    assert len(lines) >= 2
    for line in lines:
        prefix = ENV_PREFIX.match(line)
        env = dict(word.split("=", 1) for word in shlex.split(prefix.group(0))) if prefix else {}
        argv = shlex.split(ENV_PREFIX.sub("", line))[1:]
        done = subprocess.run([sys.executable, "-m", "jaxspec.cli", *argv], capture_output=True, text=True,
                              timeout=900, env={**os.environ, **env})
        assert done.returncode == 0 and done.stdout.strip(), (line, done.stderr[-2000:])
