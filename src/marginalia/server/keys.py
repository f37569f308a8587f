"""The key store: API keys and proxy users with their grants, in a small SQLite database in the home.

A key is a random token of 256 bits shown once, when it is made; the store keeps only its SHA-256 (a
token that random needs no slow hash), its name, what it may read and write, whether it is an admin, when
it was made and when it was last used. Several server processes may share one home: the database runs in
WAL mode and waits for a writer instead of failing. Nothing here needs the HTTP service's packages, so the
``marginalia keys`` command uses it without them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import NotFound, UserError
from ..home import resolve_home

#: the database's file in the home
DATABASE = "access.sqlite"
#: the schema version this module writes (``PRAGMA user_version``)
SCHEMA_VERSION = 1
#: what every token starts with, so that a leaked one is recognisable (secret scanners, logs)
PREFIX = "mgl_"
#: bytes of randomness in a token (256 bits)
TOKEN_BYTES = 32
#: milliseconds a connection waits for another process's write before failing
BUSY_TIMEOUT_MS = 10_000
#: seconds between two writes of a key's last use (a write per request would serialise the processes)
LAST_USED_EVERY = 60.0
#: what a key's or user's name may be
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}$")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    hash TEXT NOT NULL UNIQUE,
    read TEXT NOT NULL,
    write TEXT NOT NULL,
    admin INTEGER NOT NULL,
    created_at REAL NOT NULL,
    last_used REAL
);
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY,
    read TEXT NOT NULL,
    write TEXT NOT NULL,
    admin INTEGER NOT NULL,
    created_at REAL NOT NULL
);
"""


@dataclass(frozen=True)
class Grants:
    """What a key or user may do: read (list, search, view, ask) some collections, also write (upload and
    delete documents) some, or, as an admin, everything, keys included."""

    read: frozenset[str] = frozenset()
    write: frozenset[str] = frozenset()
    admin: bool = False

    def can_read(self, collection: str) -> bool:
        return self.admin or collection in self.read or collection in self.write

    def can_write(self, collection: str) -> bool:
        return self.admin or collection in self.write

    def to_dict(self) -> dict[str, Any]:
        return {"read": sorted(self.read | self.write), "write": sorted(self.write), "admin": self.admin}


@dataclass(frozen=True)
class KeyRecord:
    """A stored key, without its token: ``id`` never changes (a rotated key keeps it, a new key of the same
    name gets another), so what a key owns is owned by its id."""

    id: int
    name: str
    grants: Grants
    created_at: float
    last_used: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.grants.to_dict(), "created_at": self.created_at,
                "last_used": self.last_used}


@dataclass(frozen=True)
class UserRecord:
    """A user a trusted proxy signs in, and their grants."""

    name: str
    grants: Grants
    created_at: float

    def to_dict(self) -> dict[str, Any]:
        return {"user": self.name, **self.grants.to_dict(), "created_at": self.created_at}


def new_token() -> str:
    """A fresh key: `PREFIX` and 256 random bits, URL-safe."""
    return PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def check_name(name: str, what: str = "key") -> str:
    """Raises:
        UserError: a name that is empty, too long, or holds characters other than letters, digits, ``_.@-``.
    """
    if not NAME.match(name):
        raise UserError(f"{what} name {name!r} is not allowed: use 1 to 100 letters, digits, '_', '.', '@' or "
                        "'-', starting with a letter or digit")
    return name


def check_collections(names: Iterable[str]) -> frozenset[str]:
    out = frozenset(names)
    for name in out:
        if not name or len(name) > 200 or any(c in name for c in "/\\\0"):
            raise UserError(f"{name!r} is not a collection name; give the name as `marginalia collections` "
                            "lists it")
    return out


