"""Reading documents in, and cutting them into segments."""

from .loaders import read_document
from .segment import segment_text

__all__ = ["read_document", "segment_text"]
