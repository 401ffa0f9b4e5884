"""Text <-> token ids, built from GGUF metadata or a Hugging Face tokenizer folder.

`Tokenizer` wraps a `tokenizers.Tokenizer` and adds what generation needs: the
special token ids and chat-template rendering done the way transformers does it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors

from .paths import read_bytes

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp `tokenizer.ggml.pre` name -> pre-tokenizer family. "default" (also used when the key is
# missing) is taken as plain GPT-2 ByteLevel; llama.cpp's own "default" regex differs slightly.
_PRE_FAMILIES = {
    **dict.fromkeys(["gpt2", "default"], "gpt2"),
    # llama.cpp isolates every \p{N} first, then runs the GPT-2 regex (as HF's Digits + ByteLevel).
    **dict.fromkeys(["smollm", "starcoder", "refact", "codeshell"], "digits"),
    **dict.fromkeys(["llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx", "falcon3"], "llama3"),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen"], "qwen2"),
}


def _byte_level(use_regex: bool) -> pre_tokenizers.ByteLevel:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=use_regex)


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer for a GGUF `tokenizer.ggml.pre` name."""
    family = _PRE_FAMILIES.get(pre)
    if family == "gpt2":
        return _byte_level(True)
    if family == "digits":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level(True)])
    if family in ("llama3", "qwen2"):
        split = _LLAMA3_SPLIT if family == "llama3" else _QWEN2_SPLIT
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"), _byte_level(False)])
    raise ValueError(f"unsupported GGUF pre-tokenizer tokenizer.ggml.pre={pre!r}; known: {sorted(_PRE_FAMILIES)}")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> character spelling: printable Latin-1 bytes as themselves, the rest from U+0100."""
    keep = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    rest = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + n) for n, b in enumerate(rest)}}


_BYTE_SPELLING = _bytes_to_unicode()
_ALPHABET = frozenset(_BYTE_SPELLING.values())


def _gguf_fields(source) -> dict:
    """A GGUF path, `gguf.GGUFReader`, or mapping of metadata key -> python value, as a dict."""
    if isinstance(source, (str, os.PathLike)):
        import gguf

        source = gguf.GGUFReader(source)
    if isinstance(source, Mapping):
        return dict(source)
    return {k: f.contents() for k, f in source.fields.items()
            if k.startswith("tokenizer.") or k == "general.architecture"}


def _byte_level_backend(f: Mapping, tokens: list[str], types: list[int]) -> tokenizers.Tokenizer:
    """`tokenizer.ggml.model == "gpt2"`: byte-level BPE with the file's merges."""
    pre = _pre_tokenizer(f.get("tokenizer.ggml.pre") or "default")
    added = {i for i, t in enumerate(types) if t in (3, 4)}
    vocab = {}
    for i, tok in enumerate(tokens):  # added tokens keep their raw spelling so they map to their own id
        if i not in added and not set(tok) <= _ALPHABET:
            tok = "".join(_BYTE_SPELLING[b] for b in tok.encode("utf-8"))
        vocab.setdefault(tok, i)
    merges = [tuple(m.split(" ", 1)) for m in f.get("tokenizer.ggml.merges") or []]
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    backend.pre_tokenizer = pre
    backend.decoder = decoders.ByteLevel()
    return backend


# SentencePiece writes a space inside a token as U+2581.
_SPM_SPACE = "\u2581"
# Architectures whose GGUF scores do not give the merge order (user-defined tokens such as runs of spaces
# carry -1000 though they come first); transformers ranks their merges by file position instead.
_POSITION_RANKED = frozenset({"gemma", "gemma2", "gemma3"})


def _spm_spelling(token: str) -> str:
    """A whitespace-only token with its spaces as U+2581 (Gemma files store runs of spaces with real spaces)."""
    return token.replace(" ", _SPM_SPACE) if token.isspace() else token


