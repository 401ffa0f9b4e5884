"""Where the shipped checkpoints and the prompt files are: one root, documented and overridable.

root(): $JAXSPEC_ROOT, else the repository that holds this package. The shipped heads are in
root()/checkpoints/<model name>/<kind>; the prompt files (train.jsonl, train-mix.jsonl, eval.jsonl,
with their sources and licences in SOURCES.md) in $JAXSPEC_PROMPTS, else root()/data/prompts. A missing file is an error that names
the path looked at, never a quiet switch to something else. Measurements kept between runs
(step costs, costs.py) go to cache_dir(): $JAXSPEC_CACHE, else $XDG_CACHE_HOME/jaxspec or ~/.cache/jaxspec.
"""
from __future__ import annotations

import contextlib
import json
import lzma
import os
import shutil
import tempfile

ROOT_ENV, PROMPTS_ENV, CACHE_ENV = "JAXSPEC_ROOT", "JAXSPEC_PROMPTS", "JAXSPEC_CACHE"


def root() -> str:
    return os.path.abspath(os.environ.get(ROOT_ENV) or os.path.join(os.path.dirname(__file__), ".."))


def prompts_dir() -> str:
    return os.path.abspath(os.environ.get(PROMPTS_ENV) or os.path.join(root(), "data", "prompts"))


def cache_dir() -> str:
    user_cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.abspath(os.environ.get(CACHE_ENV) or os.path.join(user_cache, "jaxspec"))


def stored(path: str) -> str | None:
    """path, or path + ".xz" when only that is there (the repository keeps its large files, prompt
    files and shipped weights, xz-compressed; they are read as they are); None when neither is."""
    for candidate in (path, path + ".xz"):
        if os.path.isfile(candidate):
            return candidate
    return None


def read_bytes(path: str) -> bytes:
    """The contents of path, or of path + ".xz" decompressed (see stored); ValueError if neither is there."""
    found = stored(path)
    if found is None:
        raise ValueError(f"file not found: {path}")
    with (lzma.open(found) if found.endswith(".xz") else open(found, "rb")) as f:
        return f.read()


@contextlib.contextmanager
def plain_file(path: str):
    """A context giving path itself, or when only path + ".xz" is there (see stored) a decompressed
    temporary copy, removed on exit (for readers that take a file, such as safetensors')."""
    found = stored(path)
    if found is None:
        raise ValueError(f"file not found: {path}")
    if not found.endswith(".xz"):
        yield found
        return
    with tempfile.NamedTemporaryFile(suffix="-" + os.path.basename(path)) as tmp, lzma.open(found) as src:
        shutil.copyfileobj(src, tmp)
        tmp.flush()
        yield tmp.name


def read_jsonl(path: str) -> list[dict]:
    """The rows of a JSONL file (or of its .xz form, see stored); ValueError if neither is there."""
    if stored(path) is None:
        raise ValueError(f"prompt file not found: {path}")
    lines = read_bytes(path).decode("utf-8").split("\n")          # not splitlines: JSON strings may hold U+2028
    return [json.loads(line) for line in lines if line.strip()]


def prompt_file(name: str) -> str:
    """The path of a prompt file in prompts_dir() (read it with read_jsonl); ValueError if it is not there."""
    path = os.path.join(prompts_dir(), name)
    if stored(path) is None:
        raise ValueError(f"prompt file not found: {path} (set ${PROMPTS_ENV} to the folder holding {name}, "
                         f"or pass a file)")
    return path


def shipped_head(model_source: str, kind: str) -> str:
    """root()/checkpoints/<model name>/<kind>; ValueError if it is not there."""
    path = os.path.join(root(), "checkpoints", os.path.basename(model_source), kind)
    if not os.path.isdir(path):
        raise ValueError(f"no shipped {kind} head for {model_source!r} (looked in {path}; set ${ROOT_ENV} "
                         f"to the folder holding checkpoints/, or give {kind}:PATH)")
    return path
