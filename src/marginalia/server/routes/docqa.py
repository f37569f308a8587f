"""The docqa service's ``/chat``: a message and the retrieval thresholds in; answer, references, metadata out."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from ...errors import UserError
from ...records import Answer
from ..common import Caller, ParsedOffLoop, answer, get_service, start_reading
from ..events import reference_dict, route_dict
from ..schemas import AskRequest, DocqaChatRequest, Strict
from ..service import Service

router = APIRouter(tags=["docqa"], route_class=ParsedOffLoop)
ServiceDep = Annotated[Service, Depends(get_service)]


def docqa_output(result: Answer) -> dict[str, Any]:
    """docqa's reply: ``answer``, ``references`` (``source``, ``content``, and where in the source), ``metadata``."""
    references = [{"source": r.source, "content": r.text, **reference_dict(r)} for r in result.references]
    for ref in references:
        del ref["quote"], ref["document"]  # said by content and source
    return {"answer": result.text, "references": references,
            "metadata": {"pattern": result.pattern, "model": result.model, "retrieval": result.retrieval or None,
                         "route": route_dict(result.route), "segments_read": result.segments_read,
                         "segments_total": result.segments_total, "stats": asdict(result.stats)}}


@router.post("/chat", summary="Answer a message from a collection (docqa's request and reply)")
async def chat(body: DocqaChatRequest, request: Request, service: ServiceDep, who: Caller) -> Response:
    name = body.collection or service.settings.default_collection
    if name is None:
        raise UserError("name the collection: send 'collection', or start the server with --collection NAME")
    target = AskRequest(question=body.message, collection=name,
                        collection_options=Strict.CollectionOptions(**body.collection_options().model_dump()))
    prepared = await run_in_threadpool(service.prepare, target, body.message, body.temperature, who, "chat")
    return await answer(start_reading(service, prepared, who), request, stream=False, render=docqa_output)
