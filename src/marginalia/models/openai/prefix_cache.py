"""The prefix-cache policy of the OpenAI-compatible backend: whether a server's requests share one prefix cache
(vLLM, SGLang) or llama.cpp's llama-server keeps a prompt per slot, and on such a server a reading's requests
pinned to one slot, and a full reading's state kept in a file on the server and put back into that slot before
a request that needs it.

llama-server keeps a prompt per slot and reuses only what the slot holds: a request that shares a shorter prefix
cuts the slot's state there, so a second question over a reading (each margin request ends at an earlier
segment than the state before it) would read the document again. Started with ``--slot-save-path DIR``, it
saves a slot's state to a file and restores it (``POST /slots/<id>?action=save|restore``); restoring is a copy,
not an evaluation. Without that flag a save is refused once, and the slots are still pinned.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

    from .replies import ModelEntry

log = logging.getLogger(__name__)

#: the ``owned_by`` of llama.cpp's llama-server in ``GET /models``: a server that keeps a prompt per slot
PER_SLOT_OWNER = "llamacpp"


def digest(ids: Sequence[int]) -> str:
    """A short key of a token sequence."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:20]


class ServerSlots:
    """What a server says of itself and what its slots hold, shared by a generator and all its forks.

    Args:
        client: the generator's HTTP client.
        base_url: the API root (``.../v1``); llama-server's ``/props`` and ``/slots`` are beside it.
        models: lists the server's ``GET /models`` entries ([] when it gives none).
        per_slot: whether the server keeps a prompt per slot; None asks ``GET /models`` once.
    """

    def __init__(self, client: httpx.Client, base_url: str, models: Callable[[], list[ModelEntry]],
                 model: str, per_slot: bool | None = None) -> None:
        self.client = client
        self.root = base_url[:-3] if base_url.endswith("/v1") else base_url
        self._models = models
        self._model = model
        self._per_slot = per_slot
        self._total: int | None = None
        self._next = itertools.count()
        self._lock = threading.Lock()
        self.saving = True  # until the server refuses a save (started without --slot-save-path)
        self.saved: dict[int, str] = {}  # slot -> digest of the reading its file holds

    @property
    def per_slot(self) -> bool:
        """Whether the server keeps a prompt per slot (llama-server), asked once."""
        with self._lock:
            if self._per_slot is None:
                entries = self._models()
                entry = next((m for m in entries if m.id == self._model), entries[0] if len(entries) == 1 else None)
                self._per_slot = entry is not None and entry.owned_by == PER_SLOT_OWNER
            return self._per_slot

    def next_slot(self) -> int | None:
        """A slot for a new reading (round robin over ``/props``' ``total_slots``); None when the server does not
        say how many it has."""
        with self._lock:
            if self._total is None:
                self._total = self._total_slots()
            return next(self._next) % self._total if self._total else None

    def _total_slots(self) -> int:
        try:
            response = self.client.get(f"{self.root}/props")
            total = response.json().get("total_slots") if response.status_code == 200 else None
        except Exception:  # noqa: BLE001 - a server without /props, or not JSON: no pinning
            return 0
        return total if isinstance(total, int) and total > 0 else 0

    def save(self, slot: int, ids: Sequence[int]) -> None:
        """Save what ``slot`` holds (a prefix ``ids`` and what followed it) to its file on the server."""
        if not self.saving:
            return
        reply = self._action(slot, "save")
        if reply is None:
            return
        if reply.status_code != 200:
            self.saving = False
            log.info("llama-server at %s keeps no slot files (%s): a second question over a reading reads the "
                     "document again; start it with --slot-save-path DIR", self.root, _message(reply))
            return
        self.saved[slot] = digest(ids)

    def restore(self, slot: int, ids: Sequence[int]) -> None:
        """Put the saved reading ``ids`` back into ``slot``, if its file holds it (else leave the slot as it is)."""
        if self.saved.get(slot) != digest(ids):
            return
        reply = self._action(slot, "restore")
        if reply is not None and reply.status_code != 200:
            self.saved.pop(slot, None)
            log.debug("restoring slot %d failed: %s", slot, _message(reply))

    def _action(self, slot: int, action: str) -> httpx.Response | None:
        try:
            return self.client.post(f"{self.root}/slots/{slot}", params={"action": action},
                                    json={"filename": f"marginalia-slot-{slot}.bin"})
        except Exception as exc:  # noqa: BLE001 - the next request says what is wrong with the server
            log.debug("slot %s of %s failed: %s", action, self.root, exc)
            return None


@dataclass
class Pin:
    """The slot one generator's requests go to, and what that slot last read (each fork has its own pin).

    ``own``: a reading of its own, pinned to a slot at its first request on a per-slot server; ``slot``: None
    sends requests to any slot; ``sent``: the prompt of the last request (what its slot holds, then what it
    generated).
    """

    slots: ServerSlots
    own: bool = False
    slot: int | None = None
    sent: list[int] = field(default_factory=list)

    def fresh(self) -> Pin:
        """The pin of an empty fork: a reading of its own, with no slot yet."""
        return Pin(self.slots, own=True)

    def choose(self) -> None:
        """Before a request: a reading of its own on a per-slot server takes a slot, once."""
        if self.own and self.slot is None and self.slots.per_slot:
            self.slot = self.slots.next_slot()

    def save(self, ids: Sequence[int]) -> None:
        """Save the slot's state to its file when the slot has just read the prefix ``ids``."""
        if self.slot is not None and ids and self.sent[:len(ids)] == list(ids):
            self.slots.save(self.slot, ids)

    def restore(self, ids: Sequence[int]) -> None:
        """Put the reading ``ids`` back into the slot, if the slot's file holds it."""
        if self.slot is not None:
            self.slots.restore(self.slot, ids)


def _message(reply: Any) -> str:
    try:
        error = reply.json().get("error")
        return str(error.get("message") if isinstance(error, dict) else error or reply.text)[:200]
    except ValueError:
        return str(reply.text)[:200]
