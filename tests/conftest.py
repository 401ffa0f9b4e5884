"""Shared fixtures: the real SmolLM2 (ours and transformers' on the same GGUF), tiny configs."""
from __future__ import annotations

import gc
import os
import shutil
import tempfile

import jax
import pytest
import tokenizers

import jaxspec
from jaxspec.config import ModelConfig
from jaxspec.decode import programs
from jaxspec.loading.registry import resolve_named
from jaxspec.model import Model
from jaxspec.models import init_params

REAL = "smollm2-135m-instruct"


REAL_MODEL_FIXTURES = {"smollm", "hf_smollm", "chat_prompts"}
LONGEST_FIRST = ["test_sharding.py", "test_notebooks.py", "test_speculative.py", "test_train_loop.py",
                 "test_bench.py", "test_cli.py", "test_tree.py"]        # measured: 4-15 minutes each


def pytest_collection_modifyitems(config, items):
    """Tests that use the real SmolLM2 (through these fixtures) are `slow`: `pytest -m "not slow"` runs
    the rest in a few minutes. Tests that load it otherwise carry @pytest.mark.slow themselves."""
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    # the longest modules first: with two xdist workers (make test) they then overlap the rest instead of
    # running alone at the end (a stable sort: the order within each module stays)
    items.sort(key=lambda item: LONGEST_FIRST.index(item.path.name) if item.path.name in LONGEST_FIRST
               else len(LONGEST_FIRST))


TEST_CACHE = "JAXSPEC_TEST_CACHE"


def child_env(devices: int | None = None) -> dict:
    """The environment of a test's child JAX process: this run's XLA flags (make test's optimisation
    level) kept, plus `devices` host devices when given."""
    flags = os.environ.get("XLA_FLAGS", "")
    if devices:
        flags += f" --xla_force_host_platform_device_count={devices}"
    return {**os.environ, "XLA_FLAGS": flags.strip(), "JAX_PLATFORMS": "cpu"}


def pytest_configure(config):
    """One cache folder for the whole run (not the user's): step costs, compiled programs and cached
    weights (jaxspec/warm.py) made by one test, xdist worker, notebook or subprocess serve the others."""
    if not hasattr(config, "workerinput") and TEST_CACHE not in os.environ:
        os.environ[TEST_CACHE] = config._jaxspec_cache = tempfile.mkdtemp(prefix="jaxspec-test-cache-")


def pytest_unconfigure(config):
    if getattr(config, "_jaxspec_cache", None):
        shutil.rmtree(config._jaxspec_cache, ignore_errors=True)
        del os.environ[TEST_CACHE]


@pytest.fixture(scope="session", autouse=True)
def _own_cost_cache():
    os.environ["JAXSPEC_CACHE"] = os.environ[TEST_CACHE]
    jax.config.update("jax_compilation_cache_dir", os.path.join(os.environ["JAXSPEC_CACHE"], "xla"))
    yield


@pytest.fixture(scope="module", autouse=True)
def _free_compiled_programs():
    """Drop compiled programs after each test module: every SmolLM2 loop holds ~1,500 memory maps
    (one per kernel of the unrolled layers) and the whole suite would pass the kernel's limit."""
    yield
    programs.clear()
    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="session")
def smollm():
    return jaxspec.load(REAL)


@pytest.fixture(scope="session")
def hf_smollm():
    """transformers (torch, fp32) loading the very same GGUF file: the reference we did not write."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_named(REAL)
    folder, name = os.path.dirname(path), os.path.basename(path)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return model, tok


@pytest.fixture(scope="session")
def chat_prompts(smollm):
    """Chat-templated prompts of three different lengths whose answers run past 64 tokens."""
    questions = ["Write a short story about a robot who learns to paint.",
                 "Explain in detail how photosynthesis works in green plants, step by step.",
                 "Describe the history of the Roman Empire in several paragraphs."]
    return [smollm.tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                                 add_generation_prompt=True) for q in questions]


TINY = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=8, max_position_embeddings=512)


class ByteTokenizer:
    """A stand-in tokenizer for tiny random models: ids are bytes mod vocab, no EOS. Its `backend` (a
    word-level table of the same ids) lets models that use it be written as Hugging Face folders."""

    eos_token_ids = ()
    bos_token_id = pad_token_id = chat_template = None
    vocab_size = TINY.vocab_size
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"<{i}>": i for i in range(TINY.vocab_size)},
                                                               unk_token="<0>"))

    def encode(self, text, add_special_tokens=False):
        return [b % self.vocab_size for b in text.encode()]

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        if not messages:
            raise ValueError("messages is empty")
        return [1] + self.encode(" ".join(m["content"] for m in messages)) + ([2] if add_generation_prompt else [])


def tiny_model(cfg: ModelConfig = TINY, seed: int = 0, scale: float = 0.5) -> Model:
    return Model(config=cfg, params=init_params(cfg, jax.random.PRNGKey(seed), scale=scale),
                 tokenizer=ByteTokenizer(), source="tiny")
