"""The audit log: who uploaded, deleted, made or revoked a key, and who asked which collection, when; one
JSON object a line in the home, rotated by size.

A line names the actor (``key:<name>``, ``user:<name>``, ``server-key``, ``anonymous`` or ``cli``), the
action, its time and what it touched. A question's text is written only when the server was started
with ``--audit-questions``. Tokens are never written.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any

from ..home import resolve_home

#: the log's file in the home
AUDIT_FILE = "audit.jsonl"
#: bytes a log file grows to before it is rotated, and how many old ones are kept
MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 5

#: homes whose log file is kept open at once (a process serves one; tests make many)
OPEN_LOGS = 8

_handlers: OrderedDict[Path, RotatingFileHandler] = OrderedDict()
_lock = threading.Lock()


def _write(path: Path, line: str) -> None:
    """Append ``line`` to the log at ``path``, rotating it past `MAX_BYTES` (the handler does, under its lock)."""
    with _lock:
        handler = _handlers.get(path)
        if handler is None:
            handler = RotatingFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8")
            handler.setFormatter(logging.Formatter("%(message)s"))
            _handlers[path] = handler
            while len(_handlers) > OPEN_LOGS:
                _handlers.popitem(last=False)[1].close()
        _handlers.move_to_end(path)
        # a record handed to the handler alone: the audit trail stays in its file, out of the server's log
        handler.handle(logging.makeLogRecord({"msg": line, "levelno": logging.INFO, "levelname": "INFO"}))


class Audit:
    """Writes audit lines to ``<home>/audit.jsonl``; ``questions``: include question texts."""

    def __init__(self, home: str | Path | None = None, questions: bool = False) -> None:
        self.path = resolve_home(home) / AUDIT_FILE
        self.questions = questions

    def record(self, actor: str, action: str, **fields: Any) -> None:
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "epoch": round(time.time(), 3), "actor": actor,
                "action": action, **{k: v for k, v in fields.items() if v is not None}}
        _write(self.path, json.dumps(line, ensure_ascii=False))

    def asked(self, actor: str, collection: str | None, question: str, route: str,
              document: str | None = None) -> None:
        self.record(actor, "ask", collection=collection, document=document, route=route,
                    question=question if self.questions else None)