def _spm_merges(vocab: Mapping[str, int], priority: Sequence[float]) -> list[tuple[str, str]]:
    """The BPE merges a SentencePiece vocabulary implies, best first.

    Every way to cut a token into two vocabulary pieces is a merge. Merges are ranked by the `priority` of
    the token they build (higher first), then by longer left piece, then by token id (transformers' order).
    """
    found = []
    for tok, i in vocab.items():
        for cut in range(1, len(tok)):
            left, right = tok[:cut], tok[cut:]
            if left in vocab and right in vocab:
                found.append((-priority[i], -cut, cut - len(tok), i, left, right))
    found.sort(key=lambda m: m[:4])
    return [(m[4], m[5]) for m in found]


def _sentencepiece_backend(f: Mapping, tokens: list[str], types: list[int]) -> tokenizers.Tokenizer:
    """`tokenizer.ggml.model == "llama"`: SentencePiece BPE with byte fallback (`<0x00>`..`<0xFF>`).

    Spaces become U+2581 (plus one in front of the text when `add_space_prefix`, default on). Without
    merges in the file they are derived from the vocabulary, ranked by score (Gemma: by file position).
    """
    spelled = [_spm_spelling(t) for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}  # a repeated token keeps its last id, as llama.cpp does
    if f.get("tokenizer.ggml.merges"):
        merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"]]
    else:
        scores = f.get("tokenizer.ggml.scores")
        by_position = not scores or f.get("general.architecture") in _POSITION_RANKED
        merges = _spm_merges(vocab, range(0, -len(spelled), -1) if by_position else [float(s) for s in scores])
    unk = f.get("tokenizer.ggml.unknown_token_id")
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=True,
                                              unk_token=None if unk is None else spelled[int(unk)]))
    backend.normalizer = normalizers.Replace(" ", _SPM_SPACE)
    steps = [decoders.Replace(_SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if f.get("tokenizer.ggml.add_space_prefix", True):
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_SPM_SPACE, prepend_scheme="first", split=False)
        steps.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(steps)
    return backend


_BACKENDS = {"gpt2": _byte_level_backend, "llama": _sentencepiece_backend}


def _bos_eos_processor(tokens: list[str], bos: int | None, eos: int | None) -> processors.TemplateProcessing:
    """Post-processor adding `bos` before and `eos` after each sequence (either may be None)."""
    b, e = (f"{tokens[bos]} " if bos is not None else ""), (f" {tokens[eos]}" if eos is not None else "")
    special = {tokens[i]: i for i in (bos, eos) if i is not None}
    return processors.TemplateProcessing(single=f"{b}$A{e}", pair=f"{b}$A{e} $B:1{e}",
                                         special_tokens=list(special.items()))


def _token_of(backend: tokenizers.Tokenizer, spec) -> int | None:
    """An id for a token given as a string or `{"content": ...}` dict (tokenizer_config style)."""
    if isinstance(spec, Mapping):
        spec = spec.get("content")
    return None if spec is None else backend.token_to_id(spec)


def _raise_exception(message):
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


@lru_cache(maxsize=8)
def _compile_template(source: str):
    from jinja2 import ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class Tokenizer:
    """A `tokenizers.Tokenizer` plus special token ids and a chat template."""

    def __init__(self, backend: tokenizers.Tokenizer, *, eos_token_ids: Sequence[int] = (),
                 bos_token_id: int | None = None, pad_token_id: int | None = None,
                 chat_template: str | None = None):
        self.backend = backend
        self.eos_token_ids = tuple(dict.fromkeys(int(i) for i in eos_token_ids))
        self.bos_token_id = None if bos_token_id is None else int(bos_token_id)
        self.pad_token_id = None if pad_token_id is None else int(pad_token_id)
        self.chat_template = chat_template

    @classmethod
    def from_gguf(cls, source) -> Tokenizer:
        """Build from GGUF metadata: a dict of key -> `field.contents()`, a `gguf.GGUFReader`, or a path.

        Supports `tokenizer.ggml.model` "gpt2" (byte-level BPE) and "llama" (SentencePiece BPE with byte
        fallback, e.g. Gemma 3). Control tokens (type 3) become special added tokens, user-defined ones
        (type 4) plain added tokens. `eot`/`eom` ids join the eos ids.
        """
        f = _gguf_fields(source)
        kind = f.get("tokenizer.ggml.model")
        if kind not in _BACKENDS:
            raise ValueError(f"unsupported GGUF tokenizer model tokenizer.ggml.model={kind!r}; "
                             f"supported: {sorted(_BACKENDS)}")
        tokens = list(f["tokenizer.ggml.tokens"])
        types = list(f.get("tokenizer.ggml.token_type") or [1] * len(tokens))
        backend = _BACKENDS[kind](f, tokens, types)
        control = [tokens[i] for i, t in enumerate(types) if t == 3]
        # A user-defined token the vocabulary spells differently (Gemma's runs of spaces) stays a BPE token.
        user = [tokens[i] for i, t in enumerate(types) if t == 4 and backend.token_to_id(tokens[i]) is not None]
        backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
        backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])

        def get_id(key):
            v = f.get(f"tokenizer.ggml.{key}")
            return None if v is None else int(v)

        bos, eos = get_id("bos_token_id"), get_id("eos_token_id")
        # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise.
        add_bos = bos is not None and bool(f.get("tokenizer.ggml.add_bos_token", kind == "llama"))
        add_eos = eos is not None and bool(f.get("tokenizer.ggml.add_eos_token"))
        if add_bos or add_eos:  # what `encode(..., add_special_tokens=True)` adds
            backend.post_processor = _bos_eos_processor(tokens, bos if add_bos else None, eos if add_eos else None)
        eos_ids = [i for i in (eos, get_id("eot_token_id"), get_id("eom_token_id")) if i is not None]
        return cls(backend, eos_token_ids=eos_ids, bos_token_id=bos, pad_token_id=get_id("padding_token_id"),
                   chat_template=f.get("tokenizer.chat_template"))

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike) -> Tokenizer:
        """Build from a Hugging Face folder: tokenizer.json, tokenizer_config.json, chat_template.jinja
        and generation_config.json (whose `eos_token_id` ids are added to the eos ids)."""
        path = Path(path)
        backend = tokenizers.Tokenizer.from_str(read_bytes(str(path / "tokenizer.json")).decode("utf-8"))  # or .xz

        def load(name):
            p = path / name
            return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}

        config = {**load("special_tokens_map.json"), **load("tokenizer_config.json")}
        gen = load("generation_config.json")
        template = config.get("chat_template")
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")
        elif isinstance(template, list):  # named templates: use "default"
            template = {t["name"]: t["template"] for t in template}.get("default")
        eos_ids = [_token_of(backend, config.get("eos_token"))]
        gen_eos = gen.get("eos_token_id")
        eos_ids += gen_eos if isinstance(gen_eos, list) else [gen_eos]
        return cls(backend, eos_token_ids=[i for i in eos_ids if i is not None],
                   bos_token_id=_token_of(backend, config.get("bos_token")),
                   pad_token_id=_token_of(backend, config.get("pad_token")), chat_template=template)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def _token(self, i: int | None) -> str | None:
        return None if i is None else self.backend.decode([i], skip_special_tokens=False)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written in it are matched whole."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; special tokens kept unless skip_special_tokens (as Hugging Face's decode)."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[Mapping], add_generation_prompt: bool = False,
                            tokenize: bool = True, **kwargs) -> list[int] | str:
        """Render `messages` with the chat template (as transformers does); ids unless `tokenize=False`.

        Extra keyword arguments are passed to the template as variables.
        """
        if not messages:
            raise ValueError("apply_chat_template needs at least one message")
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template (no tokenizer.chat_template / chat_template.jinja)")
        text = _compile_template(self.chat_template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt,
            bos_token=self._token(self.bos_token_id) or "",
            eos_token=self._token(self.eos_token_ids[0] if self.eos_token_ids else None) or "", **kwargs)
        return self.encode(text) if tokenize else text


def prompt_ids(tokenizer, text: str) -> list[int]:
    """A user prompt as ids: through the chat template, as a user turn with the assistant's turn
    opened; for a tokenizer without one (a base model, such as Gemma 3 270M) the text itself after
    the tokenizer's BOS."""
    if isinstance(tokenizer, Tokenizer) and not tokenizer.chat_template:
        return tokenizer.encode(text, add_special_tokens=True)
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
