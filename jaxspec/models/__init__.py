"""Decoder forward passes as pure functions over a params pytree."""
from .llama import (forward, forward_hidden, init_params, layer_params, lm_head, lm_head_rows, rms_norm,
                    stack_layers, unstack_layers)

__all__ = ["forward", "forward_hidden", "init_params", "layer_params", "lm_head", "lm_head_rows", "rms_norm",
           "stack_layers", "unstack_layers"]
