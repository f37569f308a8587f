"""Who the caller is (``/v1/me``), and the keys an admin manages over HTTP: list, create (the token is in
that reply and nowhere else), revoke and rotate."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, status

from ..auth import key_store
from ..common import Caller, ParsedOffLoop, get_service
from ..keys import Grants
from ..schemas import KeyRequest
from ..service import Service

router = APIRouter(prefix="/v1", tags=["keys"], route_class=ParsedOffLoop)
ServiceDep = Annotated[Service, Depends(get_service)]


@router.get("/me", summary="Who the caller is and what it may do: the collections it may read and write, admin")
def me(who: Caller) -> dict[str, Any]:
    return who.to_dict()


@router.get("/keys", summary="The keys, without their tokens, and the users a trusted proxy signs in (admin)")
def list_keys(service: ServiceDep, who: Caller) -> dict[str, Any]:
    store = key_store(service.settings.home)
    return {"keys": [k.to_dict() for k in store.keys()], "users": [u.to_dict() for u in store.users()]}


@router.post("/keys", status_code=status.HTTP_201_CREATED,
             summary="Make a key (admin); its token is in this reply only: the server keeps a hash of it")
def create_key(body: KeyRequest, service: ServiceDep, who: Caller) -> dict[str, Any]:
    record, token = key_store(service.settings.home).create(
        body.name, Grants(frozenset(body.read), frozenset(body.write), body.admin))
    service.audit.record(who.actor, "create_key", key=record.name, **record.grants.to_dict())
    return {**record.to_dict(), "token": token}


@router.delete("/keys/{key_name}", summary="Revoke a key (admin): its next request is refused")
def revoke_key(key_name: str, service: ServiceDep, who: Caller) -> dict[str, Any]:
    record = key_store(service.settings.home).revoke(key_name)
    service.audit.record(who.actor, "revoke_key", key=record.name)
    return {"revoked": record.name}


@router.post("/keys/{key_name}/rotate", summary="Give a key a new token (admin); the old one stops working")
def rotate_key(key_name: str, service: ServiceDep, who: Caller) -> dict[str, Any]:
    record, token = key_store(service.settings.home).rotate(key_name)
    service.audit.record(who.actor, "rotate_key", key=record.name)
    return {**record.to_dict(), "token": token}
