"""jaxspec.load on Hugging Face model folders written by transformers' save_pretrained.

Everything is built locally: a byte-level BPE tokenizer trained on a few sentences (wrapped as a
transformers PreTrainedTokenizerFast, so save_pretrained writes tokenizer.json, tokenizer_config.json
and chat_template.jinja) and tiny random Llama / Qwen2 models. The reference is transformers itself
(torch, fp32, no_grad) on the very same folder.
"""
from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from safetensors.numpy import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import jaxspec  # noqa: E402
from jaxspec.loading.hf_dir import load_hf_dir  # noqa: E402

VOCAB = 300
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, hello there! How are you today?",
    "Speculative decoding drafts tokens and verifies them in one pass.",
    "def add(a, b):\n    return a + b\n",
    "Numbers 12345 and 3.14159, dates 2024-01-01.",
]
TEXTS = ["", "Hello world!", "the lazy fox, jumps over 42 dogs", "  spaced\tout\n\nlines  ",
         "Café naïve — ünïcödé 😀", f"{BOS}hi there{EOS}{PAD}", "def f(x):\n    return x * 2\n"]
STD = 0.2       # weight init scale, so logits are O(1) and 1e-4 is a meaningful tolerance
ATOL = 1e-4
BATCH, SEQ = 2, 16


@pytest.fixture(scope="module")
def hf_tokenizer():
    """A ~300-token byte-level BPE with bos/eos/pad special tokens and a chat template."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[BOS, EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 5, trainer)
    assert tok.get_vocab_size() == VOCAB
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   chat_template=CHAT_TEMPLATE)


def _special_ids(tok):
    return dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)


def _randomise(model, seed: int):
    """Normal(0, STD) on every matrix and bias, 1 + Normal(0, STD) on norm weights."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype) * STD
            p.copy_(1.0 + noise if "norm" in name else noise)
    model.eval()
    return model


def _configs(tok):
    ids = _special_ids(tok)
    common = dict(vocab_size=VOCAB, intermediate_size=64, num_hidden_layers=2, max_position_embeddings=128, **ids)
    return {
        "llama_tied": (LlamaForCausalLM, LlamaConfig(
            hidden_size=32, num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
            rms_norm_eps=1e-5, **common)),
        # GQA (4 query heads per kv head), explicit head_dim with H*D != E, non-default rope_theta
        "llama_gqa_untied": (LlamaForCausalLM, LlamaConfig(
            hidden_size=48, num_attention_heads=8, num_key_value_heads=2, head_dim=8, rope_theta=500.0,
            tie_word_embeddings=False, rms_norm_eps=1e-6, **common)),
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(
            hidden_size=32, num_attention_heads=4, num_key_value_heads=2, rope_theta=1e6,
            tie_word_embeddings=False, **common)),
    }


def _save(folder: Path, model, tok) -> Path:
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


def _ids(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, size=(BATCH, SEQ), dtype=np.int32)


def _torch_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids.astype(np.int64))).logits.float().numpy()


def _assert_close(ours, ref):
    ours = np.asarray(ours, np.float32)
    assert ours.shape == ref.shape
    assert ref.std() > 0.1, f"reference logits too small to make the comparison meaningful (std {ref.std()})"
    diff = float(np.abs(ours - ref).max())
    assert diff <= ATOL, f"max |jaxspec - transformers| = {diff:.3g} > {ATOL}"


@pytest.fixture(scope="module")
def folders(hf_tokenizer, tmp_path_factory):
    """name -> (folder, fp32 reference model) for each tiny config."""
    out = {}
    for seed, (name, (cls, cfg)) in enumerate(_configs(hf_tokenizer).items()):
        torch.manual_seed(seed)
        model = _randomise(cls(cfg).float(), seed)
        out[name] = (_save(tmp_path_factory.mktemp(name), model, hf_tokenizer), model)
    return out


