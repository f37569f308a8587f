"""Model backends behind the Generator seam, chosen by spec string."""

from .base import CachingGenerator, GenerationParams, Generator, Message, Tokenizer, Usage
from .registry import gguf_file, known_specs, load_generator, register_backend

DEFAULT_MODEL = "smollm2"

__all__ = [
    "DEFAULT_MODEL",
    "CachingGenerator",
    "GenerationParams",
    "Generator",
    "Message",
    "Tokenizer",
    "Usage",
    "gguf_file",
    "known_specs",
    "load_generator",
    "register_backend",
]
