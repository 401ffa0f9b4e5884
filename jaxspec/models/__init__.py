"""Decoder forward passes as pure functions over a params pytree."""
from .llama import forward, forward_hidden, init_params, lm_head, lm_head_rows, rms_norm

__all__ = ["forward", "forward_hidden", "init_params", "lm_head", "lm_head_rows", "rms_norm"]
