"""Composing: sessions that suggest the next words of a text being written, with a memory drawn from a
collection, and the memory itself with its sources."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse

from ...compose import Suggested
from ..common import Caller, ParsedOffLoop, get_service, sse
from ..compose import ComposeSession, Suggestion, suggestion_dict
from ..errors import describe, error_body, error_response
from ..schemas import ComposeSessionRequest, SuggestionRequest
from ..service import Service
from ..worker import Failed

router = APIRouter(prefix="/v1/compose", tags=["compose"], route_class=ParsedOffLoop)
ServiceDep = Annotated[Service, Depends(get_service)]

MEMORY_DOC = (
    "`memory` holds the items the suggestions draw on, oldest first, each with its source: the document, its "
    "section path and the character span in the document's text (`GET /v1/collections/{name}/documents/"
    "{document}` has that text). `refreshing` says new memory is being written or prepared; `failing` that "
    "the last memory request failed or ran past `memory_timeout` (suggestions go on with the memory there "
    "is); `notices` carries a sentence for the writer once per run of failures: a reply that has shown it "
    "takes it, later replies come with none."
)
SUGGEST_DOC = (
    "The text is the whole text so far; the suggestion continues it. A newer request for the same session "
    "cancels this one (its reply says `cancelled`, with the text written until then), so a client sends the "
    "text as it changes and shows only the latest reply. The server waits the session's `debounce` first. "
    "With `stream: true` the reply is server-sent events: `delta` for each piece of text, then `done` with "
    "the whole reply; a client that leaves cancels it. " + MEMORY_DOC
)


@router.post("/sessions", status_code=status.HTTP_201_CREATED,
             summary="Start composing over a collection",
             description="Loads the session's own client and memory models (or reuses those of an ended "
                         "session). 400 when the collection holds nothing to draw memory from or a model cannot "
                         "serve, 404 for an unknown collection, 429 when every compose session is busy; the "
                         "least recently used idle session otherwise makes room. " + MEMORY_DOC)
async def create_session(body: ComposeSessionRequest, service: ServiceDep, who: Caller) -> dict[str, Any]:
    session = await run_in_threadpool(service.start_compose, body, who)
    return session.to_dict(service.compose.ttl)


@router.get("/sessions/{session_id}", summary="A compose session, with its memory")
def get_session(session_id: str, service: ServiceDep, who: Caller) -> dict[str, Any]:
    return _session(service, session_id, who).to_dict(service.compose.ttl)


def _session(service: Service, session_id: str, who: Caller) -> ComposeSession:
    """The caller's compose session; one over a collection it may no longer read is not found."""
    session = service.compose.get(session_id, who.owner)
    service.check_collection(session.collection, who)
    return session


@router.get("/sessions/{session_id}/memory", summary="The memory a session's suggestions draw on, with sources",
            description=MEMORY_DOC)
def get_memory(session_id: str, service: ServiceDep, who: Caller) -> dict[str, Any]:
    return _session(service, session_id, who).memory()


@router.delete("/sessions/{session_id}", summary="End a compose session")
def delete_session(session_id: str, service: ServiceDep, who: Caller) -> dict[str, Any]:
    service.compose.delete(session_id, who.owner)
    return {"deleted": session_id}


@router.post("/sessions/{session_id}/suggestions", summary="Suggest what comes next in the text",
             description=SUGGEST_DOC)
async def suggest(session_id: str, body: SuggestionRequest, service: ServiceDep, who: Caller) -> Response:
    lease = service.compose.lease(session_id, who.owner)
    session, release = lease.item, lease.release
    handed_over = False  # to the event stream, which then releases the session itself
    try:
        await run_in_threadpool(service.check_collection, session.collection, who)
        suggestion = Suggestion(session, body.text)
        first = await suggestion.next()
        if isinstance(first, Failed):
            return error_response(first.error)
        if body.stream:
            handed_over = True
            return EventSourceResponse(_events(suggestion, session, first, release))
        result = None
        item: Any = first
        while item is not None:
            if isinstance(item, Failed):
                return error_response(item.error)
            if isinstance(item, Suggested):
                result = item
            item = await suggestion.next()
        if result is None:  # pragma: no cover - every suggestion ends in its record or an error
            raise RuntimeError("the suggestion ended without its record")
        return JSONResponse(suggestion_dict(result, session))
    finally:
        if not handed_over:
            release()


async def _events(suggestion: Suggestion, session: ComposeSession, item: Any,
                  release: Callable[[], None]) -> AsyncIterator[dict[str, str]]:
    try:
        while item is not None:
            if isinstance(item, Failed):
                _, code, message = describe(item.error)
                yield sse("error", error_body(code, message))
                return
            if isinstance(item, Suggested):
                yield sse("done", suggestion_dict(item, session))
            else:
                yield sse("delta", {"text": item})
            item = await suggestion.next()
    finally:  # the client left, or the suggestion ended
        if not suggestion.finished:
            suggestion.cancel()
        release()