class KeyStore:
    """The keys and users of one home. Every call opens its own connection, so a store is safe to share
    between threads, and the database between processes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @classmethod
    def of_home(cls, home: str | Path | None = None) -> KeyStore:
        return cls(resolve_home(home) / DATABASE)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        fresh = not self.path.exists()
        with closing(sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)) as db:
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if fresh or version == 0:
                db.execute("PRAGMA journal_mode = WAL")
                db.executescript(_SCHEMA)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            elif version > SCHEMA_VERSION:
                raise UserError(f"{self.path} was written by a newer marginalia (schema {version}); upgrade "
                                "marginalia to use it")
            yield db

    def exists(self) -> bool:
        """Whether the database has been made (a home that never had a key has none)."""
        return self.path.exists()

    # -- keys ---------------------------------------------------------------------------------------------

    def create(self, name: str, grants: Grants) -> tuple[KeyRecord, str]:
        """A new key and its token (the only time the token is seen).

        Raises:
            UserError: a bad name, or a key of that name exists (revoke it first, or rotate it).
        """
        check_name(name)
        check_collections(grants.read | grants.write)
        token, now = new_token(), time.time()
        with self._db() as db:
            try:
                cursor = db.execute("INSERT INTO keys (name, hash, read, write, admin, created_at) "
                                    "VALUES (?, ?, ?, ?, ?, ?)",
                                    (name, token_hash(token), _names(grants.read), _names(grants.write),
                                     int(grants.admin), now))
            except sqlite3.IntegrityError:
                raise UserError(f"a key named {name!r} exists already; choose another name, rotate it "
                                f"(marginalia keys rotate {name}) or revoke it first") from None
        return KeyRecord(int(cursor.lastrowid or 0), name, grants, now, None), token

    def rotate(self, name: str) -> tuple[KeyRecord, str]:
        """A new token for a key, its grants and what it owns kept; the old token stops working at once.

        Raises:
            NotFound: no key of that name.
        """
        token = new_token()
        with self._db() as db:
            if db.execute("UPDATE keys SET hash = ? WHERE name = ?", (token_hash(token), name)).rowcount == 0:
                raise NotFound(f"no key named {name!r}; see marginalia keys list", "key", name)
        record = self.get(name)
        return record, token

    def revoke(self, name: str) -> KeyRecord:
        """Delete a key: its next request is refused.

        Raises:
            NotFound: no key of that name.
        """
        record = self.get(name)
        with self._db() as db:
            db.execute("DELETE FROM keys WHERE id = ?", (record.id,))
        return record

    def get(self, name: str) -> KeyRecord:
        with self._db() as db:
            row = db.execute("SELECT id, name, read, write, admin, created_at, last_used FROM keys WHERE name = ?",
                             (name,)).fetchone()
        if row is None:
            raise NotFound(f"no key named {name!r}; see marginalia keys list", "key", name)
        return _key(row)

    def keys(self) -> list[KeyRecord]:
        if not self.exists():
            return []
        with self._db() as db:
            rows = db.execute("SELECT id, name, read, write, admin, created_at, last_used FROM keys "
                              "ORDER BY name").fetchall()
        return [_key(r) for r in rows]

    def has_keys(self) -> bool:
        """Whether any key or user is stored (then the server asks every caller who they are)."""
        if not self.exists():
            return False
        with self._db() as db:
            return db.execute("SELECT EXISTS (SELECT 1 FROM keys) OR EXISTS (SELECT 1 FROM users)").fetchone()[0] == 1

    def find(self, token: str) -> KeyRecord | None:
        """The key whose token this is (its last use noted), or None.

        The lookup is by the token's hash; the stored hash is compared again in constant time, so that
        nothing about a stored hash depends on how far a guess matches it.
        """
        if not token or not self.exists():
            return None
        digest = token_hash(token)
        with self._db() as db:
            row = db.execute("SELECT id, name, read, write, admin, created_at, last_used, hash FROM keys "
                             "WHERE hash = ?", (digest,)).fetchone()
            if row is None or not hmac.compare_digest(row[7], digest):
                return None
            now = time.time()
            if row[6] is None or now - row[6] >= LAST_USED_EVERY:
                db.execute("UPDATE keys SET last_used = ? WHERE id = ?", (now, row[0]))
        return _key(row[:7])

    # -- users ----------------------------------------------------------------------------------------------

    def grant_user(self, name: str, grants: Grants) -> UserRecord:
        """Give a user a trusted proxy signs in these grants (replacing any they had)."""
        check_name(name, "user")
        check_collections(grants.read | grants.write)
        now = time.time()
        with self._db() as db:
            db.execute("INSERT INTO users (name, read, write, admin, created_at) VALUES (?, ?, ?, ?, ?) "
                       "ON CONFLICT (name) DO UPDATE SET read = excluded.read, write = excluded.write, "
                       "admin = excluded.admin",
                       (name, _names(grants.read), _names(grants.write), int(grants.admin), now))
        found = self.user(name)
        if found is None:  # pragma: no cover - written just above
            raise RuntimeError(f"user {name!r} was not stored")
        return found

    def revoke_user(self, name: str) -> None:
        """Raises:
            NotFound: no such user.
        """
        with self._db() as db:
            if db.execute("DELETE FROM users WHERE name = ?", (name,)).rowcount == 0:
                raise NotFound(f"no user named {name!r}; see marginalia keys list", "user", name)

    def user(self, name: str) -> UserRecord | None:
        if not self.exists():
            return None
        with self._db() as db:
            row = db.execute("SELECT name, read, write, admin, created_at FROM users WHERE name = ?",
                             (name,)).fetchone()
        return None if row is None else UserRecord(row[0], _grants(row[1], row[2], row[3]), row[4])

    def users(self) -> list[UserRecord]:
        if not self.exists():
            return []
        with self._db() as db:
            rows = db.execute("SELECT name, read, write, admin, created_at FROM users ORDER BY name").fetchall()
        return [UserRecord(r[0], _grants(r[1], r[2], r[3]), r[4]) for r in rows]


def _names(names: frozenset[str]) -> str:
    return json.dumps(sorted(names))


def _grants(read: str, write: str, admin: int) -> Grants:
    return Grants(frozenset(json.loads(read)), frozenset(json.loads(write)), bool(admin))


def _key(row: Any) -> KeyRecord:
    return KeyRecord(row[0], row[1], _grants(row[2], row[3], row[4]), row[5], row[6])
