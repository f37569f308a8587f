"""The docqa service's ``/chat``: a message and the retrieval thresholds in; answer, references, metadata out
(``metadata``: the whole answer, as every answer is sent)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from ...errors import UserError
from ...records import Answer
from ..common import Caller, ParsedOffLoop, answer, get_service, start_reading
from ..events import answer_dict
from ..schemas import AskRequest, DocqaChatRequest, Strict
from ..service import Service

router = APIRouter(tags=["docqa"], route_class=ParsedOffLoop)
ServiceDep = Annotated[Service, Depends(get_service)]


def docqa_output(result: Answer) -> dict[str, Any]:
    """docqa's reply: ``answer``, ``references`` (``source``, ``content``, and where in the source), and
    ``metadata``: the answer's document (`Answer.to_dict`)."""
    document = answer_dict(result)
    references = [{"source": ref["source"], "content": ref["text"],
                   **{key: value for key, value in ref.items() if key not in ("source", "text")}}
                  for ref in document["references"]]
    return {"answer": result.text, "references": references, "metadata": document}


@router.post("/chat", summary="Answer a message from a collection (docqa's request and reply)")
async def chat(body: DocqaChatRequest, request: Request, service: ServiceDep, who: Caller) -> Response:
    name = body.collection or service.settings.default_collection
    if name is None:
        raise UserError("name the collection: send 'collection', or start the server with --collection NAME")
    target = AskRequest(question=body.message, collection=name,
                        collection_options=Strict.CollectionOptions(**body.collection_options().model_dump()))
    prepared = await run_in_threadpool(service.prepare, target, body.message, body.temperature, who, "chat")
    return await answer(start_reading(service, prepared, who), request, stream=False, render=docqa_output)
