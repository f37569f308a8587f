"""Question-generation jobs over a collection: start one, see its state and pairs, follow its progress."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from ..common import STREAMED, Caller, ParsedOffLoop, get_service
from ..schemas import QaJobRequest
from ..service import Service

router = APIRouter(prefix="/v1", tags=["questions"], route_class=ParsedOffLoop)
ServiceDep = Annotated[Service, Depends(get_service)]
#: seconds between looks at a job that a client follows
FOLLOW_POLL = 0.2


@router.post("/collections/{name}/qa-jobs", status_code=status.HTTP_202_ACCEPTED,
             summary="Generate QA pairs about a collection's documents in the background (follow the job)")
async def start_qa_job(name: str, service: ServiceDep, who: Caller, body: QaJobRequest | None = None) -> JSONResponse:
    body = body or QaJobRequest()
    job = await run_in_threadpool(service.generate_pairs, name, body.documents, body.retries)
    return JSONResponse(job, status_code=status.HTTP_202_ACCEPTED, headers={"Location": f"/v1/qa-jobs/{job['id']}"})


@router.get("/qa-jobs", summary="Question-generation jobs, oldest first (without their pairs)")
def list_qa_jobs(service: ServiceDep, who: Caller) -> list[dict[str, Any]]:
    return service.qa_jobs.list(who.can_read)


@router.get("/qa-jobs/{job_id}", summary="A question-generation job's state, progress and the pairs made so far")
def get_qa_job(job_id: str, service: ServiceDep, who: Caller) -> dict[str, Any]:
    return service.qa_jobs.get(job_id, visible=who.can_read)


@router.get("/qa-jobs/{job_id}/events", responses=STREAMED,
            summary="Follow a question-generation job: 'document', 'request' and 'pair' events, then 'done' or "
                    "'failed' with the job's state")
async def follow_qa_job(job_id: str, service: ServiceDep, who: Caller) -> EventSourceResponse:
    service.qa_jobs.get(job_id, detail=False, visible=who.can_read)  # NotFound before the stream starts

    async def events() -> AsyncIterator[dict[str, str]]:
        sent = 0
        while True:
            new, finished = service.qa_jobs.events_since(job_id, sent, who.can_read)
            for record in new:
                data = {k: v for k, v in record.items() if k != "event"}
                yield {"event": record["event"], "data": json.dumps(data, ensure_ascii=False)}
            sent += len(new)
            if finished is not None:
                yield {"event": finished["status"], "data": json.dumps(finished, ensure_ascii=False)}
                return
            await asyncio.sleep(FOLLOW_POLL)

    return EventSourceResponse(events())
