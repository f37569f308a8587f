"""An OpenAI-compatible chat API over collections: ``model`` is ``marginalia:<collection>``, read as
``extra_body={"marginalia": {"reading": ...}}`` says (by default auto: retrieval, then WiM where retrieval's
answer does not stand). The reading's id and the whole answer (`Answer.to_dict`: its references, margins,
route and stats) travel in one extra field, ``marginalia``: ``{"reading_id", "answer"}`` in the reply; in a
stream, the id in the first chunk and the answer in the last. The id is in the ``Marginalia-Reading-Id``
header too, so a client can stop the reading with ``POST /v1/readings/{id}/stop``."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse

from ...errors import NotFound
from ...records import Answer, AnswerDelta, Done, Stats
from ..common import CLIENT_CLOSED, READING_HEADER, STREAMED, Caller, ParsedOffLoop, get_service, start_reading
from ..errors import describe, error_body, error_response
from ..events import answer_dict
from ..schemas import AskRequest, ChatCompletionRequest
from ..service import Service
from ..worker import ClientGone, Failed, Reading

router = APIRouter(prefix="/v1", tags=["openai"], route_class=ParsedOffLoop)
ServiceDep = Annotated[Service, Depends(get_service)]
PREFIX = "marginalia:"


@router.get("/models", summary="The collections, as OpenAI models named marginalia:<collection>")
def list_models(service: ServiceDep, who: Caller) -> dict[str, Any]:
    return {"object": "list", "data": [
        {"id": PREFIX + c["name"], "object": "model", "created": _epoch(c["created_at"]), "owned_by": "marginalia"}
        for c in service.collections(who)]}


def _epoch(iso: str) -> int:
    from datetime import datetime

    try:
        return int(datetime.fromisoformat(iso).timestamp())
    except (TypeError, ValueError):
        return 0


def usage(stats: Stats) -> dict[str, int]:
    """OpenAI's usage: the prompt tokens evaluated, or those sent to a model server that did not say what it
    evaluated (OpenAI's own ``prompt_tokens`` counts a prompt whole, cached tokens included)."""
    if stats.prefilled_context_tokens is None or stats.prefilled_other_tokens is None:
        prompt = stats.prompt_tokens_sent
    else:
        prompt = stats.prefilled_context_tokens + stats.prefilled_other_tokens
    completion = stats.generated_answer_tokens + stats.generated_margin_tokens + stats.generated_other_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


@router.post("/chat/completions", summary="Answer the last user message from a collection (OpenAI's format)",
             description="The reply (or a stream's first chunk) carries `marginalia: {reading_id}`, as does the "
                         "`Marginalia-Reading-Id` header: `POST /v1/readings/{id}/stop` stops the reading, "
                         "which still answers from what it read. The reply (or a stream's last chunk) carries "
                         "`marginalia: {answer}`: the whole answer, as `/v1/ask` sends it (references, margins, "
                         "route, stats).",
             responses=STREAMED)
async def chat_completions(body: ChatCompletionRequest, request: Request, service: ServiceDep,
                           who: Caller) -> Response:
    if not body.model.startswith(PREFIX) or len(body.model) == len(PREFIX):
        raise NotFound(f"unknown model {body.model!r}; models are marginalia:<collection> (see GET /v1/models)",
                       "model", body.model)
    reading_options = body.marginalia.reading
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is not None:
        reading_options = reading_options.model_copy(update={"max_new_tokens": max_tokens})
    target = AskRequest(question=body.question(), collection=body.model[len(PREFIX):], reading=reading_options,
                        collection_options=body.marginalia.collection_options)
    prepared = await run_in_threadpool(service.prepare, target, target.question, body.temperature, who,
                                       "chat/completions")
    reading = start_reading(service, prepared, who)
    reply_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    headers = {READING_HEADER: reading.id}
    try:
        first = await reading.next(request.is_disconnected)
        if isinstance(first, Failed):
            return error_response(first.error)
        if not body.stream:
            item: Any = first
            while item is not None and not isinstance(item, Failed | Done):
                item = await reading.next(request.is_disconnected)
            if isinstance(item, Failed):
                return error_response(item.error)
            if item is None:  # pragma: no cover - every reading ends in Done or an error
                raise RuntimeError("the reading ended without an answer")
            return JSONResponse(_completion(reply_id, created, body.model, item.answer, reading.id),
                                headers=headers)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED)
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    return EventSourceResponse(_chunks(reading, first, reply_id, created, body.model, include_usage), headers=headers)


def _completion(reply_id: str, created: int, model: str, answer: Answer, reading_id: str) -> dict[str, Any]:
    return {"id": reply_id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.text},
                         "finish_reason": "stop", "logprobs": None}],
            "usage": usage(answer.stats), "marginalia": {"reading_id": reading_id, "answer": answer_dict(answer)}}


def _chunk(reply_id: str, created: int, model: str, delta: dict[str, Any], finish: str | None = None,
           **more: Any) -> dict[str, str]:
    data = {"id": reply_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **more}
    return {"data": json.dumps(data, ensure_ascii=False)}


async def _chunks(reading: Reading, item: Any, reply_id: str, created: int, model: str,
                  include_usage: bool) -> AsyncIterator[dict[str, str]]:
    try:
        yield _chunk(reply_id, created, model, {"role": "assistant", "content": ""},
                     marginalia={"reading_id": reading.id})
        while item is not None:
            if isinstance(item, Failed):
                _, code, message = describe(item.error)
                yield {"data": json.dumps(error_body(code, message))}
                return
            if isinstance(item, AnswerDelta) and item.text:
                yield _chunk(reply_id, created, model, {"content": item.text})
            elif isinstance(item, Done):
                more: dict[str, Any] = {"marginalia": {"answer": answer_dict(item.answer)}}
                if include_usage:
                    more["usage"] = usage(item.answer.stats)
                yield _chunk(reply_id, created, model, {}, "stop", **more)
            item = await reading.next()
        yield {"data": "[DONE]"}
    finally:
        if not reading.finished:
            reading.cancel()