@pytest.mark.parametrize("name", ["llama_tied", "llama_gqa_untied", "qwen2"])
def test_logits_match_transformers(folders, name):
    folder, model = folders[name]
    written = json.loads((folder / "config.json").read_text())
    ours = jaxspec.load(str(folder))
    cfg = ours.config
    # the folder really holds what the case claims
    if name == "llama_tied":
        assert model.lm_head.weight is model.model.embed_tokens.weight
        assert cfg.tie_word_embeddings and "lm_head" not in ours.params
    else:
        assert not cfg.tie_word_embeddings and "lm_head" in ours.params
    if name == "llama_gqa_untied":
        assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size) == (8, 2, 8, 48)
        assert cfg.rope_theta == 500.0
    if name == "qwen2":
        assert cfg.qkv_bias and cfg.rope_theta == 1e6
        assert float(model.model.layers[0].self_attn.q_proj.bias.detach().abs().mean()) > 0.05
    assert cfg.architecture == written["model_type"]
    assert cfg.rms_norm_eps == written["rms_norm_eps"]
    ids = _ids()
    ref = _torch_logits(model, ids)
    _assert_close(ours.logits(ids), ref)
    # a single unbatched sequence goes through the same path
    _assert_close(ours.logits(ids[1].tolist())[0], ref[1])


def test_dropped_bias_would_be_caught(folders):
    """Sanity check of the test itself: zeroing the Qwen2 q/k/v biases moves logits far beyond ATOL."""
    folder, model = folders["qwen2"]
    ours = jaxspec.load(folder)
    layers = tuple({**p, "bq": p["bq"] * 0, "bk": p["bk"] * 0, "bv": p["bv"] * 0}
                   for p in ours.params["layers"])
    ours.params = {**ours.params, "layers": layers}
    ids = _ids()
    diff = np.abs(np.asarray(ours.logits(ids)) - _torch_logits(model, ids)).max()
    assert diff > 100 * ATOL


@pytest.mark.parametrize("name", ["llama_gqa_untied", "qwen2"])
def test_bfloat16_checkpoint(hf_tokenizer, tmp_path, name):
    cls, cfg = _configs(hf_tokenizer)[name]
    torch.manual_seed(7)
    model = _randomise(cls(cfg).float(), 7).to(torch.bfloat16)
    _save(tmp_path, model, hf_tokenizer)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    ref_model = cls.from_pretrained(tmp_path, dtype=torch.float32).eval()  # bf16 weights upcast to fp32
    assert ref_model.model.embed_tokens.weight.dtype == torch.float32
    ours = jaxspec.load(str(tmp_path))
    assert ours.params["embed"].dtype == np.float32
    ids = _ids(1)
    _assert_close(ours.logits(ids), _torch_logits(ref_model, ids))
    for name in ("model.safetensors", "tokenizer.json"):      # kept xz-compressed, as the shipped draft model is
        (tmp_path / (name + ".xz")).write_bytes(lzma.compress((tmp_path / name).read_bytes()))
        (tmp_path / name).unlink()
    packed = jaxspec.load(str(tmp_path))
    _assert_close(packed.logits(ids), _torch_logits(ref_model, ids))
    assert packed.tokenizer.encode("Hello, world!") == ours.tokenizer.encode("Hello, world!")


