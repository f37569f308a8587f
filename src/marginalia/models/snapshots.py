"""Stored document caches: full WiM readings kept on disk under the home directory, bounded in size.

A file holds one snapshot of a model's cache after it read a document: a JSON header line (schema,
key, model identity, the token ids) and then the backend's state bytes. Files are written atomically
and named by a key over everything that decides the cache's contents (the model, the intro's and the
document's token ids), so a changed document, intro or model never meets a stale cache. A damaged or
mismatched file is deleted and ignored, never trusted. When the folder grows past its bound, the
least recently used files go first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import BackendError
from ..files import atomic_write_bytes
from ..home import resolve_home
from ..records import Segment
from .base import CacheSnapshot, CachingGenerator

log = logging.getLogger(__name__)

SCHEMA = 1
SUFFIX = ".snapshot"
#: the default bound on the folder, in bytes
DEFAULT_MAX_BYTES = 2 * 2**30


def snapshot_key(generator: CachingGenerator, head: Sequence[int], segments: Sequence[Segment]) -> str:
    """The key of a cache that holds ``head`` then every segment's tokens, for this model."""
    h = hashlib.sha256()
    h.update(generator.cache_identity().encode("utf-8"))
    for part in (head, *(s.token_ids for s in segments)):
        h.update(len(part).to_bytes(4, "little"))
        h.update(b"".join(int(i).to_bytes(4, "little", signed=True) for i in part))
    return h.hexdigest()[:40]


class SnapshotStore:
    """A folder of stored caches, at most ``max_bytes`` in all.

    Args:
        folder: where the files live (created when needed).
        max_bytes: the bound; the least recently used files are deleted past it.
    """

    def __init__(self, folder: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.folder = Path(folder)
        self.max_bytes = max_bytes

    @classmethod
    def at_home(cls, home: str | os.PathLike[str] | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> SnapshotStore:
        """The store under marginalia's home directory (``<home>/cache/documents``)."""
        return cls(resolve_home(home) / "cache" / "documents", max_bytes)

    def path(self, key: str) -> Path:
        return self.folder / f"{key}{SUFFIX}"

    def get(self, key: str, generator: CachingGenerator) -> CacheSnapshot | None:
        """The stored snapshot for ``key``, or None (a damaged or mismatched file is deleted)."""
        path = self.path(key)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        try:
            header_line, _, state = data.partition(b"\n")
            header = json.loads(header_line)
            ok = (isinstance(header, dict) and header.get("schema") == SCHEMA and header.get("key") == key
                  and header.get("model") == generator.cache_identity() and isinstance(header.get("ids"), list)
                  and header.get("state_bytes") == len(state))
            if not ok:
                raise ValueError("a header that does not match")
            snapshot = generator.snapshot_from_bytes([int(i) for i in header["ids"]], state)
        except (ValueError, TypeError, BackendError) as exc:
            log.warning("ignoring the damaged or mismatched cache file %s (%s); it will be written again", path, exc)
            path.unlink(missing_ok=True)
            return None
        os.utime(path)  # recently used
        return snapshot

    def put(self, key: str, snapshot: CacheSnapshot, generator: CachingGenerator) -> Path | None:
        """Store ``snapshot`` under ``key`` (atomically), then evict past the bound; None when the backend
        keeps no state of its own (an HTTP server caches the prefix itself) or it alone exceeds the bound."""
        state = generator.state_bytes(snapshot)
        if not state:
            return None
        header = {"schema": SCHEMA, "key": key, "model": generator.cache_identity(), "ids": list(snapshot.ids),
                  "state_bytes": len(state)}
        blob = json.dumps(header).encode("utf-8") + b"\n" + state
        if len(blob) > self.max_bytes:
            log.warning("not storing a %d-byte cache: it alone exceeds the bound of %d bytes", len(blob),
                        self.max_bytes)
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        atomic_write_bytes(path, blob)
        self.evict(keep=path)
        return path

    def files(self) -> list[Path]:
        """The stored files, least recently used first."""
        if not self.folder.is_dir():
            return []
        found = []
        for path in self.folder.glob(f"*{SUFFIX}"):
            try:
                found.append((path.stat().st_mtime, path))
            except OSError:
                continue
        return [p for _, p in sorted(found)]

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.files() if p.exists())

    def evict(self, keep: Path | None = None) -> None:
        """Delete the least recently used files until the folder is within its bound."""
        files = self.files()
        total = sum(p.stat().st_size for p in files)
        for path in files:
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            total -= path.stat().st_size
            path.unlink(missing_ok=True)
