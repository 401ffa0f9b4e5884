"""Streaming: each target pass's new tokens reach the host while the compiled loop runs.

A loop compiled with streaming on calls `send` once per step (jax.experimental.io_callback, no
result): the call's stream id, the step number, the tokens the step emitted per row and how many
of them count. The host side looks the id up among the open streams and hands each row's new tokens
to the caller's function, in step order (the calls are unordered effects, so steps that arrive out
of order wait in `pending`). One compiled program serves every call: the id is an argument, and a
closed or unknown id (the cost timing runs with -1) is dropped.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Callable, Optional

import jax
import numpy as np
from jax.experimental import io_callback

OnTokens = Callable[[list], None]     # list[list[int]]: one pass's new tokens per row ([] for none)
NO_STREAM = -1                        # the stream id of calls nobody listens to


class _Stream:
    def __init__(self, on_tokens: OnTokens):
        self.on_tokens, self.next_step, self.pending = on_tokens, 0, {}


_OPEN: dict = {}
_IDS = itertools.count()
_LOCK = threading.Lock()


@contextlib.contextmanager
def opened(on_tokens: Optional[OnTokens]):
    """-> the stream id to pass to a streaming loop while the block runs (NO_STREAM for None)."""
    if on_tokens is None:
        yield NO_STREAM
        return
    with _LOCK:
        stream_id = next(_IDS) % (1 << 30)
        _OPEN[stream_id] = _Stream(on_tokens)
    try:
        yield stream_id
    finally:
        with _LOCK:
            _OPEN.pop(stream_id, None)


def _open_stream(stream_id):
    """The open stream of that id, or None."""
    with _LOCK:
        return _OPEN.get(int(stream_id))


def _receive(stream_id, step, tokens, counts) -> None:
    """Host side of send: tokens int32[B, P], counts int32[B] -> on_tokens, in step order."""
    stream = _open_stream(stream_id)
    if stream is None:
        return
    tokens, counts = np.asarray(tokens), np.asarray(counts)
    stream.pending[int(step)] = [tokens[b, :counts[b]].tolist() for b in range(tokens.shape[0])]
    while stream.next_step in stream.pending:
        stream.on_tokens(stream.pending.pop(stream.next_step))
        stream.next_step += 1


def send(stream_id: jax.Array, step: jax.Array, tokens: jax.Array, counts: jax.Array) -> None:
    """In a loop step: hand tokens int32[B, P] (the first counts int32[B] of each row are new) to the
    host. stream_id int32, step int32: the loop's step number, from 0."""
    io_callback(_receive, None, stream_id, step, tokens, counts, ordered=False)


def deliver(stream_id: int, rows: list) -> None:
    """From the host, outside any loop: the prompts' pass's first token per row, as step -1 would."""
    stream = _open_stream(stream_id)
    if stream is not None:
        stream.on_tokens(rows)
