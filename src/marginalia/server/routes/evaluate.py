"""Reviewing a collection's generated QA pairs, and evaluation jobs that run readings on the accepted ones."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from ..common import Caller, ParsedOffLoop, get_service
from ..schemas import EvalJobRequest, PairReview
from ..service import Service

router = APIRouter(prefix="/v1", tags=["evaluation"], route_class=ParsedOffLoop)
ServiceDep = Annotated[Service, Depends(get_service)]


@router.get("/collections/{name}/qa-pairs",
            summary="A collection's generated QA pairs with their review status, counts by status, and the "
                    "question job writing more (if any)")
def list_pairs(name: str, service: ServiceDep, who: Caller) -> dict[str, Any]:
    return service.list_pairs(name, who)


@router.patch("/collections/{name}/qa-pairs/{pair_id}",
              summary="Accept, reject or reset a QA pair, with an edited question or answer; returns the pair")
def review_pair(name: str, pair_id: str, body: PairReview, service: ServiceDep, who: Caller) -> dict[str, Any]:
    return service.review_pair(name, pair_id, body.status, body.question, body.answer, who)


@router.post("/collections/{name}/eval-jobs", status_code=status.HTTP_202_ACCEPTED,
             summary="Run readings on a collection's accepted QA pairs in the background and score them (poll "
                     "the job)")
async def start_eval_job(name: str, body: EvalJobRequest, service: ServiceDep, who: Caller) -> JSONResponse:
    job = await run_in_threadpool(service.evaluate, name, body.patterns, who)
    return JSONResponse(job, status_code=status.HTTP_202_ACCEPTED, headers={"Location": f"/v1/eval-jobs/{job['id']}"})


@router.get("/eval-jobs", summary="Evaluation jobs, oldest first (without their answers)")
def list_eval_jobs(service: ServiceDep, who: Caller) -> list[dict[str, Any]]:
    return service.eval_jobs.list(who.can_read)


@router.get("/eval-jobs/{job_id}",
            summary="An evaluation job's progress and, per reading, its scores (mean and 95% interval), seconds "
                    "per answer and answers")
def get_eval_job(job_id: str, service: ServiceDep, who: Caller) -> dict[str, Any]:
    return service.eval_jobs.get(job_id, visible=who.can_read)
