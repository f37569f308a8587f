"""Collections, their documents (upload, delete) and the indexing jobs an upload starts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, File, Query, UploadFile, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from ...options import ChunkingOptions
from ..common import STREAMED, Caller, ParsedOffLoop, get_service
from ..errors import TooLarge
from ..schemas import CollectionRequest
from ..service import Service

router = APIRouter(prefix="/v1", tags=["collections"], route_class=ParsedOffLoop)
ServiceDep = Annotated[Service, Depends(get_service)]
#: seconds between looks at a job that a client follows
FOLLOW_POLL = 0.2


@router.get("/collections", summary="List collections")
def list_collections(service: ServiceDep, who: Caller) -> list[dict[str, Any]]:
    return service.collections(who)


@router.post("/collections", status_code=status.HTTP_201_CREATED, summary="Create an empty collection")
def create_collection(body: CollectionRequest, service: ServiceDep, who: Caller) -> dict[str, Any]:
    return service.create_collection(body.name, body.embedder, who)


@router.get("/collections/{name}", summary="A collection's documents, each with its section tree")
def show_collection(name: str, service: ServiceDep, who: Caller,
                    tree: Annotated[bool, Query(description="include each document's section tree")] = True,
                    ) -> dict[str, Any]:
    return service.describe_collection(name, tree=tree, who=who)


@router.delete("/collections/{name}", summary="Delete a collection and everything in it")
def delete_collection(name: str, service: ServiceDep, who: Caller) -> dict[str, Any]:
    service.delete_collection(name, who)
    return {"deleted": name}


@router.post("/collections/{name}/documents", status_code=status.HTTP_202_ACCEPTED,
             summary="Upload a document; it is indexed in the background (follow the job)")
async def upload_document(name: str, file: Annotated[UploadFile, File(description="pdf, markdown, text or html")],
                          service: ServiceDep, who: Caller,
                          chunking: Annotated[ChunkingOptions, Query()]) -> JSONResponse:
    limit = service.settings.max_upload_bytes
    data = await file.read(limit + 1)
    await file.close()
    if len(data) > limit:
        raise TooLarge(f"the file is larger than this server accepts ({limit} bytes)")
    job = await run_in_threadpool(service.upload, name, file.filename, data, chunking, who)
    return JSONResponse(job, status_code=status.HTTP_202_ACCEPTED, headers={"Location": f"/v1/jobs/{job['id']}"})


@router.get("/collections/{name}/documents/{document:path}",
            summary="One document of a collection: its text (which references' spans index), pages and sections")
def show_document(name: str, document: str, service: ServiceDep, who: Caller) -> dict[str, Any]:
    return service.show_document(name, document, who)


@router.delete("/collections/{name}/documents/{document:path}", summary="Delete one document of a collection")
def delete_document(name: str, document: str, service: ServiceDep, who: Caller) -> dict[str, Any]:
    return service.delete_document(name, document, who)


@router.get("/jobs", summary="Indexing jobs, oldest first", tags=["jobs"])
def list_jobs(service: ServiceDep, who: Caller) -> list[dict[str, Any]]:
    return service.job_list(who)


@router.get("/jobs/{job_id}", summary="An indexing job's state and progress", tags=["jobs"])
def get_job(job_id: str, service: ServiceDep, who: Caller) -> dict[str, Any]:
    job = service.job(job_id, who)
    job.pop("version")
    return job


@router.get("/jobs/{job_id}/events", summary="Follow an indexing job: a 'progress' event per change, then "
                                              "'done' or 'failed'", tags=["jobs"], responses=STREAMED)
async def follow_job(job_id: str, service: ServiceDep, who: Caller) -> EventSourceResponse:
    first = service.job(job_id, who)  # NotFound before the stream starts

    async def events() -> AsyncIterator[dict[str, str]]:
        job, seen = first, -1
        while True:
            if job["version"] != seen:
                seen = job.pop("version")
                finished = job["status"] in ("done", "failed")
                yield {"event": job["status"] if finished else "progress", "data": json.dumps(job)}
                if finished:
                    return
            await asyncio.sleep(FOLLOW_POLL)
            job = service.jobs.get(job_id)

    return EventSourceResponse(events())
