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


def test_cli_errors_are_clear():
    r = _jaxspec("generate", "--model", "no-such-model", "--prompt", "hi")
    assert r.returncode == 2 and "known models: smollm2-135m-instruct" in r.stderr
    r = _jaxspec("generate", "--prompt", "hi", "--temperature", "-1")
    assert r.returncode == 2 and "temperature" in r.stderr
