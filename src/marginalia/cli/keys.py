"""keys: the keys and proxy users that may call `marginalia serve`, and what each may read and write."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, TextIO

from .common import Formatter


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add keys and its actions."""
    keys = sub.add_parser(
        "keys", parents=[common], formatter_class=Formatter,
        help="make, list, revoke and rotate the keys clients of marginalia serve send",
        description="Keys for the HTTP service, kept hashed in the home's access.sqlite (shared by every server "
                    "on that home). A key reads the collections given with --read (list, search, view, ask), "
                    "also writes those given with --write (upload, delete documents), or, with --admin, does "
                    "everything, keys included. A server whose home holds a key asks every client for one. "
                    "A token is printed once, when it is made: keep it then.")
    ksub = keys.add_subparsers(dest="keys_command", metavar="ACTION")
    ksub.required = True

    create = ksub.add_parser("create", parents=[common], formatter_class=Formatter, help="make a key")
    create.add_argument("name", metavar="NAME", help="whose key it is (letters, digits, '_', '.', '@', '-')")
    add_grants(create)
    create.add_argument("--json", action="store_true", help="print JSON (the token in 'token')")
    create.set_defaults(handler=cmd_create)

    listing = ksub.add_parser("list", parents=[common], formatter_class=Formatter,
                              help="list keys and proxy users (never their tokens)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=cmd_list)

    revoke = ksub.add_parser("revoke", parents=[common], formatter_class=Formatter,
                             help="delete a key: its next request is refused")
    revoke.add_argument("name", metavar="NAME")
    revoke.set_defaults(handler=cmd_revoke)

    rotate = ksub.add_parser("rotate", parents=[common], formatter_class=Formatter,
                             help="give a key a new token, keeping its grants (the old token stops working)")
    rotate.add_argument("name", metavar="NAME")
    rotate.add_argument("--json", action="store_true", help="print JSON (the token in 'token')")
    rotate.set_defaults(handler=cmd_rotate)

    grant = ksub.add_parser("grant-user", parents=[common], formatter_class=Formatter,
                            help="give a user a trusted proxy signs in (serve --trusted-header) these grants")
    grant.add_argument("name", metavar="USER", help="the user as the proxy names them in its header")
    add_grants(grant)
    grant.set_defaults(handler=cmd_grant_user)

    remove = ksub.add_parser("revoke-user", parents=[common], formatter_class=Formatter,
                             help="take a proxy user's grants away: their next request is refused")
    remove.add_argument("name", metavar="USER")
    remove.set_defaults(handler=cmd_revoke_user)


def add_grants(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("grants")
    group.add_argument("--read", action="append", default=[], metavar="COLLECTION",
                       help="may list, search, view and ask this collection (repeatable)")
    group.add_argument("--write", action="append", default=[], metavar="COLLECTION",
                       help="may also upload to and delete from this collection (repeatable)")
    group.add_argument("--admin", action="store_true", help="may do everything, keys included")


def _grants(args: argparse.Namespace) -> Any:
    from ..errors import UserError
    from ..server.keys import Grants

    if not (args.read or args.write or args.admin):
        raise UserError("give what it may do: --read COLLECTION, --write COLLECTION (each repeatable) or --admin")
    return Grants(frozenset(args.read), frozenset(args.write), args.admin)


def _note_unknown(args: argparse.Namespace, err: TextIO) -> None:
    """Say which granted collections this home does not have (yet): a typo would otherwise grant nothing."""
    from .. import app

    for name in sorted(set(args.read) | set(args.write)):
        if not app.collection_exists(name, home=args.home):
            print(f"note: this home has no collection {name!r} (yet); the grant applies once one is made with "
                  "that name: check the spelling with 'marginalia collections list'", file=err)


def _store(args: argparse.Namespace) -> Any:
    from ..server.keys import KeyStore

    return KeyStore.of_home(args.home)


def _audit(args: argparse.Namespace, action: str, **fields: Any) -> None:
    from ..server.audit import Audit

    Audit(args.home).record("cli", action, **fields)


def _grant_text(grants: dict[str, Any]) -> str:
    if grants["admin"]:
        return "admin"
    writes = set(grants["write"])
    parts = [f"write {c}" if c in writes else f"read {c}" for c in grants["read"]]
    return ", ".join(parts) or "nothing"


def _when(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch)) if epoch else "never"


def _show_token(record: Any, token: str, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    if args.json:
        print(json.dumps({**record.to_dict(), "token": token}), file=out)
        return
    print(token, file=out)
    print(f"key {record.name!r} ({_grant_text(record.grants.to_dict())}): this token is shown once; clients "
          "send it as 'Authorization: Bearer <token>'", file=err)


def cmd_create(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    record, token = _store(args).create(args.name, _grants(args))
    _audit(args, "create_key", key=record.name, **record.grants.to_dict())
    _note_unknown(args, err)
    _show_token(record, token, args, out, err)
    return 0


def cmd_rotate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    record, token = _store(args).rotate(args.name)
    _audit(args, "rotate_key", key=record.name)
    _show_token(record, token, args, out, err)
    return 0


def cmd_revoke(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    record = _store(args).revoke(args.name)
    _audit(args, "revoke_key", key=record.name)
    print(f"revoked key {record.name!r}", file=err)
    return 0


def cmd_list(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    store = _store(args)
    keys, users = store.keys(), store.users()
    if args.json:
        print(json.dumps({"keys": [k.to_dict() for k in keys], "users": [u.to_dict() for u in users]}), file=out)
        return 0
    if not keys and not users:
        print("no keys (a server on this home needs none; make one with marginalia keys create NAME --read C)",
              file=err)
    for k in keys:
        print(f"{k.name}\t{_grant_text(k.grants.to_dict())}\tmade {_when(k.created_at)}\t"
              f"last used {_when(k.last_used)}", file=out)
    for u in users:
        print(f"user:{u.name}\t{_grant_text(u.grants.to_dict())}\tmade {_when(u.created_at)}", file=out)
    return 0


def cmd_grant_user(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    record = _store(args).grant_user(args.name, _grants(args))
    _audit(args, "grant_user", user=record.name, **record.grants.to_dict())
    _note_unknown(args, err)
    print(f"user {record.name!r}: {_grant_text(record.grants.to_dict())}", file=err)
    return 0


def cmd_revoke_user(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    _store(args).revoke_user(args.name)
    _audit(args, "revoke_user", user=args.name)
    print(f"revoked user {args.name!r}", file=err)
    return 0
