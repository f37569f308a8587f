"""Asking: one question over a text, a document or a collection; and chat sessions that keep the source."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from ...records import Answer
from ..common import STREAMED, Caller, ParsedOffLoop, answer, get_service, start_reading
from ..schemas import AskRequest, MessageRequest, SessionRequest, options_schema
from ..service import Service

router = APIRouter(prefix="/v1", tags=["reading"], route_class=ParsedOffLoop)
ServiceDep = Annotated[Service, Depends(get_service)]

EVENTS_DOC = (
    "With `stream: true` the answer comes as server-sent events, one per reading step: `started`, "
    "`retrieved` (collections), `segment_read`, `margin_written`, `margin_judged` (wim), `answer_delta`, "
    "and `done` with the whole answer, its references (document, section path, page, character span, "
    "quoted text) and stats. An `error` event, with the margins judged so far, ends a stream that failed. "
    "The stream's `Marginalia-Reading-Id` header names the reading: `POST /v1/readings/{id}/stop` stops it "
    "and the answer still comes, from what was read. Disconnecting stops the reading within one segment "
    "and sends nothing more."
)


@router.post("/ask", summary="Answer a question about a text, a document of a collection, or a collection",
             description=EVENTS_DOC, responses=STREAMED)
async def ask(body: AskRequest, request: Request, service: ServiceDep, who: Caller) -> Response:
    prepared = await run_in_threadpool(service.prepare, body, body.question, body.temperature, who)
    return await answer(start_reading(service, prepared, who), request, body.stream)


@router.get("/patterns", summary="The ways of reading and their options, as JSON Schema",
            description="A JSON Schema of a request's reading options: `reading` is one of the registered patterns "
                        "(its name as `title`, its `description`, its options with their defaults, bounds and "
                        "descriptions), with `temperature` and `collection_options`. The web page builds its "
                        "form from it.")
def patterns() -> dict[str, Any]:
    return options_schema()


@router.post("/readings/{reading_id}/stop", summary="Stop a reading; it answers from what it has read",
             description="The reading's id is the `Marginalia-Reading-Id` header of its stream. It finishes the "
                         "step in progress, reads nothing more and answers: its stream goes on to `done`, "
                         "which says `stopped_early`. 404 when no such reading waits or runs.")
def stop_reading(reading_id: str, service: ServiceDep, who: Caller) -> dict[str, Any]:
    service.worker.reading(reading_id, who.owner).stop()
    return {"stopping": reading_id}


@router.post("/sessions", status_code=status.HTTP_201_CREATED, tags=["sessions"],
             summary="Start a chat session over a text, a document of a collection, or a collection")
async def create_session(body: SessionRequest, service: ServiceDep, who: Caller) -> dict[str, Any]:
    if body.collection is not None:  # fail now, not at the first message
        await run_in_threadpool(_check_target, service, body, who)
    session = service.sessions.create(body, who.owner)
    return session.to_dict(service.sessions.ttl)


def _check_target(service: Service, body: SessionRequest, who: Caller) -> None:
    store = service.open_collection(body.collection or "", who=who)
    if body.document is not None:
        service.find_document(store, body.document)


@router.get("/sessions/{session_id}", tags=["sessions"], summary="A session's source and its questions so far")
def get_session(session_id: str, service: ServiceDep, who: Caller) -> dict[str, Any]:
    return service.sessions.get(session_id, who.owner).to_dict(service.sessions.ttl)


@router.delete("/sessions/{session_id}", tags=["sessions"], summary="End a session")
def delete_session(session_id: str, service: ServiceDep, who: Caller) -> dict[str, Any]:
    service.sessions.delete(session_id, who.owner)
    return {"deleted": session_id}


@router.post("/sessions/{session_id}/messages", tags=["sessions"], summary="Ask the session's source a question",
             description=EVENTS_DOC, responses=STREAMED)
async def send_message(session_id: str, body: MessageRequest, request: Request, service: ServiceDep,
                       who: Caller) -> Response:
    lease = service.sessions.lease(session_id, who.owner)
    session, release = lease.item, lease.release

    def remember(result: Answer) -> None:
        session.remember(body.message, result.text)

    try:
        # the session's collection is checked again: the key's grants may have changed since it began
        prepared = await run_in_threadpool(session.prepare, body.message, body.temperature,
                                           partial(service.prepare, who=who, route="session"))
        reading = start_reading(service, prepared, who)
    except BaseException:
        release()
        raise
    return await answer(reading, request, body.stream, on_answer=remember, done=release)
