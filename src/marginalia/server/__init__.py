"""The document QA HTTP service (FastAPI): collections, uploads, questions with streamed reading steps,
chat sessions, and docqa- and OpenAI-compatible routes; a thin adapter over `marginalia.app`.

Needs the ``serve`` extra: ``pip install 'marginalia[serve]'``. Start it with ``marginalia serve``, or
build the ASGI app with `create_app`. `Settings` (and this package) import without FastAPI, so the CLI
can describe the server's options when the extra is not installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .settings import Settings

if TYPE_CHECKING:
    from .factory import create_app

__all__ = ["Settings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .factory import create_app

        return create_app
    raise AttributeError(f"module 'marginalia.server' has no attribute {name!r}")
