"""jaxspec: lossless speculative decoding for JAX language models."""
from .config import ModelConfig
from .generation import GenerateOutput, Stats, generate
from .loading import load
from .model import Model
from .sampling import Sampling
from .tree import Tree
from .warm import enable_compilation_cache

enable_compilation_cache()          # warm starts: jaxspec/warm.py ($JAXSPEC_WARM_START=0: off)

__all__ = ["ModelConfig", "Model", "load", "generate", "GenerateOutput", "Stats", "Sampling", "Tree"]
__version__ = "0.1.0"