def test_tokenizer_from_folder(folders, hf_tokenizer):
    folder, _ = folders["llama_tied"]
    saved = transformers.AutoTokenizer.from_pretrained(folder)  # transformers reading the same folder
    tok = jaxspec.load(str(folder)).tokenizer
    for text in TEXTS:
        expect = hf_tokenizer.encode(text, add_special_tokens=False)
        assert tok.encode(text) == expect, text
        assert saved.encode(text, add_special_tokens=False) == expect, text
    assert hf_tokenizer.eos_token_id in tok.eos_token_ids
    assert tok.bos_token_id == hf_tokenizer.bos_token_id
    assert tok.pad_token_id == hf_tokenizer.pad_token_id
    assert tok.vocab_size == VOCAB
    assert tok.decode(tok.encode(TEXTS[2])) == TEXTS[2]
    messages = [{"role": "user", "content": "Hello world"}, {"role": "assistant", "content": "hi"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tok.apply_chat_template(messages, add_generation_prompt=True) == \
        hf_tokenizer.encode(text, add_special_tokens=False)


# ---------------------------------------------------------------- bad folders


@pytest.fixture
def broken(folders, tmp_path):
    """A fresh copy of the untied GQA Llama folder, to be damaged by the test."""
    dst = tmp_path / "model"
    shutil.copytree(folders["llama_gqa_untied"][0], dst)
    return dst


def test_missing_config_json(broken):
    (broken / "config.json").unlink()
    with pytest.raises(ValueError, match="config.json"):
        jaxspec.load(str(broken))
    with pytest.raises(ValueError, match="config.json"):
        load_hf_dir(str(broken), np.float32)


def test_unsupported_model_type(broken):
    cfg = json.loads((broken / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="gpt_neox"):
        jaxspec.load(str(broken))


@pytest.mark.parametrize("cut", ["half", "header", "garbage"])
def test_corrupt_safetensors(broken, cut):
    path = broken / "model.safetensors"
    data = path.read_bytes()
    if cut == "half":
        data = data[: len(data) // 2]        # header intact, tensor data cut short
    elif cut == "header":
        data = data[:20]                     # cut inside the JSON header
    else:
        data = b"\x00not a safetensors file at all" * 3
    path.write_bytes(data)
    with pytest.raises(ValueError, match="model.safetensors"):
        jaxspec.load(str(broken))


def test_no_safetensors(broken):
    (broken / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="safetensors"):
        jaxspec.load(str(broken))


def test_missing_tokenizer_json(broken):
    (broken / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="tokenizer.json"):
        jaxspec.load(str(broken))


@pytest.mark.parametrize("key, pattern", [
    ("model.layers.1.mlp.up_proj.weight", r"'up'.*layer 1"),
    ("model.layers.0.self_attn.k_proj.weight", r"'k'.*layer 0"),
    ("lm_head.weight", "'lm_head'"),
    ("model.norm.weight", "'norm'"),
])
def test_missing_tensor(broken, key, pattern):
    path = broken / "model.safetensors"
    tensors = load_file(path)
    del tensors[key]
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=pattern):
        jaxspec.load(str(broken))


def test_missing_qkv_bias(folders, tmp_path):
    shutil.copytree(folders["qwen2"][0], tmp_path / "q")
    path = tmp_path / "q" / "model.safetensors"
    tensors = load_file(path)
    del tensors["model.layers.1.self_attn.v_proj.bias"]
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"'bv'.*layer 1"):
        jaxspec.load(str(tmp_path / "q"))


def test_wrong_tensor_shape(broken):
    path = broken / "model.safetensors"
    tensors = load_file(path)
    key = "model.layers.0.self_attn.k_proj.weight"
    tensors[key] = tensors[key][:-8]  # one kv head short
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="shape"):
        jaxspec.load(str(broken))


@pytest.mark.parametrize("name", ["llama_tied", "llama_gqa_untied"])
def test_written_folder_reads_back_in_transformers_and_jaxspec(folders, hf_tokenizer, tmp_path, name):
    """save_hf_dir (how distilled draft models are shipped) is the inverse of loading: transformers reads
    the folder and gives the original model's logits; jaxspec reads the same weights and tokenizer."""
    from jaxspec.loading.hf_write import save_hf_dir

    folder, model = folders[name]
    ours = jaxspec.load(str(folder))
    save_hf_dir(ours, str(tmp_path), bfloat16=False)
    cls = _configs(hf_tokenizer)[name][0]
    theirs = cls.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = _ids(2)
    _assert_close(_torch_logits(theirs, ids), _torch_logits(model, ids))
    back = jaxspec.load(str(tmp_path))
    assert back.config == ours.config
    for a, b in zip(jax.tree.leaves(back.params), jax.tree.leaves(ours.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for text in TEXTS:
        assert back.tokenizer.encode(text) == ours.tokenizer.encode(text), text
    msgs = [{"role": "user", "content": "hi"}]
    assert (back.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
            == ours.tokenizer.apply_chat_template(msgs, add_generation_prompt=True))
    assert (back.tokenizer.eos_token_ids, back.tokenizer.bos_token_id, back.tokenizer.pad_token_id) == \
        (ours.tokenizer.eos_token_ids, ours.tokenizer.bos_token_id, ours.tokenizer.pad_token_id)
    saved_bf16 = tmp_path / "bf16"
    save_hf_dir(ours, str(saved_bf16))
    assert (saved_bf16 / "model.safetensors").stat().st_size < 0.6 * (tmp_path / "model.safetensors").stat().st_size
