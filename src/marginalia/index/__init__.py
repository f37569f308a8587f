"""Embedding and retrieval."""

from .embedders import Embedder, HashingEmbedder, load_embedder

__all__ = ["Embedder", "HashingEmbedder", "load_embedder"]
