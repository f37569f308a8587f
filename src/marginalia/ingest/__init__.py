"""Reading documents in, and cutting them into segments."""

from .segment import segment_text
from .text import read_document

__all__ = ["read_document", "segment_text"]
